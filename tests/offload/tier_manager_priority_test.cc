// offload::TierManager's I/O priorities at the tier level: a caller that waits for a shard whose
// prefetch NVMe read is still queued in the engine behind earlier prefetches makes it a demand
// read (TierStats::read_promotions), and the engine takes it next. The drive is held (the fault
// backend's held completions, the engine one piece in flight) so that the reads stay queued
// while the waiter arrives; the order the engine handed the pieces to the backend is recorded.
#include <algorithm>
#include <chrono>
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

// The five shards' contents: shard i is the byte i (RegisterFilledSealed).
std::vector<uint8_t> Filled(int i) { return std::vector<uint8_t>(kShard, static_cast<uint8_t>(i)); }

// Runs one load of five NVMe shards after a recorded step: shard 0 on demand, 1..4 by prefetch,
// with the drive held until the test has waited for shard 4 (when `wait_for_last`) or not at
// all. Returns the order in which the shards' reads reached the drive.
std::vector<int> ReadOrder(bool wait_for_last, TierStats* stats) {
  std::mutex mu;                  // before the rig: its backend's rule records into these
  std::vector<uint64_t> offsets;  // each read piece's file offset, in the order prepared
  Rig rig;
  rig.queue_depth = 1;  // one read in flight: the others queue in the engine
  EXPECT_TRUE(rig.Make(8 << 20, 8 << 20).ok());  // room for every host copy
  std::vector<ShardId> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("s{}", i), .bytes = kShard});
    EXPECT_TRUE(id.ok());
  }
  EXPECT_TRUE(rig.Seal(2, 2).ok());
  RegisterFilledSealed(*rig.tm, 5, &ids);
  rig.faults->set_rule([&](const io::Piece& p) {
    if (p.op == io::OpKind::kRead) {
      std::lock_guard lock(mu);
      offsets.push_back(p.offset);
    }
    return io::Fault{};
  });
  // A step of demand loads, one shard after the other: the prefetcher's trace, and each
  // shard's offset (one piece a shard). WriteHome left a copy: drop it, so each one is read.
  for (ShardId id : ids) EXPECT_TRUE(rig.tm->Invalidate(id).ok());
  for (ShardId id : ids) Touch(*rig.tm, id, Tier::kHost);
  rig.tm->EndStep();
  for (ShardId id : ids) EXPECT_TRUE(rig.tm->Invalidate(id).ok());  // the next loads read NVMe
  std::vector<uint64_t> shard_offset;
  {
    std::lock_guard lock(mu);
    shard_offset.swap(offsets);
  }
  EXPECT_EQ(shard_offset.size(), 5u) << "one read a shard in the recorded step";
  std::future<std::vector<uint8_t>> last;  // the waiter, joined before the rig ends
  HeldDrive held(rig.faults);
  auto first = rig.tm->Acquire(ids[0], Tier::kHost);  // reads s0 (held), prefetches s1..s4
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  if (!first.ok()) return {};
  if (wait_for_last) {
    last = std::async(std::launch::async, [&] { return LeasedBytes(*rig.tm, ids[4], Tier::kHost); });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (rig.tm->stats().read_promotions == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  held.Release();
  auto p = first->Wait();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (p.ok()) {
    EXPECT_EQ(Bytes(*p, kShard), Filled(0));
  }
  EXPECT_TRUE(rig.tm->Release(std::move(*first), false).ok());
  if (wait_for_last) {
    EXPECT_EQ(last.get(), Filled(4));
  }
  for (int i = 1; i < 5; ++i) EXPECT_EQ(LeasedBytes(*rig.tm, ids[i], Tier::kHost), Filled(i)) << i;
  *stats = rig.tm->stats();
  std::vector<int> order;
  std::lock_guard lock(mu);
  for (uint64_t off : offsets) {
    auto it = std::find(shard_offset.begin(), shard_offset.end(), off);
    order.push_back(it == shard_offset.end() ? -1 : static_cast<int>(it - shard_offset.begin()));
  }
  return order;
}

TEST(TierManagerPriorityTest, AWaiterMakesItsQueuedPrefetchReadADemandReadTakenNext) {
  TierStats st;
  std::vector<int> order = ReadOrder(/*wait_for_last=*/true, &st);
  EXPECT_EQ(st.read_promotions, 1u);
  EXPECT_EQ(order, (std::vector<int>{0, 4, 1, 2, 3}));
}

// The control: nobody waits, the prefetches are read in the order they were issued.
TEST(TierManagerPriorityTest, WithoutAWaiterThePrefetchesAreReadInTheirOrder) {
  TierStats st;
  std::vector<int> order = ReadOrder(/*wait_for_last=*/false, &st);
  EXPECT_EQ(st.read_promotions, 0u);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
}

}  // namespace
}  // namespace zinf::offload
