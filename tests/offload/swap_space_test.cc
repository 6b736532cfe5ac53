// offload::SwapSpace: aligned extents within a fixed capacity.
#include "offload/swap_space.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf::offload {
namespace {

TEST(SwapSpaceTest, ExtentsAreAlignedDisjointAndBounded) {
  zinf::testing::TempDir a, b;
  auto engine = io::Engine::Create({});
  ASSERT_TRUE(engine.ok());
  auto space = SwapSpace::Create(**engine, {.dirs = {a.path(), b.path()}, .size = 8 << 20,
                                            .stripe_bytes = 1 << 20});
  ASSERT_TRUE(space.ok()) << space.status().ToString();
  uint64_t end = 0;
  for (uint64_t bytes : {100u, 3u << 20, 5000u, 1u << 20}) {
    auto e = (*space)->Allocate(bytes);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_GE(e->offset, end);
    EXPECT_EQ(e->offset % (*space)->offset_align(), 0u);
    if (bytes >= (1u << 20)) {
      EXPECT_EQ(e->offset % (1 << 20), 0u);  // starts on a stripe
    }
    end = e->offset + (*space)->Padded(bytes);
  }
  auto full = (*space)->Allocate(8 << 20);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("capacity"), std::string::npos);
}

}  // namespace
}  // namespace zinf::offload
