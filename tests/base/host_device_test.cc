// HostDevice and the checks shared by every Device: budget, ranges, pinning, stream order,
// events, emulated link and compute rates, sticky errors. Timing checks are lower bounds only.
#include "src/base/host_device.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "src/base/cuda_probe.h"
#include "src/base/device.h"
#include "src/base/range_ledger.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20;

std::unique_ptr<Device> MakeHost(uint64_t budget, double copy_gbps = 0, double compute_flops = 0,
                                 bool require_pinned = true) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.budget_bytes = budget;
  o.copy_gbps = copy_gbps;
  o.compute_flops = compute_flops;
  o.require_pinned_host = require_pinned;
  auto d = MakeHostDevice(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Pinned host buffer freed with its device.
void* Pinned(Device& d, uint64_t bytes, uint64_t seed = 0) {
  auto p = d.AllocatePinned(bytes);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return nullptr;
  if (seed != 0) testing::FillRandom(*p, bytes, seed);
  return *p;
}

TEST(RangeLedgerTest, CoversOverlapsAndRefusesOverlappingCommits) {
  RangeLedger ledger("test memory", 1000);
  alignas(16) static char buf[256];
  ASSERT_TRUE(ledger.Reserve(100).ok());
  ASSERT_TRUE(ledger.Commit(buf + 16, 100, 100).ok());
  EXPECT_TRUE(ledger.Covers(buf + 16, 100));
  EXPECT_TRUE(ledger.Covers(buf + 115, 1));
  EXPECT_FALSE(ledger.Covers(buf + 115, 2));
  EXPECT_FALSE(ledger.Covers(buf + 15, 1));
  EXPECT_TRUE(ledger.Overlaps(buf, 17));
  EXPECT_FALSE(ledger.Overlaps(buf, 16));
  EXPECT_FALSE(ledger.Overlaps(buf + 116, 50));
  EXPECT_FALSE(ledger.Commit(buf + 100, 50, 0).ok());
  EXPECT_FALSE(ledger.Commit(buf, 17, 0).ok());
  Status over = ledger.Reserve(901);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.message().find("901"), std::string::npos) << over.message();
  auto erased = ledger.Erase(buf + 16);
  ASSERT_TRUE(erased.ok());
  EXPECT_EQ(*erased, 100u);
  EXPECT_EQ(ledger.Erase(buf + 16).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ledger.in_use_bytes(), 0u);
  EXPECT_EQ(ledger.peak_bytes(), 100u);
}

