// offload::SlotTable: size classes carved once, so that "accepted at start" means "cannot fail
// mid-run". A property test over random shard sizes, lease limits and budgets: whenever Create
// accepts a plan, every class holds its minimum, slots never overlap, and any order of requests
// that keeps each class within its slots is served; whenever it refuses, the region really is
// below the minimum it names.
#include "offload/slot_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace zinf::offload {
namespace {

uint64_t RoundUp(uint64_t b, uint64_t a) { return (b + a - 1) / a * a; }

TEST(SlotTableTest, DistantSizesGetOneClassEachWithLeasesPlusSpare) {
  // A model's shapes: 2 embedding-sized shards, 6 block-sized, 1 tiny; two roles.
  std::vector<SlotDemand> shards;
  for (int i = 0; i < 2; ++i) shards.push_back({3000, 0});
  for (int i = 0; i < 6; ++i) shards.push_back({10000, 0});
  for (int i = 0; i < 6; ++i) shards.push_back({10000, 1});
  shards.push_back({100, 0});
  SlotTableOptions o{.tier = "host", .alignment = 256, .max_leases = {1, 2}, .spare = 1};
  // Minimum: block class 1 + 2 + 1 = 4 slots of 10240 bytes, embedding 1 + 1 = 2 of 3072, the
  // tiny class 1 (it has one shard) of 256.
  EXPECT_EQ(SlotTable::MinimumBytes(shards, o), 4 * 10240u + 2 * 3072u + 256u);
  std::vector<uint8_t> region(1 << 20);
  auto* base = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(region.data()), 4096));
  auto t = SlotTable::Create(base, 200 * 1024, shards, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->classes(), 3u);
  EXPECT_EQ(t->info(t->ClassFor(10000)).slot_bytes, 10240u);
  EXPECT_EQ(t->info(t->ClassFor(10000)).min_slots, 4u);
  EXPECT_EQ(t->info(t->ClassFor(3000)).min_slots, 2u);
  EXPECT_EQ(t->info(t->ClassFor(100)).min_slots, 1u);
  EXPECT_EQ(t->ClassFor(50000), -1);
  // The rest went to the least covered classes, never beyond one slot per shard.
  for (size_t c = 0; c < t->classes(); ++c) {
    EXPECT_GE(t->info(static_cast<int>(c)).slots, t->info(static_cast<int>(c)).min_slots);
    EXPECT_LE(t->info(static_cast<int>(c)).slots, t->info(static_cast<int>(c)).shards);
  }
  EXPECT_LE(t->carved_bytes(), 200u * 1024);
}

