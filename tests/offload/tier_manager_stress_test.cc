// A multi-threaded randomized stress test of offload::TierManager, meant to run under
// ThreadSanitizer too (tools/dev.sh test-tsan): several threads acquire and release (dirty and
// clean), install pending copies and rewrite homes over random traces with tight budgets, while
// completions arrive on the I/O engine's reaper and the host device's stream threads. Checked:
// every read sees the last write, a device slot is never reused before its last user's event
// (a check that runs on the user's own stream, later), peaks never exceed the budgets, no
// acquire fails within the declared leases, and no case hangs (a watchdog aborts it, naming it).
#include "offload/tier_manager.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "tests/test_util.h"

namespace zinf::offload {
namespace {

using zinf::testing::TempDir;

// Aborts the process with a message if a case runs past its deadline.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit) : what_(std::move(what)) {
    thread_ = std::thread([this, limit] {
      std::unique_lock lock(mu_);
      if (!cv_.wait_for(lock, limit, [&] { return done_; })) {
        std::fprintf(stderr, "watchdog: %s did not finish within %lld s: a hang\n", what_.c_str(),
                     static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::abort();
      }
    });
  }
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

struct Case {
  uint64_t seed;
  int threads;
  int shards_per_thread;
  int ops_per_thread;
  const char* eviction_policy = "belady";
};

void RunCase(const Case& k) {
  std::mt19937_64 setup(k.seed);
  TempDir dir;
  // A paced link, so that transfers overlap the threads' work.
  auto device = MakeHostDevice({.kind = DeviceKind::kHost, .budget_bytes = 8 << 20,
                                .copy_gbps = 2.0});
  ASSERT_TRUE(device.ok());
  auto engine = io::Engine::Create({.block_size = 64 << 10, .queue_depth = 16});
  ASSERT_TRUE(engine.ok());
  auto swap = SwapSpace::Create(**engine, {.dirs = {dir.path()}, .size = 64 << 20});
  ASSERT_TRUE(swap.ok()) << swap.status().ToString();
  const int n = k.threads * k.shards_per_thread;
  // A few sizes, so that classes are shared by several threads' shards.
  const uint64_t sizes[] = {24 << 10, 64 << 10, 100 << 10};
  std::vector<uint64_t> bytes(n);
  for (int i = 0; i < n; ++i) bytes[i] = sizes[setup() % 3] - setup() % 1000;
  // Budgets: room for the declared leases of each size (one per thread) and a little more, below
  // the shards' total, so that copies are evicted all the time.
  const uint64_t per_size_set = (24 + 64 + 100 + 4) << 10;
  const uint64_t dev_budget = k.threads * per_size_set + (64 << 10);
  const uint64_t pin_budget = (k.threads + 1) * per_size_set + (64 << 10);
  auto pool = PinnedPool::Create({.budget_bytes = pin_budget});
  ASSERT_TRUE(pool.ok());
  auto arena = DeviceArena::Create(**device, dev_budget);
  ASSERT_TRUE(arena.ok());
  auto tm = TierManager::Create(**arena, **pool, swap->get(),
                                {.prefetch = true, .eviction_policy = k.eviction_policy});
  ASSERT_TRUE(tm.ok());
  std::vector<ShardId> ids(n);
  std::vector<Extent> homes(n);
  for (int i = 0; i < n; ++i) {
    auto e = (*swap)->Allocate(bytes[i]);
    ASSERT_TRUE(e.ok());
    homes[i] = *e;
    auto id = (*tm)->Register({.name = fmt::format("s{}", i), .unit = static_cast<uint32_t>(i),
                               .bytes = bytes[i], .home_extent = *e});
    ASSERT_TRUE(id.ok());
    ids[i] = *id;
  }
  SealOptions seal;
  seal.max_leases[0].fill(static_cast<uint32_t>(k.threads));  // one device lease per thread
  seal.max_leases[1].fill(static_cast<uint32_t>(k.threads));  // one host lease per thread
  Status sealed = (*tm)->Seal(seal);
  ASSERT_TRUE(sealed.ok()) << sealed.ToString();

  // Shard i belongs to thread i % threads: only its owner touches its content, so "the last
  // write" is well defined; everything else (slots, transfers, prefetch, the engine) is shared.
  std::vector<std::vector<uint8_t>> model(n);
  for (int i = 0; i < n; ++i) {
    model[i].assign(bytes[i], 0);
    zinf::testing::FillRandom(model[i].data(), bytes[i], k.seed * 1000 + i);
    ASSERT_TRUE((*tm)->WriteHome(ids[i], model[i].data()).ok());
  }
  std::atomic<int> failures{0};
  std::atomic<int> stale_reuse{0};
  auto fail = [&](const std::string& what) {
    if (failures++ < 5) ADD_FAILURE() << "seed " << k.seed << ": " << what;
  };
  auto worker = [&](int t) {
    std::mt19937_64 rng(k.seed * 7919 + t);
    Device& dev = **device;
    auto stream = dev.CreateStream(fmt::format("user{}", t));
    if (!stream.ok()) return fail(stream.status().ToString());
    auto bounce = io::AlignedBuffer::Allocate((*swap)->Padded(100 << 10), 4096);
    if (!bounce.ok()) return fail(bounce.status().ToString());
    for (int op = 0; op < k.ops_per_thread && failures == 0; ++op) {
      const int i = t + k.threads * static_cast<int>(rng() % k.shards_per_thread);
      const ShardId id = ids[i];
      const uint64_t r = rng() % 100;
      if (r < 10) {
        // The optimizer's path: new content installed, then written home behind the manager.
        std::vector<uint8_t> fresh(bytes[i]);
        zinf::testing::FillRandom(fresh.data(), bytes[i], rng());
        (*tm)->BeginRewrite(id);
        auto installed = (*tm)->InstallPending(id, fresh.data());
        if (!installed.ok()) return fail(installed.status().ToString());
        std::memcpy(bounce->data(), fresh.data(), bytes[i]);
        Status w = (*swap)->engine().Write((*swap)->file(), homes[i].offset, bounce->data(),
                                           (*swap)->Padded(bytes[i]));
        if (!w.ok()) return fail(w.ToString());
        (*tm)->HomeRewritten(id);
        model[i] = std::move(fresh);
        continue;
      }
      if (r < 15) {
        zinf::testing::FillRandom(model[i].data(), bytes[i], rng());
        Status w = (*tm)->WriteHome(id, model[i].data());
        if (!w.ok()) return fail(w.ToString());
        continue;
      }
      const Tier tier = rng() % 2 ? Tier::kDevice : Tier::kHost;
      auto lease = (*tm)->Acquire(id, tier);
      if (!lease.ok()) return fail("acquire: " + lease.status().ToString());
      const bool enqueued = tier == Tier::kDevice && rng() % 2;
      void* p = nullptr;
      if (enqueued) {
        // The executor's path: no host wait for the copy; the user's stream waits for it and
        // checks the content there, later; the release carries that stream's event.
        auto ready = lease->WaitEnqueued();
        if (!ready.ok()) return fail(ready.status().ToString());
        p = ready->ptr;
        Status st = dev.StreamWaitEvent(*stream, ready->event);
        const std::vector<uint8_t>* want = &model[i];
        const uint64_t len = bytes[i];
        if (st.ok()) {
          st = dev.Launch(*stream, [p, want, len, &stale_reuse] {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            if (std::memcmp(p, want->data(), len) != 0) stale_reuse++;
            return Status::Ok();
          });
        }
        auto used = st.ok() ? dev.Record(*stream) : Result<Event>(st);
        if (!used.ok()) return fail(used.status().ToString());
        Status rel = (*tm)->Release(std::move(*lease), false, *used);
        if (!rel.ok()) return fail(rel.ToString());
        // The model must not change before the check ran.
        if (Status s = dev.StreamSynchronize(*stream); !s.ok()) return fail(s.ToString());
        continue;
      }
      auto waited = lease->Wait();
      if (!waited.ok()) return fail(waited.status().ToString());
      p = *waited;
      if (std::memcmp(p, model[i].data(), bytes[i]) != 0) {
        fail(fmt::format("shard {} in the {} tier does not hold its last write (op {})", i,
                         TierName(tier), op));
      }
      const bool write = rng() % 3 == 0;
      if (write) {
        zinf::testing::FillRandom(p, bytes[i], rng());
        std::memcpy(model[i].data(), p, bytes[i]);
      }
      Status rel = (*tm)->Release(std::move(*lease), write);
      if (!rel.ok()) return fail(rel.ToString());
      if (t == 0 && op % 25 == 24) (*tm)->EndStep();
    }
  };
  {
    Watchdog dog(fmt::format("stress case seed {}", k.seed), std::chrono::seconds(120));
    std::vector<std::thread> threads;
    for (int t = 0; t < k.threads; ++t) threads.emplace_back(worker, t);
    for (auto& th : threads) th.join();
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(stale_reuse.load(), 0) << "a device slot was rewritten before its user's event";
  ASSERT_TRUE((*tm)->Flush().ok());
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> home(bytes[i]);
    ASSERT_TRUE((*tm)->ReadHome(ids[i], home.data()).ok());
    EXPECT_TRUE(home == model[i]) << "seed " << k.seed << " shard " << i << " home";
  }
  const TierStats st = (*tm)->stats();
  EXPECT_LE(st.peak_device_bytes, dev_budget);
  EXPECT_LE(st.peak_host_bytes, pin_budget);
  EXPECT_GT(st.evictions, 0u) << "budgets too loose for the test to mean anything";
}

TEST(TierManagerStressTest, ThreadsSharingTightTiersSeeTheirLastWritesAndNeverFail) {
  // More shards per thread than the budgets hold: every case evicts.
  for (const Case& k : {Case{1, 3, 6, 250}, Case{2, 4, 6, 200}, Case{3, 2, 9, 300},
                        Case{4, 3, 7, 250}}) {
    SCOPED_TRACE(fmt::format("seed {}", k.seed));
    RunCase(k);
    if (HasFatalFailure()) return;
  }
}

// Every eviction policy keeps the same promises: a policy decides only which copy goes.
TEST(TierManagerStressTest, EveryEvictionPolicyKeepsTheLastWritesAndNeverFails) {
  for (const char* policy : {"lru", "cost"}) {
    for (const Case& k : {Case{5, 3, 6, 250, policy}, Case{6, 2, 9, 300, policy}}) {
      SCOPED_TRACE(fmt::format("policy {} seed {}", policy, k.seed));
      RunCase(k);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace zinf::offload
