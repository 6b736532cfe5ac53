// offload::TierManager's derived shards (ShardSpec::derive): loads compute the content instead
// of reading NVMe, in both tiers and by prefetch; nothing of them reaches the disk; BeginRewrite
// waits for a derivation in flight, and after the source changes the next load sees the new
// content; a failed derivation reaches its waiter naming the shard; what would write a derived
// shard home is refused.
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

std::vector<uint8_t> Leased(TierManager& tm, ShardId id, Tier tier) {
  auto lease = tm.Acquire(id, tier);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
  if (!lease.ok()) return {};
  auto p = lease->Wait();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::vector<uint8_t> out = p.ok() ? Bytes(*p, kShard) : std::vector<uint8_t>();
  EXPECT_TRUE(tm.Release(std::move(*lease), false).ok());
  return out;
}

TEST(TierManagerDeriveTest, LoadsComputeTheContentAndNeverTouchTheDisk) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  Sources src(6);
  std::vector<ShardId> ids;
  for (int i = 0; i < 6; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("d{}", i), .bytes = kShard,
                                .derive = src.Derive(i)});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  EXPECT_EQ(rig.swap->allocated(), 0u);  // no extent for a derived shard
  ASSERT_TRUE(rig.Seal(1, 1).ok());
  // Two steps (forward, then backward in reverse) of device loads; the pinned budget holds
  // fewer than six host copies, so some are derived again.
  for (int step = 0; step < 2; ++step) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < 6; ++k) {
        const int i = pass == 0 ? k : 5 - k;
        EXPECT_EQ(Leased(*rig.tm, ids[i], Tier::kDevice), src.Expected(i)) << i;
      }
    }
    rig.tm->EndStep();
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Leased(*rig.tm, ids[i], Tier::kHost), src.Expected(i));
  std::vector<uint8_t> read(kShard);
  ASSERT_TRUE(rig.tm->ReadHome(ids[3], read.data()).ok());
  EXPECT_EQ(read, src.Expected(3));
  const TierStats st = rig.tm->stats();
  EXPECT_EQ(st.nvme_read_bytes, 0u);
  EXPECT_EQ(st.nvme_write_bytes, 0u);
  EXPECT_GE(st.derived_bytes, 6 * kShard);
  EXPECT_EQ(st.derived_bytes % kShard, 0u);
  EXPECT_GT(st.prefetch_hits, 0u);  // step two's loads were derived ahead
}

TEST(TierManagerDeriveTest, BeginRewriteWaitsForADerivationInFlightThenLoadsSeeTheNewSource) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  Sources src(1);
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
  auto loaded = std::async(std::launch::async, [&] { return Leased(*rig.tm, *id, Tier::kHost); });
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
  EXPECT_EQ(Leased(*rig.tm, *id, Tier::kDevice), src.Expected(0));
}

TEST(TierManagerDeriveTest, AFailedDerivationReachesItsWaiterNamingTheShard) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  bool fail = true;
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
  EXPECT_EQ(Leased(*rig.tm, *id, Tier::kHost), std::vector<uint8_t>(kShard, 5));
}

TEST(TierManagerDeriveTest, WritingADerivedShardHomeIsRefused) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  Sources src(1);
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
  EXPECT_EQ(Leased(*rig.tm, *id, Tier::kHost), src.Expected(0));
  EXPECT_EQ(rig.tm->stats().nvme_write_bytes, 0u);
}

}  // namespace
}  // namespace zinf::offload
