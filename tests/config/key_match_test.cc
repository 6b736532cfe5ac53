#include "src/config/key_match.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(ConfigKeyMatchTest, EditDistanceCountsEachEditOnce) {
  EXPECT_EQ(EditDistance("", ""), 0u);
  EXPECT_EQ(EditDistance("stage", "stage"), 0u);
  EXPECT_EQ(EditDistance("Stage", "stage"), 0u);                 // case does not count
  EXPECT_EQ(EditDistance("offload_parm", "offload_param"), 1u);  // deletion
  EXPECT_EQ(EditDistance("bufer_count", "buffer_count"), 1u);
  EXPECT_EQ(EditDistance("queue_dpeth", "queue_depth"), 1u);  // adjacent swap
  EXPECT_EQ(EditDistance("lr", "lx"), 1u);
  EXPECT_EQ(EditDistance("abc", ""), 3u);
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3u);
}

TEST(ConfigKeyMatchTest, NearestKeySuggestsPlausibleTypos) {
  const std::vector<std::string> keys = {"device",      "nvme_path",  "buffer_count",
                                         "buffer_size", "max_in_cpu", "pin_memory"};
  EXPECT_EQ(NearestKey("bufer_count", keys), "buffer_count");
  EXPECT_EQ(NearestKey("buffer_sise", keys), "buffer_size");
  EXPECT_EQ(NearestKey("nvmepath", keys), "nvme_path");
  EXPECT_EQ(NearestKey("Device", keys), "device");
  EXPECT_EQ(NearestKey("pin", keys), "");  // too far and too short to be a prefix
  EXPECT_EQ(NearestKey("learning_rate", keys), "");
  EXPECT_EQ(NearestKey("stage3_prefetch", {"stage", "stage3_prefetch_bucket_size"}),
            "stage3_prefetch_bucket_size");  // truncated key
  EXPECT_EQ(NearestKey("x", {}), "");
}

}  // namespace
}  // namespace zinf
