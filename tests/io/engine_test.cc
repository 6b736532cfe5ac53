// io::Engine round trips on every engine: random sizes and offsets, byte-exact verification,
// splitting, striping, several submitting threads, callbacks, refusals, fallback.
#include "io/engine.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <condition_variable>
#include <mutex>

#include <gtest/gtest.h>

#include "tests/io/io_test_env.h"

namespace zinf::io {
namespace {

using testing_env::AllKinds;
using testing_env::KindName;
using testing_env::MakeEngine;
using zinf::testing::FillRandom;
using zinf::testing::TempDir;

constexpr uint64_t kFileBytes = 32 << 20;

class EngineTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    std::string why;
    engine_ = MakeEngine(GetParam(), 256 << 10, 8, &why);
    if (!engine_) GTEST_SKIP() << "engine refused here: " << why;
    auto swap = SwapFile::Create({.dirs = {dir_.path()}, .size = kFileBytes});
    ASSERT_TRUE(swap.ok()) << swap.status().ToString();
    swap_ = std::move(swap).value();
    auto id = engine_->AddFile(swap_->Layout());
    ASSERT_TRUE(id.ok());
    file_ = *id;
    align_ = swap_->offset_align();
    auto buf = AlignedBuffer::Allocate(kFileBytes, swap_->mem_align());
    ASSERT_TRUE(buf.ok());
    io_ = std::move(buf).value();
    ASSERT_TRUE(engine_->RegisterBuffer(io_.data(), io_.size()).ok());
    shadow_.resize(kFileBytes);
    FillRandom(shadow_.data(), shadow_.size(), 42);
  }

  // Cuts [0, kFileBytes) into random aligned segments.
  std::vector<std::pair<uint64_t, uint64_t>> RandomPartition(std::mt19937_64& rng) {
    std::vector<std::pair<uint64_t, uint64_t>> segs;
    uint64_t off = 0;
    while (off < kFileBytes) {
      uint64_t units = 1 + rng() % (std::min<uint64_t>(3 << 20, kFileBytes - off) / align_);
      segs.push_back({off, units * align_});
      off += units * align_;
    }
    std::shuffle(segs.begin(), segs.end(), rng);
    return segs;
  }

  void WriteAll(std::mt19937_64& rng) {
    std::memcpy(io_.data(), shadow_.data(), kFileBytes);
    std::vector<Ticket> tickets;
    for (auto [off, len] : RandomPartition(rng)) {
      auto t = engine_->Submit({OpKind::kWrite, file_, off, io_.data() + off, len});
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      tickets.push_back(*t);
    }
    for (Ticket t : tickets) ASSERT_TRUE(engine_->Wait(t).ok());
  }

  // The file holds shadow_, written with one request.
  void WriteAllOnce() {
    std::memcpy(io_.data(), shadow_.data(), kFileBytes);
    ASSERT_TRUE(engine_->Write(file_, 0, io_.data(), kFileBytes).ok());
    std::memset(io_.data(), 0, kFileBytes);
  }

  TempDir dir_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<SwapFile> swap_;
  FileId file_ = 0;
  uint32_t align_ = 1;
  AlignedBuffer io_;
  std::vector<uint8_t> shadow_;
};

TEST_P(EngineTest, RandomRoundTripIsByteExact) {
  std::mt19937_64 rng(7);
  WriteAll(rng);
  std::memset(io_.data(), 0, kFileBytes);
  // Random reads, possibly overlapping, into disjoint places of the buffer.
  for (int round = 0; round < 3; ++round) {
    std::vector<std::pair<Ticket, std::pair<uint64_t, uint64_t>>> reads;
    uint64_t dst = 0;
    while (true) {
      uint64_t len = (1 + rng() % (2 << 20) / align_) * align_;
      if (dst + len > kFileBytes) break;
      uint64_t off = (rng() % ((kFileBytes - len) / align_ + 1)) * align_;
      auto t = engine_->Submit({OpKind::kRead, file_, off, io_.data() + dst, len});
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      reads.push_back({*t, {off, dst}});
      dst += len;
    }
    for (auto& [t, od] : reads) ASSERT_TRUE(engine_->Wait(t).ok());
    uint64_t pos = 0;
    // Verify every read against the shadow copy.
    for (size_t i = 0; i < reads.size(); ++i) {
      uint64_t start = reads[i].second.second;
      uint64_t end = i + 1 < reads.size() ? reads[i + 1].second.second : dst;
      ASSERT_EQ(0, std::memcmp(io_.data() + start, shadow_.data() + reads[i].second.first,
                               end - start))
          << "read " << i << " at offset " << reads[i].second.first;
      pos = end;
    }
    EXPECT_EQ(pos, dst);
  }
  EngineStats st = engine_->stats();
  EXPECT_EQ(st.failed_requests, 0u);
  EXPECT_GE(st.bytes_written, kFileBytes);
}