TEST(DeviceOptionsTest, RefusesBadOptionsAndParsesKinds) {
  DeviceOptions o;
  EXPECT_EQ(MakeHostDevice(o).status().code(), StatusCode::kInvalidArgument);  // budget 0
  o.budget_bytes = kMiB;
  o.copy_gbps = -1;
  EXPECT_EQ(MakeHostDevice(o).status().code(), StatusCode::kInvalidArgument);
  o.copy_gbps = 0;
  o.compute_flops = std::numeric_limits<double>::infinity();
  EXPECT_EQ(MakeHostDevice(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseDeviceKind("host"), DeviceKind::kHost);
  EXPECT_EQ(*ParseDeviceKind("cuda"), DeviceKind::kCuda);
  EXPECT_FALSE(ParseDeviceKind("gpu").ok());
}

TEST(DeviceFactoryTest, AutoPicksTheHostDeviceWithoutAGpu) {
  DeviceOptions o;
  o.budget_bytes = kMiB;
  o.kind = DeviceKind::kHost;
  auto host = MakeDevice(o);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  EXPECT_EQ((*host)->kind(), DeviceKind::kHost);
  EXPECT_NE((*host)->Describe().find("host"), std::string::npos);
  if (ProbeCuda().device_count > 0) GTEST_SKIP() << "a GPU answers: auto picks CUDA";
  o.kind = DeviceKind::kAuto;
  auto any = MakeDevice(o);
  ASSERT_TRUE(any.ok()) << any.status().ToString();
  EXPECT_EQ((*any)->kind(), DeviceKind::kHost);
  o.kind = DeviceKind::kCuda;
  EXPECT_FALSE(MakeDevice(o).ok());
}

TEST(HostDeviceTest, BudgetIsNeverExceeded) {
  auto d = MakeHost(kMiB);
  auto a = d->Allocate(kMiB);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(d->bytes_in_use(), kMiB);
  auto one_more = d->Allocate(1);
  ASSERT_FALSE(one_more.ok());
  EXPECT_EQ(one_more.status().code(), StatusCode::kResourceExhausted);
  Status refused = one_more.status();
  const std::string& m = refused.message();
  EXPECT_NE(m.find("Allocate 1 bytes"), std::string::npos) << m;
  EXPECT_NE(m.find("1048576 of the 1048576-byte budget"), std::string::npos) << m;
  EXPECT_EQ(d->bytes_in_use(), kMiB);

  ASSERT_TRUE(d->Free(*a).ok());
  EXPECT_EQ(d->bytes_in_use(), 0u);
  auto b = d->Allocate(kMiB / 2);
  auto c = d->Allocate(kMiB / 2);
  ASSERT_TRUE(b.ok() && c.ok());
  EXPECT_FALSE(d->Allocate(1).ok());
  EXPECT_EQ(d->peak_bytes(), kMiB);
  ASSERT_TRUE(d->Free(*b).ok());
  d->ResetPeak();
  EXPECT_EQ(d->peak_bytes(), kMiB / 2);
  ASSERT_TRUE(d->Free(*c).ok());
}

TEST(HostDeviceTest, AllocationsAreAlignedAndPaddingCounts) {
  auto d = MakeHost(kMiB);
  auto a = d->Allocate(1);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*a) % kDeviceAlignment, 0u);
  EXPECT_EQ(d->bytes_in_use(), kDeviceAlignment);
  EXPECT_TRUE(d->IsDeviceMemory(*a, 1));
  EXPECT_FALSE(d->IsDeviceMemory(*a, 2));  // the padding is not the caller's
  EXPECT_EQ(d->Allocate(0).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(d->Free(*a).ok());
  EXPECT_EQ(d->Free(*a).code(), StatusCode::kNotFound);  // double free
  EXPECT_TRUE(d->Free(nullptr).ok());
  void* p = Pinned(*d, 10);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kPinnedAlignment, 0u);
  EXPECT_EQ(d->pinned_bytes(), kPinnedAlignment);
  ASSERT_TRUE(d->FreePinned(p).ok());
}

