// offload::PinnedPool: a hard budget, aligned blocks, coalescing, clear refusals.
#include "offload/pinned_pool.h"

#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace zinf::offload {
namespace {

TEST(PinnedPoolTest, NeverExceedsTheBudget) {
  auto pool = PinnedPool::Create({.budget_bytes = 1 << 20, .alignment = 4096});
  ASSERT_TRUE(pool.ok()) << pool.status().ToString();
  std::vector<PinnedBlock> blocks;
  std::mt19937_64 rng(1);
  for (int i = 0; i < 2000; ++i) {
    if (!blocks.empty() && rng() % 3 == 0) {
      size_t k = rng() % blocks.size();
      ASSERT_TRUE((*pool)->Free(blocks[k]).ok());
      blocks.erase(blocks.begin() + static_cast<long>(k));
    } else {
      auto b = (*pool)->Allocate(1 + rng() % (96 << 10));
      if (b.ok()) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 4096, 0u);
        blocks.push_back(*b);
      } else {
        EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
      }
    }
    ASSERT_LE((*pool)->bytes_in_use(), (*pool)->budget_bytes());
  }
  EXPECT_LE((*pool)->peak_bytes(), (*pool)->budget_bytes());
  for (auto& b : blocks) ASSERT_TRUE((*pool)->Free(b).ok());
  EXPECT_EQ((*pool)->bytes_in_use(), 0u);
  // Everything coalesced back into one block.
  EXPECT_EQ((*pool)->largest_free_block(), (*pool)->budget_bytes());
}

TEST(PinnedPoolTest, RefusalNamesTheNumbers) {
  auto pool = PinnedPool::Create({.budget_bytes = 64 << 10});
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(48 << 10);
  ASSERT_TRUE(a.ok());
  auto b = (*pool)->Allocate(32 << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("budget 65536"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("49152 in use"), std::string::npos);
  // The exact bytes asked and the rounded request both appear.
  EXPECT_NE(b.status().message().find("32768 bytes asked"), std::string::npos);
}

// A double free (or a block from elsewhere) was silently ignored; it is refused now, and the
// pool's accounting is untouched.
TEST(PinnedPoolTest, DoubleFreeAndForeignBlocksAreRefusedLoudly) {
  auto pool = PinnedPool::Create({.budget_bytes = 64 << 10});
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(8 << 10);
  auto b = (*pool)->Allocate(8 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*pool)->Free(*a).ok());
  Status twice = (*pool)->Free(*a);
  EXPECT_EQ(twice.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(twice.message().find("double free"), std::string::npos) << twice.message();
  PinnedBlock inside{b->data + 4096, 4096};  // not the start of a block
  EXPECT_EQ((*pool)->Free(inside).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*pool)->bytes_in_use(), 8u << 10);
  ASSERT_TRUE((*pool)->Free(*b).ok());
  EXPECT_EQ((*pool)->bytes_in_use(), 0u);
}

TEST(PinnedPoolTest, AllocateRestTakesTheLargestFreeBlockWhole) {
  auto pool = PinnedPool::Create({.budget_bytes = 64 << 10});
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(16 << 10);
  ASSERT_TRUE(a.ok());
  PinnedBlock rest = (*pool)->AllocateRest();
  EXPECT_EQ(rest.bytes, 48u << 10);
  EXPECT_EQ((*pool)->bytes_in_use(), 64u << 10);
  EXPECT_FALSE((*pool)->AllocateRest());  // nothing left: an empty block, not an error
  ASSERT_TRUE((*pool)->Free(rest).ok());
  ASSERT_TRUE((*pool)->Free(*a).ok());
}

TEST(PinnedPoolTest, RefusesAnImpossibleBudget) {
  EXPECT_FALSE(PinnedPool::Create({.budget_bytes = 0}).ok());
  auto huge = PinnedPool::Create({.budget_bytes = 1ull << 50});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("pinned_bytes"), std::string::npos);
}

}  // namespace
}  // namespace zinf::offload