TEST_P(EngineTest, LargeRequestIsSplitIntoBlocks) {
  std::memcpy(io_.data(), shadow_.data(), 4 << 20);
  EngineStats before = engine_->stats();
  ASSERT_TRUE(engine_->Write(file_, 0, io_.data(), 4 << 20).ok());
  EngineStats after = engine_->stats();
  // 4 MiB in 256 KiB blocks: 16 pieces (more only if the kernel returned short transfers).
  EXPECT_GE(after.pieces - before.pieces, 16u);
  EXPECT_EQ(after.pieces - before.pieces, 16u + (after.short_transfers - before.short_transfers) +
                                              (after.retries - before.retries));
  std::memset(io_.data(), 0, 4 << 20);
  ASSERT_TRUE(engine_->Read(file_, 0, io_.data(), 4 << 20).ok());
  EXPECT_EQ(0, std::memcmp(io_.data(), shadow_.data(), 4 << 20));
}

TEST_P(EngineTest, SeveralThreadsSubmitAtOnce) {
  constexpr int kThreads = 4;
  const uint64_t region = kFileBytes / kThreads;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      uint8_t* mine = io_.data() + t * region;
      const uint8_t* want = shadow_.data() + t * region;
      std::memcpy(mine, want, region);
      for (int iter = 0; iter < 20; ++iter) {
        uint64_t len = (1 + rng() % (region / 4 / align_)) * align_;
        uint64_t off = (rng() % ((region - len) / align_ + 1)) * align_;
        uint64_t abs = t * region + off;
        Status s = engine_->Write(file_, abs, mine + off, len);
        if (!s.ok()) { errors[t] = s.ToString(); return; }
        std::vector<uint8_t> back(len);
        // Read into a scratch part of our own region through the engine, then compare.
        std::memset(mine + off, 0xEE, len);
        std::atomic<bool> done{false};
        Status cb_status;
        s = engine_->Submit({OpKind::kRead, file_, abs, mine + off, len},
                            [&](const Status& st) { cb_status = st; done = true; });
        if (!s.ok()) { errors[t] = s.ToString(); return; }
        while (!done) {
          auto r = engine_->Poll(true);
          if (!r.ok()) { errors[t] = r.status().ToString(); return; }
        }
        if (!cb_status.ok()) { errors[t] = cb_status.ToString(); return; }
        if (std::memcmp(mine + off, want + off, len) != 0) {
          errors[t] = "mismatch at " + std::to_string(abs);
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  EXPECT_EQ(engine_->requests_in_flight(), 0u);
}

TEST_P(EngineTest, CallbacksMaySubmitMore) {
  std::memcpy(io_.data(), shadow_.data(), kFileBytes);
  // A chain: each completed 1 MiB write submits the next, like a benchmark keeping QD full.
  uint64_t next = 0;
  int completed = 0;
  Status first_error;
  std::function<void(const Status&)> on_done;
  auto submit_next = [&] {
    uint64_t off = next;
    next += 1 << 20;
    Status s = engine_->Submit({OpKind::kWrite, file_, off, io_.data() + off, 1 << 20}, on_done);
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  on_done = [&](const Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
    completed++;
    if (next < kFileBytes) submit_next();
  };
  for (int i = 0; i < 4; ++i) submit_next();
  ASSERT_TRUE(engine_->Drain().ok());
  EXPECT_TRUE(first_error.ok()) << first_error.ToString();
  EXPECT_EQ(completed, static_cast<int>(kFileBytes >> 20));
  std::memset(io_.data(), 0, kFileBytes);
  ASSERT_TRUE(engine_->Read(file_, 0, io_.data(), kFileBytes).ok());
  EXPECT_EQ(0, std::memcmp(io_.data(), shadow_.data(), kFileBytes));
}

// A callback that expects its request to succeed and appends `what` to *done (completion order).
Callback RecordDone(std::vector<std::string>* done, const char* what) {
  return [done, what](const Status& s) {
    EXPECT_TRUE(s.ok()) << what << ": " << s.ToString();
    done->push_back(what);
  };
}

// A demand read queued behind a long read-ahead completes first: pending requests are cut into
// pieces by priority, so the demand piece takes the first slot that frees (the read-ahead's 8
// pieces already in the kernel are not preempted); a prefetch beats the read-ahead too.
TEST_P(EngineTest, ADemandReadOvertakesALongReadAhead) {
  WriteAllOnce();
  std::vector<std::string> done;
  auto record = [&](const char* what) { return RecordDone(&done, what); };
  const uint64_t block = 256 << 10;
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 0, io_.data(), 16 << 20,
                               Priority::kBackground},
                              record("read-ahead")).ok());
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 20 << 20, io_.data() + (20 << 20), block,
                               Priority::kPrefetch},
                              record("prefetch")).ok());
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 24 << 20, io_.data() + (24 << 20), block},
                              record("demand")).ok());
  ASSERT_TRUE(engine_->Drain().ok());
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done.back(), "read-ahead") << done[0] << ", " << done[1] << ", " << done[2];
  EXPECT_EQ(0, std::memcmp(io_.data(), shadow_.data(), 16 << 20));
  EXPECT_EQ(0, std::memcmp(io_.data() + (24 << 20), shadow_.data() + (24 << 20), block));
}

