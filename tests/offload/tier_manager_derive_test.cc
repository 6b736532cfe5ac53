// offload::TierManager's derived shards (ShardSpec::derive): loads compute the content instead
// of reading NVMe, in both tiers and by prefetch; nothing of them reaches the disk; BeginRewrite
// waits for a derivation in flight, and after the source changes the next load sees the new
// content; while the source changes no load starts (demand loads and ReadHome are refused); a
// failed derivation reaches its waiter naming the shard; what would write a derived shard home
// is refused; a waiter's derivation goes ahead of the prefetches queued before it.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/offload/tier_manager_rig.h"

namespace zinf::offload {
namespace {

using namespace tm_rig;  // NOLINT: the rig's helpers, shared with the other tier manager tests

// Sources for n derived shards of kShard bytes: shard i derives as its source's byte, plus one.
struct Sources {
  std::vector<std::vector<uint8_t>> bytes;
  std::atomic<int> calls{0};
  explicit Sources(int n) {
    for (int i = 0; i < n; ++i) bytes.emplace_back(kShard, static_cast<uint8_t>(10 * i));
  }
  std::function<Status(void*)> Derive(int i) {
    return [this, i](void* dst) {
      calls++;
      auto* d = static_cast<uint8_t*>(dst);
      for (uint64_t k = 0; k < kShard; ++k) d[k] = static_cast<uint8_t>(bytes[i][k] + 1);
      return Status::Ok();
    };
  }
  std::vector<uint8_t> Expected(int i) const {
    std::vector<uint8_t> e(kShard);
    for (uint64_t k = 0; k < kShard; ++k) e[k] = static_cast<uint8_t>(bytes[i][k] + 1);
    return e;
  }
};

// Two steps (forward, then backward in reverse) of device loads of six derived shards, under
// budgets of two device and three host copies: copies are evicted and derived again.
TierStats TwoSteps(bool prefetch) {
  Sources src(6);  // before the rig: the manager's derive thread may read it until the end
  Rig rig;
  EXPECT_TRUE(rig.Make(2 * kShard, 3 * kShard + (64 << 10), prefetch).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 6; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("d{}", i), .bytes = kShard,
                                .derive = src.Derive(i)});
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  EXPECT_EQ(rig.swap->allocated(), 0u);  // no extent for a derived shard
  EXPECT_TRUE(rig.Seal(1, 1).ok());
  for (int step = 0; step < 2; ++step) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < 6; ++k) {
        const int i = pass == 0 ? k : 5 - k;
        EXPECT_EQ(LeasedBytes(*rig.tm, ids[i], Tier::kDevice), src.Expected(i)) << i;
      }
    }
    rig.tm->EndStep();
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(LeasedBytes(*rig.tm, ids[i], Tier::kHost), src.Expected(i));
  std::vector<uint8_t> read(kShard);
  EXPECT_TRUE(rig.tm->ReadHome(ids[3], read.data()).ok());
  EXPECT_EQ(read, src.Expected(3));
  return rig.tm->stats();  // the manager (and its queued derivations) ends before src
}

TEST(TierManagerDeriveTest, LoadsComputeTheContentAndNeverTouchTheDisk) {
  const TierStats on = TwoSteps(/*prefetch=*/true);
  const TierStats off = TwoSteps(/*prefetch=*/false);
  for (const TierStats& st : {on, off}) {
    EXPECT_EQ(st.nvme_read_bytes, 0u);
    EXPECT_EQ(st.nvme_write_bytes, 0u);
    EXPECT_EQ(st.derived_bytes % kShard, 0u);
    // Three host copies for six shards: loads derive again in the second step.
    EXPECT_GT(st.derived_bytes, 6 * kShard);
    EXPECT_GT(st.host_evictions, 0u);
  }
  // Prefetch derives ahead: more acquires find their copy in place than without it.
  EXPECT_GT(on.prefetch_hits, off.prefetch_hits);
}

