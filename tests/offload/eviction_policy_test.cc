// Tests of offload/eviction_policy.h: the rules every policy shares (clean before dirty, what a
// prefetch may evict), each policy's ranking, and the registry.
#include "offload/eviction_policy.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "offload/tier_manager.h"

namespace zinf::offload {
namespace {

std::unique_ptr<EvictionPolicy> Policy(const char* name) {
  auto p = MakeEvictionPolicy(name);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

EvictionCandidate C(ShardId id, uint64_t last_use, size_t next_use, bool dirty = false,
                    double refetch = 1.0) {
  EvictionCandidate c;
  c.id = id;
  c.bytes = 1 << 20;
  c.dirty = dirty;
  c.last_use = last_use;
  c.next_use = next_use;
  c.refetch_seconds = refetch;
  c.writeback_seconds = dirty ? 1.0 : 0.0;
  return c;
}

EvictionRequest Demand(bool trace_valid = true, size_t pos = 10) {
  return {.tier = Tier::kHost, .prefetch = false, .need_pos = 0, .trace_valid = trace_valid,
          .pos = pos};
}

EvictionRequest Prefetch(size_t need_pos, bool trace_valid = true, size_t pos = 10) {
  return {.tier = Tier::kHost, .prefetch = true, .need_pos = need_pos,
          .trace_valid = trace_valid, .pos = pos};
}

TEST(EvictionPolicyTest, TheRegistryKnowsEachPolicyByNameAndRefusesOthersNamingThem) {
  EXPECT_EQ(EvictionPolicyNames(), (std::vector<std::string>{"belady", "lru", "cost"}));
  for (const std::string& n : EvictionPolicyNames()) EXPECT_EQ(Policy(n.c_str())->name(), n);
  auto bad = MakeEvictionPolicy("fifo");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("\"fifo\""), std::string::npos);
  EXPECT_NE(bad.status().message().find("\"belady\", \"lru\", \"cost\""), std::string::npos);
}

TEST(EvictionPolicyTest, EveryPolicyTakesACleanCopyBeforeADirtyOne) {
  for (const std::string& n : EvictionPolicyNames()) {
    auto p = Policy(n.c_str());
    // The dirty copy is the best by every ranking (farthest, least recent, cheapest).
    const std::vector<EvictionCandidate> cs = {C(1, 5, 100, /*dirty=*/true, 0.001),
                                               C(2, 9, 12)};
    EXPECT_EQ(p->PickVictim(Demand(), cs), 2u) << n;
    // With no clean copy, a dirty one goes (a demand may wait for the write-back).
    EXPECT_EQ(p->PickVictim(Demand(), std::vector{C(1, 5, 100, true)}), 1u) << n;
  }
}

TEST(EvictionPolicyTest, APrefetchNeverEvictsDirtyNeededSoonerOrWithoutATrace) {
  for (const std::string& n : EvictionPolicyNames()) {
    auto p = Policy(n.c_str());
    EXPECT_EQ(p->PickVictim(Prefetch(20), std::vector{C(1, 5, 100, true)}), std::nullopt) << n;
    // Needed at 15, no later than what the prefetch fetches (20): kept.
    EXPECT_EQ(p->PickVictim(Prefetch(20), std::vector{C(1, 5, 15)}), std::nullopt) << n;
    EXPECT_EQ(p->PickVictim(Prefetch(20), std::vector{C(1, 5, 15), C(2, 6, 30)}), 2u) << n;
    EXPECT_EQ(p->PickVictim(Prefetch(20, /*trace_valid=*/false), std::vector{C(1, 5, kNever)}),
              std::nullopt)
        << n;
  }
}

TEST(EvictionPolicyTest, BeladyTakesTheFarthestNextUseElseTheLeastRecent) {
  auto p = Policy("belady");
  const std::vector<EvictionCandidate> cs = {C(1, 1, 40), C(2, 2, 90), C(3, 3, 60)};
  EXPECT_EQ(p->PickVictim(Demand(), cs), 2u);
  EXPECT_EQ(p->PickVictim(Demand(/*trace_valid=*/false), cs), 1u);
  // A tie goes to the first candidate.
  EXPECT_EQ(p->PickVictim(Demand(), std::vector{C(4, 1, kNever), C(5, 0, kNever)}), 4u);
}

TEST(EvictionPolicyTest, LruTakesTheLeastRecentTraceOrNot) {
  auto p = Policy("lru");
  const std::vector<EvictionCandidate> cs = {C(1, 7, 90), C(2, 3, 40), C(3, 5, 60)};
  EXPECT_EQ(p->PickVictim(Demand(), cs), 2u);
  EXPECT_EQ(p->PickVictim(Demand(false), cs), 2u);
}

TEST(EvictionPolicyTest, CostKeepsWhatIsExpensiveToFetchBackOverWhatIsFar) {
  auto p = Policy("cost");
  // Copy 1 is farther (next use at 90) but costs 10 s to bring back (its host copy is gone);
  // copy 2 is used at 40 and costs 0.1 s: losing copy 2 is cheaper.
  const std::vector<EvictionCandidate> cs = {C(1, 1, 90, false, 10.0), C(2, 2, 40, false, 0.1)};
  EXPECT_EQ(p->PickVictim(Demand(/*trace_valid=*/true, /*pos=*/10), cs), 2u);
  EXPECT_EQ(Policy("belady")->PickVictim(Demand(true, 10), cs), 1u);
  // At equal cost it is Belady: the farthest goes.
  EXPECT_EQ(p->PickVictim(Demand(), std::vector{C(1, 1, 90), C(2, 2, 40)}), 1u);
  // Never used again goes first; without a trace, the least recent.
  EXPECT_EQ(p->PickVictim(Demand(), std::vector{C(1, 1, 90), C(2, 2, kNever, false, 99.0)}), 2u);
  EXPECT_EQ(p->PickVictim(Demand(false), std::vector{C(1, 4, 90), C(2, 2, 40)}), 2u);
}

}  // namespace
}  // namespace zinf::offload