// A prefetch queued behind a long prefetch, then promoted (a caller waits for it now), takes
// the next free slot: it completes first. A finished request is not promoted.
TEST_P(EngineTest, APromotedPrefetchOvertakesTheOneQueuedBeforeIt) {
  WriteAllOnce();
  std::vector<std::string> done;
  auto record = [&](const char* what) { return RecordDone(&done, what); };
  const uint64_t block = 256 << 10;
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 0, io_.data(), 16 << 20, Priority::kPrefetch},
                              record("long")).ok());
  Ticket waited = 0;
  ASSERT_TRUE(engine_->Submit({OpKind::kRead, file_, 20 << 20, io_.data() + (20 << 20), block,
                               Priority::kPrefetch},
                              record("waited for"), &waited).ok());
  ASSERT_NE(waited, 0u);
  EXPECT_FALSE(engine_->Promote(waited, Priority::kPrefetch)) << "not more urgent";
  EXPECT_TRUE(engine_->Promote(waited, Priority::kDemand));
  EXPECT_FALSE(engine_->Promote(waited, Priority::kDemand)) << "already a demand";
  ASSERT_TRUE(engine_->Drain().ok());
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done.front(), "waited for") << done[0] << ", " << done[1];
  EXPECT_FALSE(engine_->Promote(waited, Priority::kDemand)) << "finished";
  EXPECT_EQ(engine_->stats().promotions, 1u);
  EXPECT_EQ(0, std::memcmp(io_.data(), shadow_.data(), 16 << 20));
  EXPECT_EQ(0, std::memcmp(io_.data() + (20 << 20), shadow_.data() + (20 << 20), block));
}