TEST(TierManagerDeriveTest, DuringARewriteNoLoadStartsAndBeginRewriteWaitsForQueuedOnes) {
  Sources src(2);
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, go = false;
  auto held = [&](void* dst) {  // holds the derive thread until `go`
    {
      std::unique_lock lock(mu);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return go; });
    }
    return src.Derive(0)(dst);
  };
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto first = rig.tm->Register({.name = "held", .bytes = kShard, .derive = held});
  auto second = rig.tm->Register({.name = "queued", .bytes = kShard, .derive = src.Derive(1)});
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(rig.Seal(2, 2).ok());
  auto a = std::async(std::launch::async, [&] { return LeasedBytes(*rig.tm, *first, Tier::kHost); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  // The second shard's derivation queues behind the held one.
  auto b = std::async(std::launch::async, [&] { return LeasedBytes(*rig.tm, *second, Tier::kHost); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::atomic<bool> began{false};
  auto begin = std::async(std::launch::async, [&] {
    rig.tm->BeginRewrite(*second);
    began = true;
  });
  EXPECT_EQ(begin.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_FALSE(began.load()) << "BeginRewrite returned with a derivation of the shard queued";
  {
    std::lock_guard lock(mu);
    go = true;
    cv.notify_all();
  }
  begin.get();
  EXPECT_EQ(a.get(), src.Expected(0));
  EXPECT_EQ(b.get(), src.Expected(1));
  // Until the rewrite ends no load of it starts: a demand load is refused, not torn.
  ASSERT_TRUE(rig.tm->Invalidate(*second).ok());  // drops the copy (and ends the rewrite)
  rig.tm->BeginRewrite(*second);
  auto during = rig.tm->Acquire(*second, Tier::kHost);
  ASSERT_FALSE(during.ok());
  EXPECT_EQ(during.status().code(), StatusCode::kFailedPrecondition) << during.status().ToString();
  EXPECT_NE(during.status().ToString().find("being changed"), std::string::npos);
  std::vector<uint8_t> read(kShard);
  EXPECT_EQ(rig.tm->ReadHome(*second, read.data()).code(), StatusCode::kFailedPrecondition);
  src.bytes[1].assign(kShard, 42);
  rig.tm->HomeRewritten(*second);
  EXPECT_EQ(LeasedBytes(*rig.tm, *second, Tier::kDevice), src.Expected(1));
}

TEST(TierManagerDeriveTest, BeginRewriteWaitsForADerivationInFlightThenLoadsSeeTheNewSource) {
  Sources src(1);  // before the rig: the derive thread may read it until the rig ends
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false, go = false;
  auto slow = [&](void* dst) {
    {
      std::unique_lock lock(mu);
      entered = true;
      cv.notify_all();
      cv.wait(lock, [&] { return go; });
    }
    return src.Derive(0)(dst);
  };
  auto id = rig.tm->Register({.name = "slow", .bytes = kShard, .derive = slow});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(rig.Seal(1, 1).ok());
  auto loaded = std::async(std::launch::async, [&] { return LeasedBytes(*rig.tm, *id, Tier::kHost); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  std::atomic<bool> began{false};
  auto begin = std::async(std::launch::async, [&] {
    rig.tm->BeginRewrite(*id);
    began = true;
  });
  // The derivation is held: BeginRewrite must still be waiting for it.
  EXPECT_EQ(begin.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  EXPECT_FALSE(began.load());
  {
    std::lock_guard lock(mu);
    go = true;
    cv.notify_all();
  }
  begin.get();
  EXPECT_EQ(loaded.get(), src.Expected(0));
  // The owner changes the source, then says so: the next load derives the new content.
  src.bytes[0].assign(kShard, 77);
  ASSERT_TRUE(rig.tm->Invalidate(*id).ok());
  EXPECT_EQ(LeasedBytes(*rig.tm, *id, Tier::kDevice), src.Expected(0));
}

TEST(TierManagerDeriveTest, AFailedDerivationReachesItsWaiterNamingTheShard) {
  std::atomic<bool> fail{true};  // before the rig, which its derive function outlives
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto id = rig.tm->Register({.name = "block7.param16", .bytes = kShard,
                              .derive = [&](void* dst) {
                                if (fail) return DataLoss("the source is gone");
                                std::memset(dst, 5, kShard);
                                return Status::Ok();
                              }});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(rig.Seal(1, 1).ok());
  auto lease = rig.tm->Acquire(*id, Tier::kDevice);
  ASSERT_TRUE(lease.ok());
  auto p = lease->Wait();
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().ToString().find("block7.param16"), std::string::npos) << p.status().ToString();
  EXPECT_NE(p.status().ToString().find("the source is gone"), std::string::npos);
  rig.tm->Release(std::move(*lease), false).IgnoreError();
  fail = false;  // a later load tries again
  EXPECT_EQ(LeasedBytes(*rig.tm, *id, Tier::kHost), std::vector<uint8_t>(kShard, 5));
}

// The derive thread is held by a demand load while the prefetcher queues the next four shards;
// a caller then waits for the last of them: its derivation runs next, before the three
// prefetches queued ahead of it.
TEST(TierManagerDeriveTest, AWaiterTakesItsQueuedDerivationAheadOfEarlierPrefetches) {
  Sources src(5);  // before the rig: the derive thread may read it until the rig ends
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false, entered = false;
  std::vector<int> order;  // shards in the order they were derived
  auto fn = [&](int i) {
    return [&, i](void* dst) {
      {
        std::unique_lock lock(mu);
        order.push_back(i);
        if (i == 0 && hold) {
          entered = true;
          cv.notify_all();
          cv.wait(lock, [&] { return !hold; });
        }
      }
      return src.Derive(i)(dst);
    };
  };
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 8 << 20).ok());  // room for every host copy
  std::vector<ShardId> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("d{}", i), .bytes = kShard, .derive = fn(i)});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(rig.Seal(2, 2).ok());
  for (ShardId id : ids) Touch(*rig.tm, id, Tier::kHost);  // a step: the prefetcher's trace
  rig.tm->EndStep();
  for (ShardId id : ids) ASSERT_TRUE(rig.tm->Invalidate(id).ok());  // the next loads derive
  {
    std::lock_guard lock(mu);
    order.clear();
    hold = true;
  }
  // However the test ends, the held derivation goes on before the rig's manager is destroyed
  // (which joins the derive thread).
  struct Unhold {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& hold;
    ~Unhold() {
      std::lock_guard lock(mu);
      hold = false;
      cv.notify_all();
    }
  } unhold{mu, cv, hold};
  auto first = rig.tm->Acquire(ids[0], Tier::kHost);  // derives d0 (held), prefetches d1..d4
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return entered; });
  }
  auto last =
      std::async(std::launch::async, [&] { return LeasedBytes(*rig.tm, ids[4], Tier::kHost); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (rig.tm->stats().derive_promotions == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(rig.tm->stats().derive_promotions, 1u) << "the waiter's derivation was not moved ahead";
  {
    std::lock_guard lock(mu);
    hold = false;
    cv.notify_all();
  }
  auto p = first->Wait();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(Bytes(*p, kShard), src.Expected(0));
  ASSERT_TRUE(rig.tm->Release(std::move(*first), false).ok());
  EXPECT_EQ(last.get(), src.Expected(4));
  for (int i = 1; i < 4; ++i) EXPECT_EQ(LeasedBytes(*rig.tm, ids[i], Tier::kHost), src.Expected(i));
  std::lock_guard lock(mu);
  EXPECT_EQ(order, (std::vector<int>{0, 4, 1, 2, 3}));
}

TEST(TierManagerDeriveTest, WritingADerivedShardHomeIsRefused) {
  Sources src(1);
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto host_home = rig.tm->Register(
      {.name = "h", .bytes = kShard, .home = Tier::kHost, .derive = src.Derive(0)});
  ASSERT_FALSE(host_home.ok());
  EXPECT_NE(host_home.status().ToString().find("home must be nvme"), std::string::npos);
  auto id = rig.tm->Register({.name = "d", .bytes = kShard, .derive = src.Derive(0)});
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(rig.Seal(1, 1).ok());
  std::vector<uint8_t> other(kShard, 9);
  Status w = rig.tm->WriteHome(*id, other.data());
  EXPECT_EQ(w.code(), StatusCode::kFailedPrecondition) << w.ToString();
  auto lease = rig.tm->Acquire(*id, Tier::kHost);
  ASSERT_TRUE(lease.ok());
  auto p = lease->Wait();
  ASSERT_TRUE(p.ok());
  std::memset(*p, 9, kShard);
  Status r = rig.tm->Release(std::move(*lease), /*dirty=*/true);
  EXPECT_EQ(r.code(), StatusCode::kFailedPrecondition) << r.ToString();
  // The changed copy was dropped: the next lease sees what derive computes.
  EXPECT_EQ(LeasedBytes(*rig.tm, *id, Tier::kHost), src.Expected(0));
  EXPECT_EQ(rig.tm->stats().nvme_write_bytes, 0u);
}

}  // namespace
}  // namespace zinf::offload