TEST(HostDeviceTest, ConcurrentAllocationsNeverExceedTheBudget) {
  constexpr uint64_t kBudget = 4 * kMiB;
  auto d = MakeHost(kBudget);
  std::atomic<int> refusals{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      std::vector<void*> held;
      for (int i = 0; i < 300; ++i) {
        if (!held.empty() && rng() % 3 == 0) {
          EXPECT_TRUE(d->Free(held.back()).ok());
          held.pop_back();
          continue;
        }
        auto p = d->Allocate(1 + rng() % (256 * 1024));
        if (p.ok()) {
          held.push_back(*p);
        } else {
          EXPECT_EQ(p.status().code(), StatusCode::kResourceExhausted);
          ++refusals;
        }
        EXPECT_LE(d->bytes_in_use(), kBudget);
      }
      for (void* p : held) EXPECT_TRUE(d->Free(p).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(d->peak_bytes(), kBudget);
  EXPECT_GT(refusals.load(), 0);  // the budget was actually contended
  EXPECT_EQ(d->bytes_in_use(), 0u);
}

TEST(HostDeviceTest, CopiesRoundTripByteExact) {
  constexpr uint64_t kBytes = 3 * kMiB + 123;  // not a multiple of the chunk
  auto d = MakeHost(16 * kMiB);
  auto* src = static_cast<unsigned char*>(Pinned(*d, kBytes, 7));
  auto* dst = static_cast<unsigned char*>(Pinned(*d, kBytes));
  auto a = d->Allocate(kBytes);
  auto b = d->Allocate(kBytes);
  ASSERT_TRUE(a.ok() && b.ok());
  auto s = d->CreateStream("copy");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(d->CopyToDevice(*s, *a, src, kBytes).ok());
  ASSERT_TRUE(d->CopyOnDevice(*s, *b, *a, kBytes).ok());
  ASSERT_TRUE(d->CopyToHost(*s, dst, *b, kBytes).ok());
  ASSERT_TRUE(d->CopyToHost(*s, dst, *b, 0).ok());  // zero bytes: a no-op
  ASSERT_TRUE(d->StreamSynchronize(*s).ok());
  EXPECT_EQ(std::memcmp(src, dst, kBytes), 0);
  StreamStats st = (*s)->stats();
  EXPECT_EQ(st.h2d_bytes, kBytes);
  EXPECT_EQ(st.d2d_bytes, kBytes);
  EXPECT_EQ(st.d2h_bytes, kBytes);
  EXPECT_EQ(st.copies, 3u);
  EXPECT_EQ((*s)->name(), "copy");
  EXPECT_EQ((*s)->index(), 0);
}

TEST(HostDeviceTest, CopiesRefuseBadRangesAndPageableMemory) {
  auto d = MakeHost(kMiB);
  auto other = MakeHost(kMiB);
  auto dev = d->Allocate(4096);
  ASSERT_TRUE(dev.ok());
  void* pinned = Pinned(*d, 4096, 3);
  Stream* s = *d->CreateStream("s");
  Stream* foreign = *other->CreateStream("foreign");
  auto* dev_bytes = static_cast<char*>(*dev);

  Status past_end = d->CopyToDevice(s, dev_bytes + 4000, pinned, 200);
  EXPECT_EQ(past_end.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(past_end.message().find("not inside one live device allocation"), std::string::npos)
      << past_end.message();
  EXPECT_EQ(d->CopyToHost(s, pinned, pinned, 16).code(), StatusCode::kInvalidArgument);
  std::vector<char> pageable(4096);
  Status unpinned = d->CopyToDevice(s, *dev, pageable.data(), 4096);
  EXPECT_EQ(unpinned.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(unpinned.message().find("not pinned"), std::string::npos) << unpinned.message();
  EXPECT_EQ(d->CopyToDevice(foreign, *dev, pinned, 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d->CopyToDevice(nullptr, *dev, pinned, 16).code(), StatusCode::kInvalidArgument);

  // Registered memory counts as pinned; overlapping registrations are refused.
  ASSERT_TRUE(d->RegisterHost(pageable.data(), pageable.size()).ok());
  EXPECT_FALSE(d->RegisterHost(pageable.data() + 8, 8).ok());
  EXPECT_TRUE(d->IsPinned(pageable.data() + 100, 100));
  ASSERT_TRUE(d->CopyToDevice(s, *dev, pageable.data(), 4096).ok());
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  ASSERT_TRUE(d->UnregisterHost(pageable.data()).ok());
  EXPECT_EQ(d->UnregisterHost(pageable.data()).code(), StatusCode::kNotFound);

  // Events belong to their device too.
  auto foreign_event = other->Record(foreign);
  ASSERT_TRUE(foreign_event.ok());
  EXPECT_EQ(d->StreamWaitEvent(s, *foreign_event).code(), StatusCode::kInvalidArgument);

  // Pageable copies are allowed when the device is told so.
  auto lax = MakeHost(kMiB, 0, 0, /*require_pinned=*/false);
  auto lax_dev = lax->Allocate(4096);
  Stream* ls = *lax->CreateStream("lax");
  ASSERT_TRUE(lax->CopyToDevice(ls, *lax_dev, pageable.data(), 4096).ok());
  ASSERT_TRUE(lax->StreamSynchronize(ls).ok());
}

TEST(HostDeviceTest, StreamRunsWorkInFifoOrder) {
  auto d = MakeHost(kMiB);
  Stream* s = *d->CreateStream("fifo");
  void* src = Pinned(*d, 4096, 5);
  void* dev = *d->Allocate(4096);
  std::vector<int> order;  // touched only by the stream's worker until synchronized
  for (int i = 0; i < 500; ++i) {
    ASSERT_TRUE(d->Launch(s, [&order, i] {
                   order.push_back(i);
                   return Status::Ok();
                 }).ok());
    if (i % 50 == 0) {
      ASSERT_TRUE(d->CopyToDevice(s, dev, src, 4096).ok());
    }
  }
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  ASSERT_EQ(order.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(s->stats().launches, 500u);
}

// Stream A's copy is paced (its data lands chunk by chunk over >= 20 ms); stream B reads the
// device buffer right after waiting on A's event. Without the wait B would read stale bytes.
TEST(HostDeviceTest, StreamWaitEventOrdersWorkAcrossStreams) {
  constexpr uint64_t kBytes = 4 * kMiB;
  auto d = MakeHost(8 * kMiB, /*copy_gbps=*/0.2);
  auto* src = static_cast<unsigned char*>(Pinned(*d, kBytes, 11));
  auto* dev = static_cast<unsigned char*>(*d->Allocate(kBytes));
  Stream* a = *d->CreateStream("a");
  Stream* b = *d->CreateStream("b");
  ASSERT_TRUE(d->Launch(a, [dev] {
                 std::memset(dev, 0, kBytes);
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(d->CopyToDevice(a, dev, src, kBytes).ok());
  auto landed = d->Record(a);
  ASSERT_TRUE(landed.ok());
  ASSERT_TRUE(d->StreamWaitEvent(b, *landed).ok());
  std::vector<unsigned char> seen(kBytes);
  ASSERT_TRUE(d->Launch(b, [&] {
                 std::memcpy(seen.data(), dev, kBytes);
                 return Status::Ok();
               }).ok());
  ASSERT_TRUE(d->StreamSynchronize(b).ok());
  EXPECT_EQ(std::memcmp(seen.data(), src, kBytes), 0);
  EXPECT_TRUE(*d->EventQuery(*landed));
}

TEST(HostDeviceTest, EventQueryIsFalseUntilTheWorkCompletes) {
  auto d = MakeHost(kMiB);
  Stream* s = *d->CreateStream("gated");
  EXPECT_TRUE(*d->EventQuery(Event()));  // never recorded: complete
  EXPECT_TRUE(d->EventSynchronize(Event()).ok());
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  ASSERT_TRUE(d->Launch(s, [opened] {
                 opened.wait();
                 return Status::Ok();
               }).ok());
  auto e = d->Record(s);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(*d->EventQuery(*e));
  Event copy = *e;  // copies name the same point
  EXPECT_FALSE(*d->EventQuery(copy));
  gate.set_value();
  ASSERT_TRUE(d->EventSynchronize(copy).ok());
  EXPECT_TRUE(*d->EventQuery(*e));
}

TEST(HostDeviceTest, ManyStreamsAndThreadsAtOnce) {
  constexpr int kThreads = 8;
  constexpr uint64_t kMaxBytes = 256 * 1024;
  auto d = MakeHost(kThreads * 2 * kMaxBytes, /*copy_gbps=*/20);
  Stream* shared = *d->CreateStream("shared-d2h");
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Stream* mine = *d->CreateStream("h2d-" + std::to_string(t));
      auto* src = static_cast<unsigned char*>(Pinned(*d, kMaxBytes));
      auto* dst = static_cast<unsigned char*>(Pinned(*d, kMaxBytes));
      auto* dev = *d->Allocate(kMaxBytes);
      std::mt19937_64 rng(t);
      for (int round = 0; round < 20; ++round) {
        uint64_t n = 1 + rng() % kMaxBytes;
        testing::FillRandom(src, n, rng());
        ASSERT_TRUE(d->CopyToDevice(mine, dev, src, n).ok());
        auto up = d->Record(mine);
        ASSERT_TRUE(up.ok());
        // The download runs on a stream all threads share, ordered by the event only.
        // The shared stream is FIFO across threads, so this thread waits on its own event.
        ASSERT_TRUE(d->StreamWaitEvent(shared, *up).ok());
        ASSERT_TRUE(d->CopyToHost(shared, dst, dev, n).ok());
        auto down = d->Record(shared);
        ASSERT_TRUE(down.ok());
        ASSERT_TRUE(d->EventSynchronize(*down).ok());
        ASSERT_EQ(std::memcmp(src, dst, n), 0) << "thread " << t << " round " << round;
        // The next upload may overwrite dev only after the download read it.
        ASSERT_TRUE(d->StreamWaitEvent(mine, *down).ok());
      }
      ASSERT_TRUE(d->Free(dev).ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(d->Synchronize().ok());
  EXPECT_EQ(d->streams().size(), kThreads + 1u);
  EXPECT_EQ(shared->stats().copies, kThreads * 20u);
}

TEST(HostDeviceTest, CopyBandwidthIsEmulatedAndSharedPerDirection) {
  constexpr uint64_t kBytes = 8 * kMiB;
  constexpr double kGbps = 2;
  const double one_copy = kBytes / (kGbps * kBytesPerGb);  // ~4.2 ms
  auto d = MakeHost(2 * kBytes, kGbps);
  void* src = Pinned(*d, kBytes, 9);
  void* dev1 = *d->Allocate(kBytes);
  void* dev2 = *d->Allocate(kBytes);
  Stream* s1 = *d->CreateStream("s1");
  Stream* s2 = *d->CreateStream("s2");

  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(d->CopyToDevice(s1, dev1, src, kBytes).ok());
  ASSERT_TRUE(d->StreamSynchronize(s1).ok());
  EXPECT_GE(SecondsSince(t0), one_copy);
  EXPECT_GE(s1->stats().copy_seconds, one_copy);

  // Two streams copying host-to-device at once share the lane: together >= 2 copies' time.
  t0 = Clock::now();
  ASSERT_TRUE(d->CopyToDevice(s1, dev1, src, kBytes).ok());
  ASSERT_TRUE(d->CopyToDevice(s2, dev2, src, kBytes).ok());
  ASSERT_TRUE(d->Synchronize().ok());
  EXPECT_GE(SecondsSince(t0), 2 * one_copy);
  StreamStats st1 = s1->stats();
  EXPECT_EQ(st1.h2d_bytes, 2 * kBytes);
  EXPECT_EQ(st1.copies, 2u);
  EXPECT_GE(st1.copy_seconds + s2->stats().copy_seconds, 3 * one_copy);
}

TEST(HostDeviceTest, ComputeRateIsEmulated) {
  constexpr double kFlopsPerSecond = 1e11;
  constexpr double kFlops = 1e9;  // 10 ms at that rate
  auto d = MakeHost(kMiB, 0, kFlopsPerSecond);
  Stream* s = *d->CreateStream("compute");
  Stream* t = *d->CreateStream("compute-2");
  std::atomic<int> ran{0};
  auto work = [&ran] {
    ++ran;
    return Status::Ok();
  };
  Clock::time_point t0 = Clock::now();
  ASSERT_TRUE(d->Launch(s, work, kFlops).ok());
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  EXPECT_GE(SecondsSince(t0), kFlops / kFlopsPerSecond);
  EXPECT_GE(s->stats().compute_seconds, kFlops / kFlopsPerSecond);
  EXPECT_EQ(s->stats().flops, kFlops);

  // One emulated GPU: launches on two streams share its rate.
  t0 = Clock::now();
  ASSERT_TRUE(d->Launch(s, work, kFlops).ok());
  ASSERT_TRUE(d->Launch(t, work, kFlops).ok());
  ASSERT_TRUE(d->Synchronize().ok());
  EXPECT_GE(SecondsSince(t0), 2 * kFlops / kFlopsPerSecond);
  EXPECT_EQ(ran.load(), 3);
  ASSERT_TRUE(d->Launch(s, work).ok());  // no flops: not paced
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
}

TEST(HostDeviceTest, FailingLaunchIsStickyAtSynchronize) {
  auto d = MakeHost(kMiB);
  Stream* s = *d->CreateStream("failing");
  Stream* w = *d->CreateStream("waiter");
  bool later_ran = false;
  std::promise<void> gate;  // holds the failure back until everything is enqueued
  std::shared_future<void> opened = gate.get_future().share();
  ASSERT_TRUE(d->Launch(s, [] { return Status::Ok(); }).ok());
  auto before = d->Record(s);
  ASSERT_TRUE(d->Launch(s, [opened] {
                 opened.wait();
                 return Internal("boom");
               }).ok());
  ASSERT_TRUE(d->Launch(s, [&] {
                 later_ran = true;
                 return Status::Ok();
               }).ok());
  auto after = d->Record(s);
  ASSERT_TRUE(before.ok() && after.ok());
  ASSERT_TRUE(d->StreamWaitEvent(w, *after).ok());
  gate.set_value();

  Status sync = d->StreamSynchronize(s);
  EXPECT_EQ(sync.code(), StatusCode::kInternal);
  EXPECT_NE(sync.message().find("boom"), std::string::npos) << sync.message();
  EXPECT_NE(sync.message().find("stream 'failing'"), std::string::npos) << sync.message();
  EXPECT_FALSE(later_ran);
  EXPECT_EQ(d->StreamSynchronize(s).code(), StatusCode::kInternal);  // sticky
  EXPECT_EQ(d->Launch(s, [] { return Status::Ok(); }).code(), StatusCode::kInternal);
  EXPECT_TRUE(d->EventSynchronize(*before).ok());  // recorded before the failure
  EXPECT_EQ(d->EventSynchronize(*after).code(), StatusCode::kInternal);

  Status waited = d->StreamSynchronize(w);  // the failure crossed the event
  EXPECT_EQ(waited.code(), StatusCode::kAborted);
  EXPECT_NE(waited.message().find("'failing'"), std::string::npos) << waited.message();
  EXPECT_FALSE(d->Synchronize().ok());
}

TEST(HostDeviceTest, ThrowingLaunchBecomesAnInternalError) {
  auto d = MakeHost(kMiB);
  Stream* s = *d->CreateStream("throws");
  ASSERT_TRUE(d->Launch(s, []() -> Status { throw std::runtime_error("bad alloc-ish"); }).ok());
  Status sync = d->StreamSynchronize(s);
  EXPECT_EQ(sync.code(), StatusCode::kInternal);
  EXPECT_NE(sync.message().find("bad alloc-ish"), std::string::npos) << sync.message();
}

TEST(HostDeviceTest, DestructionDrainsPendingWorkAndReleasesLeaks) {
  constexpr uint64_t kBytes = 2 * kMiB;
  std::atomic<bool> ran{false};
  {
    auto d = MakeHost(kBytes, /*copy_gbps=*/1);
    void* src = Pinned(*d, kBytes, 1);
    void* dev = *d->Allocate(kBytes);
    Stream* a = *d->CreateStream("a");
    Stream* b = *d->CreateStream("b");
    ASSERT_TRUE(d->CopyToDevice(a, dev, src, kBytes).ok());
    ASSERT_TRUE(d->StreamWaitEvent(b, *d->Record(a)).ok());
    ASSERT_TRUE(d->Launch(b, [&] {
                   ran = true;
                   return Status::Ok();
                 }).ok());
    // Leaves dev and src allocated and the work pending.
  }
  EXPECT_TRUE(ran.load());
}

}  // namespace
}  // namespace zinf