TEST_P(EngineTest, ReaperCompletesRequestsWithoutPolling) {
  engine_->StartReaper();
  std::memcpy(io_.data(), shadow_.data(), 8 << 20);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  Status first;
  for (int i = 0; i < 8; ++i) {
    uint64_t off = static_cast<uint64_t>(i) << 20;
    ASSERT_TRUE(engine_->Submit({OpKind::kWrite, file_, off, io_.data() + off, 1 << 20},
                                [&](const Status& s) {
                                  std::lock_guard lock(mu);
                                  if (!s.ok() && first.ok()) first = s;
                                  done++;
                                  cv.notify_all();
                                }).ok());
  }
  std::unique_lock lock(mu);
  // Nobody polls: only the reaper can finish these.
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == 8; }));
  EXPECT_TRUE(first.ok()) << first.ToString();
  lock.unlock();
  // Tickets work alongside the reaper too.
  std::memset(io_.data(), 0, 8 << 20);
  ASSERT_TRUE(engine_->Read(file_, 0, io_.data(), 8 << 20).ok());
  EXPECT_EQ(0, std::memcmp(io_.data(), shadow_.data(), 8 << 20));
}

TEST_P(EngineTest, MisalignedRequestsAreRefusedNamingTheAlignment) {
  if (!swap_->direct() || align_ == 1) GTEST_SKIP() << "file system does not use O_DIRECT";
  auto expect_refused = [&](uint64_t off, uint8_t* buf, size_t len) {
    auto t = engine_->Submit({OpKind::kRead, file_, off, buf, len});
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(std::to_string(align_)), std::string::npos)
        << t.status().message();
    EXPECT_NE(t.status().message().find(swap_->members()[0]->path()), std::string::npos);
  };
  expect_refused(align_ / 2, io_.data(), align_);        // offset
  expect_refused(0, io_.data(), align_ + 1);             // length
  if (swap_->mem_align() > 1) expect_refused(0, io_.data() + 1, align_);  // buffer
}

TEST_P(EngineTest, RequestsBeyondTheFileAreRefused) {
  auto t = engine_->Submit({OpKind::kRead, file_, kFileBytes, io_.data(), align_});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kOutOfRange);
  auto u = engine_->Submit({OpKind::kRead, file_ + 7, 0, io_.data(), align_});
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllEngines, EngineTest, ::testing::ValuesIn(AllKinds()), KindName);

TEST(EngineStripeTest, StripesRoundRobinOverDirectories) {
  TempDir a, b, c;
  constexpr uint64_t kStripe = 64 << 10, kSize = 4 << 20;
  auto swap = SwapFile::Create(
      {.dirs = {a.path(), b.path(), c.path()}, .size = kSize, .stripe_bytes = kStripe});
  ASSERT_TRUE(swap.ok()) << swap.status().ToString();
  auto e = Engine::Create({.block_size = 1 << 20, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  auto id = (*e)->AddFile((*swap)->Layout());
  ASSERT_TRUE(id.ok());
  auto buf = AlignedBuffer::Allocate(kSize, (*swap)->mem_align());
  ASSERT_TRUE(buf.ok());
  FillRandom(buf->data(), kSize, 3);
  ASSERT_TRUE((*e)->Write(*id, 0, buf->data(), kSize).ok());
  // Stripe unit k must sit in member k % 3 at offset (k / 3) * stripe: read members directly.
  std::vector<uint8_t> unit(kStripe);
  for (uint64_t k = 0; k < kSize / kStripe; ++k) {
    int fd = (*swap)->members()[k % 3]->fd();
    auto chk = AlignedBuffer::Allocate(kStripe, 4096);
    ASSERT_TRUE(chk.ok());
    ASSERT_EQ(pread(fd, chk->data(), kStripe, static_cast<off_t>((k / 3) * kStripe)),
              static_cast<ssize_t>(kStripe));
    ASSERT_EQ(0, std::memcmp(chk->data(), buf->data() + k * kStripe, kStripe)) << "unit " << k;
  }
  // And an unaligned-to-stripe logical range reads back through the engine.
  auto back = AlignedBuffer::Allocate(kSize, (*swap)->mem_align());
  ASSERT_TRUE(back.ok());
  uint64_t off = kStripe / 2 / (*swap)->offset_align() * (*swap)->offset_align();
  ASSERT_TRUE((*e)->Read(*id, off, back->data(), kSize / 2).ok());
  EXPECT_EQ(0, std::memcmp(back->data(), buf->data() + off, kSize / 2));
}

void ExpectFallbackRoundTrip(const EngineOptions& o) {
  auto e = Engine::Create(o);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_NE((*e)->name(), "uring");
  EXPECT_NE((*e)->fallback_reason().find("disabled"), std::string::npos)
      << (*e)->fallback_reason();
  TempDir dir;
  auto swap = SwapFile::Create({.dirs = {dir.path()}, .size = 2 << 20});
  ASSERT_TRUE(swap.ok());
  auto id = (*e)->AddFile((*swap)->Layout());
  ASSERT_TRUE(id.ok());
  auto buf = AlignedBuffer::Allocate(2 << 20, (*swap)->mem_align());
  ASSERT_TRUE(buf.ok());
  FillRandom(buf->data(), 2 << 20, 9);
  std::vector<uint8_t> want(buf->data(), buf->data() + (2 << 20));
  ASSERT_TRUE((*e)->Write(*id, 0, buf->data(), 2 << 20).ok());
  std::memset(buf->data(), 0, 2 << 20);
  ASSERT_TRUE((*e)->Read(*id, 0, buf->data(), 2 << 20).ok());
  EXPECT_EQ(0, std::memcmp(buf->data(), want.data(), want.size()));
}

TEST(EngineFallbackTest, ConfigDisablingUringFallsBack) {
  EngineOptions o;
  o.allow_uring = false;
  ExpectFallbackRoundTrip(o);
}

TEST(EngineFallbackTest, EnvironmentDisablingUringFallsBack) {
  setenv("ZINF_IO_DISABLE_URING", "1", 1);
  ExpectFallbackRoundTrip(EngineOptions{});
  unsetenv("ZINF_IO_DISABLE_URING");
}

TEST(EngineOptionsTest, ParseAndRefuse) {
  EXPECT_EQ(*ParseEngineKind("uring"), EngineKind::kUring);
  EXPECT_EQ(*ParseEngineKind("aio"), EngineKind::kAio);
  EXPECT_FALSE(ParseEngineKind("spdk").ok());
  EXPECT_FALSE(Engine::Create({.queue_depth = 0}).ok());
  EXPECT_FALSE(Engine::Create({.block_size = 0}).ok());
}

}  // namespace
}  // namespace zinf::io

