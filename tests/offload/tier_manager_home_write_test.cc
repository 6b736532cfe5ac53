// offload::TierManager::BeginHomeWrite/EndHomeWrite: a shard homed in host memory written in
// place (the optimizer's new 16-bit weights without a staging copy): the old device copy goes,
// the next device load reads the new bytes, a device load started during the write waits for
// it, so does a ReadHome, and NVMe homes and leased shards are refused.
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "offload/tier_manager.h"
#include "tests/offload/tier_manager_rig.h"

namespace zinf::offload {
namespace {

using namespace tm_rig;  // NOLINT: the rig's helpers

// Reads the shard's device copy through a lease.
std::vector<uint8_t> DeviceBytes(TierManager& tm, ShardId id) {
  return LeasedBytes(tm, id, Tier::kDevice);
}

TEST(TierManagerHomeWriteTest, WritesTheHostHomeInPlaceAndDropsTheOldDeviceCopy) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto id = rig.tm->Register({.name = "p16", .bytes = kShard, .home = Tier::kHost});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  const std::vector<uint8_t> a(kShard, 1), b(kShard, 2);
  ASSERT_TRUE(rig.tm->WriteHome(*id, a.data()).ok());
  EXPECT_EQ(DeviceBytes(*rig.tm, *id), a);  // a device copy of a stays cached

  auto home = rig.tm->BeginHomeWrite(*id);
  ASSERT_TRUE(home.ok()) << home.status().ToString();
  std::memcpy(*home, b.data(), kShard);
  rig.tm->EndHomeWrite(*id);

  EXPECT_EQ(DeviceBytes(*rig.tm, *id), b);
  std::vector<uint8_t> read(kShard);
  ASSERT_TRUE(rig.tm->ReadHome(*id, read.data()).ok());
  EXPECT_EQ(read, b);
  // The home is the memory lent: a second write in place sees it.
  home = rig.tm->BeginHomeWrite(*id);
  ASSERT_TRUE(home.ok());
  EXPECT_EQ(Bytes(*home, kShard), b);
  rig.tm->EndHomeWrite(*id);
}

TEST(TierManagerHomeWriteTest, ADeviceLoadStartedDuringTheWriteWaitsForIt) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto id = rig.tm->Register({.name = "p16", .bytes = kShard, .home = Tier::kHost});
  ASSERT_TRUE(id.ok());
  const std::vector<uint8_t> a(kShard, 3), b(kShard, 4);
  ASSERT_TRUE(rig.tm->WriteHome(*id, a.data()).ok());
  auto home = rig.tm->BeginHomeWrite(*id);
  ASSERT_TRUE(home.ok());
  std::promise<void> acquired;
  auto reader = std::async(std::launch::async, [&] {
    auto lease = rig.tm->Acquire(*id, Tier::kDevice);
    acquired.set_value();
    if (!lease.ok()) return std::vector<uint8_t>();
    auto p = lease->Wait();
    std::vector<uint8_t> out = p.ok() ? Bytes(*p, kShard) : std::vector<uint8_t>();
    EXPECT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
    return out;
  });
  // The device load is enqueued behind the write before the new bytes land.
  acquired.get_future().wait();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::memcpy(*home, b.data(), kShard);
  rig.tm->EndHomeWrite(*id);
  EXPECT_EQ(reader.get(), b);
}

// ReadHome (zinf_tensor_read) during a write in place waits for it: never half old, half new.
TEST(TierManagerHomeWriteTest, AReadHomeDuringTheWriteWaitsForIt) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto id = rig.tm->Register({.name = "p16", .bytes = kShard, .home = Tier::kHost});
  ASSERT_TRUE(id.ok());
  const std::vector<uint8_t> a(kShard, 6), b(kShard, 7);
  ASSERT_TRUE(rig.tm->WriteHome(*id, a.data()).ok());
  auto home = rig.tm->BeginHomeWrite(*id);
  ASSERT_TRUE(home.ok());
  std::memcpy(*home, b.data(), kShard / 2);  // half written when the read arrives
  auto reader = std::async(std::launch::async, [&] {
    std::vector<uint8_t> out(kShard);
    EXPECT_TRUE(rig.tm->ReadHome(*id, out.data()).ok());
    return out;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::memcpy(static_cast<uint8_t*>(*home) + kShard / 2, b.data(), kShard / 2);
  rig.tm->EndHomeWrite(*id);
  EXPECT_EQ(reader.get(), b);
}

TEST(TierManagerHomeWriteTest, RefusesAnNvmeHomeAndALeasedShard) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto host = rig.tm->Register({.name = "h", .bytes = kShard, .home = Tier::kHost});
  auto nvme = rig.tm->Register({.name = "n", .bytes = kShard, .home = Tier::kNvme});
  ASSERT_TRUE(host.ok() && nvme.ok());
  const std::vector<uint8_t> a(kShard, 5);
  ASSERT_TRUE(rig.tm->WriteHome(*host, a.data()).ok());
  ASSERT_TRUE(rig.tm->WriteHome(*nvme, a.data()).ok());

  auto refused = rig.tm->BeginHomeWrite(*nvme);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("NVMe"), std::string::npos) << refused.status().ToString();

  auto lease = rig.tm->Acquire(*host, Tier::kDevice);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(lease->Wait().ok());
  auto leased = rig.tm->BeginHomeWrite(*host);
  ASSERT_FALSE(leased.ok());
  EXPECT_NE(leased.status().message().find("leased"), std::string::npos);
  ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
  auto home = rig.tm->BeginHomeWrite(*host);
  ASSERT_TRUE(home.ok()) << home.status().ToString();
  rig.tm->EndHomeWrite(*host);
}

}  // namespace
}  // namespace zinf::offload