TEST(SlotTableTest, ARegionBelowTheMinimumIsRefusedNamingEachClass) {
  std::vector<SlotDemand> shards = {{8192, 0}, {8192, 0}, {8192, 0}, {4096, 0}};
  SlotTableOptions o{.tier = "device", .alignment = 256, .max_leases = {2}, .spare = 0};
  const uint64_t need = SlotTable::MinimumBytes(shards, o);
  EXPECT_EQ(need, 2 * 8192u + 4096u);
  std::vector<uint8_t> region(need);
  auto t = SlotTable::Create(region.data(), need - 256, shards, o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(t.status().message().find("2 x 8192 bytes"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("1 x 4096 bytes"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("device tier"), std::string::npos);
  EXPECT_TRUE(SlotTable::Create(region.data(), need, shards, o).ok());
}

TEST(SlotTableTest, ManySizesShareGeometricClassesWastingAtMostAQuarter) {
  std::mt19937_64 rng(3);
  std::vector<SlotDemand> shards;
  for (int i = 0; i < 40; ++i) shards.push_back({1000 + rng() % 100000, 0});
  SlotTableOptions o{.tier = "host", .alignment = 256, .max_leases = {1}, .spare = 1};
  std::vector<uint8_t> region(64 << 20);
  auto t = SlotTable::Create(region.data(), region.size(), shards, o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_LT(t->classes(), 40u);
  for (const SlotDemand& d : shards) {
    const int c = t->ClassFor(d.bytes);
    ASSERT_GE(c, 0) << d.bytes;
    EXPECT_GE(t->info(c).slot_bytes, d.bytes);
    EXPECT_LE(static_cast<double>(t->info(c).slot_bytes),
              kClassSpread * static_cast<double>(RoundUp(d.bytes, 256)) + 1);
  }
}

// The property: random plans; accepted ones serve every in-bounds request sequence.
TEST(SlotTableTest, AnAcceptedPlanServesEveryRequestWithinItsSlots) {
  int accepted = 0, refused = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t align = rng() % 2 ? 256 : 4096;
    const uint32_t roles = 1 + rng() % 3;
    SlotTableOptions o{.tier = "t", .alignment = align, .spare = static_cast<uint32_t>(rng() % 2)};
    for (uint32_t r = 0; r < roles; ++r) o.max_leases.push_back(1 + rng() % 3);
    const int distinct = 1 + static_cast<int>(rng() % 12);
    std::vector<uint64_t> sizes;
    for (int i = 0; i < distinct; ++i) sizes.push_back(1 + rng() % (1 << 18));
    std::vector<SlotDemand> shards;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) {
      shards.push_back({sizes[rng() % sizes.size()], static_cast<uint32_t>(rng() % roles)});
    }
    const uint64_t need = SlotTable::MinimumBytes(shards, o);
    const uint64_t bytes = need / 2 + rng() % (2 * need + 1);
    std::vector<uint8_t> region(bytes + align);
    auto* base = reinterpret_cast<uint8_t*>(RoundUp(reinterpret_cast<uintptr_t>(region.data()), align));
    auto t = SlotTable::Create(base, bytes, shards, o);
    if (!t.ok()) {
      ASSERT_EQ(t.status().code(), StatusCode::kResourceExhausted);
      ASSERT_LT(bytes, need) << "seed " << seed << ": refused a region that holds the minimum";
      ++refused;
      continue;
    }
    ++accepted;
    ASSERT_GE(bytes, need) << "seed " << seed;
    ASSERT_LE(t->carved_bytes(), bytes);
    // Every shard has a class big enough; every class its minimum.
    std::map<int, uint32_t> shards_in;
    for (const SlotDemand& d : shards) {
      const int c = t->ClassFor(d.bytes);
      ASSERT_GE(c, 0);
      ASSERT_GE(t->info(c).slot_bytes, d.bytes);
      shards_in[c]++;
    }
    for (size_t c = 0; c < t->classes(); ++c) {
      const SlotClassInfo& info = t->info(static_cast<int>(c));
      ASSERT_GE(info.slots, info.min_slots);
      ASSERT_EQ(info.shards, shards_in[static_cast<int>(c)]);
      ASSERT_EQ(info.slot_bytes % align, 0u);
    }
    // Random takes and gives: a take succeeds exactly when the class has a slot left; the slots
    // handed out never overlap and stay inside the region.
    std::vector<std::vector<Slot>> held(t->classes());
    for (int step = 0; step < 400; ++step) {
      const int c = static_cast<int>(rng() % t->classes());
      const SlotClassInfo& info = t->info(c);
      if (!held[c].empty() && rng() % 2) {
        t->Give(c, std::move(held[c].back()));
        held[c].pop_back();
        continue;
      }
      Slot s;
      const bool got = t->Take(c, &s);
      ASSERT_EQ(got, held[c].size() < info.slots) << "seed " << seed << " class " << c;
      if (!got) continue;
      auto* p = static_cast<uint8_t*>(s.ptr);
      ASSERT_GE(p, base);
      ASSERT_LE(p + info.slot_bytes, base + bytes);
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p) % align, 0u);
      for (size_t k = 0; k < held.size(); ++k) {
        for (const Slot& o2 : held[k]) {
          auto* q = static_cast<uint8_t*>(o2.ptr);
          const bool apart = p + info.slot_bytes <= q || q + t->info(static_cast<int>(k)).slot_bytes <= p;
          ASSERT_TRUE(apart) << "seed " << seed << ": overlapping slots";
        }
      }
      held[c].push_back(std::move(s));
    }
  }
  EXPECT_GT(accepted, 50);
  EXPECT_GT(refused, 10);
}

}  // namespace
}  // namespace zinf::offload