namespace zinf::io {
namespace {

// Regression: a pinned pool above 1 GiB (the kernel's limit per fixed buffer) failed to register
// at all (EFAULT) and every transfer went unregistered. It is now registered in 1 GiB pieces.
TEST(EngineRegistrationTest, ARangeAboveOneGibIsRegisteredInPieces) {
  std::string why;
  auto engine = testing_env::MakeEngine(EngineKind::kUring, 1 << 20, 8, &why);
  if (!engine) GTEST_SKIP() << "io_uring refused here: " << why;
  const size_t bytes = (size_t{1} << 30) + (8 << 20);
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  // Root (CAP_IPC_LOCK) is not bound by RLIMIT_MEMLOCK.
  if (geteuid() != 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < bytes) {
    GTEST_SKIP() << "RLIMIT_MEMLOCK below " << bytes << " bytes";
  }
  auto buf = AlignedBuffer::Allocate(bytes, 4096);
  ASSERT_TRUE(buf.ok());
  ASSERT_TRUE(engine->RegisterBuffer(buf->data(), buf->size()).ok());
  EXPECT_TRUE(engine->buffers_registered());
  // A transfer from the piece above the first GiB round-trips.
  zinf::testing::TempDir dir;
  auto swap = SwapFile::Create({.dirs = {dir.path()}, .size = 8 << 20});
  ASSERT_TRUE(swap.ok()) << swap.status().ToString();
  auto id = engine->AddFile((*swap)->Layout());
  ASSERT_TRUE(id.ok());
  uint8_t* hi = buf->data() + (size_t{1} << 30);
  zinf::testing::FillRandom(hi, 4 << 20, 7);
  ASSERT_TRUE(engine->Write(*id, 0, hi, 4 << 20).ok());
  ASSERT_TRUE(engine->Read(*id, 0, hi + (4 << 20), 4 << 20).ok());
  EXPECT_EQ(std::memcmp(hi, hi + (4 << 20), 4 << 20), 0);
}

}  // namespace
}  // namespace zinf::io
