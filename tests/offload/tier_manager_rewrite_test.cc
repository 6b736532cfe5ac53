// offload::TierManager with a shard's NVMe home rewritten by someone else (the optimizer's path:
// BeginRewrite, the home written directly, HomeRewritten) while copies of it are in transfer.
// Found by tier_manager_stress_test (about one run in a hundred under load), made deterministic
// here: a device load abandoned because its host copy turned stale while it was read leaves no
// stale mark on the next copy (whose first lease's writes were dropped at release); what a
// device-to-host write-back lands after the home was rewritten is dropped (it was kept as the
// newest copy and written home over the new content); and BeginRewrite returns only once an
// NVMe write of the old content in flight has landed.
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/offload/tier_manager_rig.h"

namespace zinf::offload {
namespace {

using namespace tm_rig;  // NOLINT: the rig's helpers, shared with the other tier manager tests

// One NVMe-homed shard with a known extent, filled with `fill`; no copy left resident.
ShardId OneShard(Rig& rig, uint8_t fill, Extent* home) {
  auto e = rig.swap->Allocate(kShard);
  EXPECT_TRUE(e.ok());
  *home = *e;
  auto id = rig.tm->Register({.name = "x", .bytes = kShard, .home_extent = *e});
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_TRUE(rig.Seal(1, 1).ok());
  std::vector<uint8_t> c(kShard, fill);
  EXPECT_TRUE(rig.tm->WriteHome(*id, c.data()).ok());
  EXPECT_TRUE(rig.tm->Invalidate(*id).ok());
  return *id;
}

// Writes `fill` to the shard's home behind the manager's back, as the optimizer does.
void WriteHomeDirectly(Rig& rig, const Extent& home, uint8_t fill) {
  auto buf = io::AlignedBuffer::Allocate(kShard, 4096);
  ASSERT_TRUE(buf.ok());
  std::memset(buf->data(), fill, kShard);
  ASSERT_TRUE(rig.swap->engine().Write(rig.swap->file(), home.offset, buf->data(), kShard).ok());
}

TEST(TierManagerRewriteTest, ADeviceLoadAbandonedForAStaleHostCopyLeavesTheNextCopyClean) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 8 << 20).ok());
  Extent home;
  const ShardId id = OneShard(rig, 1, &home);
  HeldDrive held(rig.faults);
  // A device load: its host copy is read from NVMe (held), the device copy waits for it.
  auto lease = rig.tm->Acquire(id, Tier::kDevice);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  // The home is rewritten meanwhile (its content is the same here: only the marks matter).
  rig.tm->HomeRewritten(id);
  held.Release();
  // The read lands stale: the device load is abandoned, and the lease's wait loads again.
  auto p = lease->Wait();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(Bytes(*p, kShard), std::vector<uint8_t>(kShard, 1));
  std::memset(*p, 7, kShard);
  ASSERT_TRUE(rig.tm->Release(std::move(*lease), /*dirty=*/true).ok());
  // The lease's writes are the newest content: in the device copy, and home after a flush.
  EXPECT_EQ(LeasedBytes(*rig.tm, id, Tier::kDevice), std::vector<uint8_t>(kShard, 7));
  ASSERT_TRUE(rig.tm->Flush().ok());
  std::vector<uint8_t> read(kShard);
  ASSERT_TRUE(rig.tm->ReadHome(id, read.data()).ok());
  EXPECT_EQ(read, std::vector<uint8_t>(kShard, 7));
}

// The home rewritten (HomeRewritten, without BeginRewrite: allowed) while a dirty device copy is
// copied to the host on its way home: what lands is older than the home, and is dropped instead
// of being kept as the newest copy and written home over the new content.
TEST(TierManagerRewriteTest, WhatADeviceToHostWriteBackLandsAfterTheHomeWasRewrittenIsDropped) {
  Rig rig;
  // A slow link: the device copy's copy to the host takes ~1.3 s.
  ASSERT_TRUE(rig.Make(8 << 20, 8 << 20, /*prefetch=*/true, /*copy_gbps=*/0.0002).ok());
  Extent home;
  const ShardId id = OneShard(rig, 1, &home);
  {
    auto lease = rig.tm->Acquire(id, Tier::kDevice);
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    auto p = lease->Wait();
    ASSERT_TRUE(p.ok());
    std::memset(*p, 2, kShard);  // a dirty device copy: the old content from here on
    ASSERT_TRUE(rig.tm->Release(std::move(*lease), /*dirty=*/true).ok());
  }
  auto flushed = std::async(std::launch::async, [&] { return rig.tm->Flush(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the copy is under way
  WriteHomeDirectly(rig, home, 3);
  rig.tm->HomeRewritten(id);
  ASSERT_TRUE(flushed.get().ok());
  ASSERT_TRUE(rig.tm->Flush().ok());
  std::vector<uint8_t> read(kShard);
  ASSERT_TRUE(rig.tm->ReadHome(id, read.data()).ok());
  EXPECT_EQ(read, std::vector<uint8_t>(kShard, 3)) << "old content landed after the new home";
  EXPECT_EQ(LeasedBytes(*rig.tm, id, Tier::kHost), std::vector<uint8_t>(kShard, 3));
  EXPECT_EQ(LeasedBytes(*rig.tm, id, Tier::kDevice), std::vector<uint8_t>(kShard, 3));
}

// The NVMe side: a host copy's write-behind of the old content is held in flight; BeginRewrite
// does not return until it has landed (after it, the caller's write of the new content would
// race it on the same extent).
TEST(TierManagerRewriteTest, BeginRewriteWaitsForAWriteBehindOfTheOldContentInFlight) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 8 << 20, /*prefetch=*/true, /*copy_gbps=*/0,
                       /*write_behind=*/true).ok());
  Extent home;
  const ShardId id = OneShard(rig, 1, &home);
  std::future<void> rewrite;  // joined after the release below, before the rig ends
  HeldDrive held(rig.faults);
  {
    auto lease = rig.tm->Acquire(id, Tier::kHost, AcquireMode::kOverwrite);  // nothing read
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    auto p = lease->Wait();
    ASSERT_TRUE(p.ok());
    std::memset(*p, 2, kShard);
    ASSERT_TRUE(rig.tm->Release(std::move(*lease), /*dirty=*/true).ok());  // written behind
  }
  std::atomic<bool> began{false};
  rewrite = std::async(std::launch::async, [&] {
    rig.tm->BeginRewrite(id);
    began = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(began.load()) << "BeginRewrite returned with the old content's write in flight";
  held.Release();
  rewrite.get();
  EXPECT_TRUE(began.load());
  WriteHomeDirectly(rig, home, 3);
  rig.tm->HomeRewritten(id);
  ASSERT_TRUE(rig.tm->Flush().ok());
  std::vector<uint8_t> read(kShard);
  ASSERT_TRUE(rig.tm->ReadHome(id, read.data()).ok());
  EXPECT_EQ(read, std::vector<uint8_t>(kShard, 3));
  EXPECT_EQ(LeasedBytes(*rig.tm, id, Tier::kHost), std::vector<uint8_t>(kShard, 3));
}

}  // namespace
}  // namespace zinf::offload
