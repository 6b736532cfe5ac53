// src/train/sizing.h: the swap file a rank reserves holds its share of the model across ranks
// (the executor's partition rule), and the whole model on one rank.
#include "src/train/sizing.h"

#include <gtest/gtest.h>

#include "src/ckpt/manifest.h"

namespace zinf::train {
namespace {

Config TinyConfig() {
  Config c;
  // Odd unit sizes (vocabulary 101): the chunks are padded.
  c.zinf.model = {.layers = 2, .width = 32, .heads = 2, .seq_len = 16, .vocab = 101};
  c.zinf.stripe_bytes = 4096;
  return c;
}

constexpr uint64_t kSlack = 4096 + 4096;  // a stripe unit and an O_DIRECT block an extent

TEST(SwapBytes, OneRankHoldsTheWholeModel) {
  const Config c = TinyConfig();
  const GptDims d = GptDims::FromConfig(c.zinf.model);
  uint64_t want = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    want += 6 * d.UnitParams(u) + 2 * kSlack + 2 * (12 * d.UnitParams(u) + 3 * kSlack);
  }
  EXPECT_EQ(SwapBytes(d, c, 2, {}), want);
  // Units whose state is in memory keep only their 16-bit weights and gradient there.
  std::vector<char> in_memory(d.units(), 1);
  uint64_t shards = 0;
  for (uint32_t u = 0; u < d.units(); ++u) shards += 6 * d.UnitParams(u) + 2 * kSlack;
  EXPECT_EQ(SwapBytes(d, c, 2, in_memory), shards);
  // A world of one, or ZeRO-0 across ranks, is the whole model too.
  EXPECT_EQ(SwapBytes(d, c, 2, {}, {.world = 1, .rank = 0, .optimizer = true}), want);
  EXPECT_EQ(SwapBytes(d, c, 2, {}, {.world = 4, .rank = 1}), want);
}

TEST(SwapBytes, EachRankHoldsItsShareAcrossRanks) {
  const Config c = TinyConfig();
  const GptDims d = GptDims::FromConfig(c.zinf.model);
  for (uint32_t world : {2u, 3u, 4u}) {
    for (int stage : {1, 2, 3}) {
      uint64_t all_ranks = 0;
      for (uint32_t rank = 0; rank < world; ++rank) {
        const RankShare share{.world = world, .rank = rank, .optimizer = true,
                              .grads = stage >= 2, .params = stage >= 3};
        uint64_t want = 0;
        for (uint32_t u = 0; u < d.units(); ++u) {
          const uint64_t n = d.UnitParams(u);
          const ckpt::UnitChunk k = ckpt::ChunkOfUnit(n, world, rank);
          const uint64_t p16 = stage >= 3 ? k.per : n;
          const uint64_t grad = stage >= 2 ? k.per : k.per * world;
          want += 2 * p16 + 4 * grad + 2 * kSlack + 12 * k.len + 3 * kSlack;
        }
        const uint64_t got = SwapBytes(d, c, 1, {}, share);
        EXPECT_EQ(got, want) << "world " << world << " stage " << stage << " rank " << rank;
        all_ranks += got;
      }
      // Every rank's state is its chunk: together the whole state once (not world times), and
      // with ZeRO-3 everything once, give or take the padding and each extent's slack.
      const uint64_t whole = SwapBytes(d, c, 1, {});
      const uint64_t slack = world * d.units() * 5 * kSlack;
      const uint64_t padding = 6 * world * d.units();  // 16-bit and gradient chunks padded
      if (stage == 3) {
        EXPECT_LE(all_ranks, whole - d.units() * 5 * kSlack + slack + padding)
            << "world " << world;
      }
      EXPECT_LT(SwapBytes(d, c, 1, {}, {.world = world, .rank = 0, .optimizer = true,
                                        .grads = stage >= 2, .params = stage >= 3}),
                whole) << "world " << world << " stage " << stage;
    }
  }
}

}  // namespace
}  // namespace zinf::train
