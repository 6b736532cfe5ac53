// Tests of offload/access_trace.h: recording and replaying a step's acquires, NextUse, and the
// prefetch walk (Ahead).
#include "offload/access_trace.h"

#include <gtest/gtest.h>

#include <tuple>
#include <vector>

#include "offload/tier_manager.h"

namespace zinf::offload {
namespace {

// Shard s belongs to unit s / 2: shards 0,1 are unit 0, 2,3 unit 1, ...
uint32_t UnitOf(ShardId id) { return id / 2; }

AccessTrace Recorded(const std::vector<std::tuple<ShardId, Tier, bool>>& acquires) {
  AccessTrace t;
  for (auto [id, tier, overwrite] : acquires) EXPECT_TRUE(t.Observe(id, tier, overwrite));
  EXPECT_TRUE(t.EndStep());
  return t;
}

std::vector<size_t> Walk(const AccessTrace& t, size_t pos, uint32_t units, size_t stop_after = 99) {
  std::vector<size_t> seen;
  t.Ahead(pos, units, UnitOf, [&](ShardId, Tier, size_t q) {
    seen.push_back(q);
    return seen.size() < stop_after;
  });
  return seen;
}

TEST(AccessTraceTest, AReplayedStepMatchesAndADepartureInvalidatesUntilTheStepEnds) {
  AccessTrace t = Recorded({{0, Tier::kDevice, false}, {2, Tier::kDevice, false}});
  EXPECT_TRUE(t.valid());
  EXPECT_TRUE(t.Observe(0, Tier::kDevice, false));
  EXPECT_EQ(t.pos(), 1u);
  EXPECT_FALSE(t.Observe(4, Tier::kDevice, false));  // the order changed
  EXPECT_FALSE(t.valid());
  EXPECT_FALSE(t.EndStep());  // the next step records anew
  EXPECT_TRUE(t.recording());
}

TEST(AccessTraceTest, NextUseWrapsIntoTheNextStep) {
  AccessTrace t = Recorded({{0, Tier::kDevice, false}, {2, Tier::kDevice, false},
                            {0, Tier::kHost, false}});
  EXPECT_EQ(t.NextUse(0, Tier::kDevice, 0), 0u);
  EXPECT_EQ(t.NextUse(0, Tier::kDevice, 1), 3u);  // the next step's position 0
  EXPECT_EQ(t.NextUse(0, Tier::kHost, 0), 2u);
  EXPECT_EQ(t.NextUse(6, Tier::kHost, 0), kNever);
}

TEST(AccessTraceTest, AheadWalksTheNextUnitsInOrderAndStopsWhenAsked) {
  // Units 0, 1, 2, 3, two shards each.
  AccessTrace t = Recorded({{0, Tier::kDevice, false}, {1, Tier::kDevice, false},
                            {2, Tier::kDevice, false}, {3, Tier::kDevice, false},
                            {4, Tier::kDevice, false}, {5, Tier::kDevice, false},
                            {6, Tier::kDevice, false}});
  // From position 2 (unit 1, the unit before is 0): units 1 and 2 are the next two.
  EXPECT_EQ(Walk(t, 2, 2), (std::vector<size_t>{2, 3, 4, 5}));
  // From position 3 the unit before is 1: unit 1's rest counts as the current unit.
  EXPECT_EQ(Walk(t, 3, 1), (std::vector<size_t>{3, 4, 5}));
  EXPECT_EQ(Walk(t, 0, 9), (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6}));  // not past the step
  EXPECT_EQ(Walk(t, 0, 9, 2), (std::vector<size_t>{0, 1}));  // fetch said stop
}

TEST(AccessTraceTest, AheadSkipsOverwritesAndTheReadsTheyRewrite) {
  AccessTrace t = Recorded({{0, Tier::kHost, true}, {1, Tier::kDevice, false},
                            {0, Tier::kDevice, false}, {2, Tier::kDevice, false}});
  // Shard 0 is overwritten at 0: neither that acquire nor its later read at 2 is fetched.
  EXPECT_EQ(Walk(t, 0, 9), (std::vector<size_t>{1, 3}));
  // From position 1 the overwrite is behind: the read at 2 fetches.
  EXPECT_EQ(Walk(t, 1, 9), (std::vector<size_t>{1, 2, 3}));
}

}  // namespace
}  // namespace zinf::offload
