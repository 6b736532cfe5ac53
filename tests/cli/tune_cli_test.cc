// `zinf tune` end to end on a tiny grid: the JSON `aio` block with DeepSpeed's key names.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;

TEST(TuneCliTest, PrintsAnAioBlockWithDeepSpeedKeys) {
  TempDir dir;
  auto r = RunZinf("tune --path " + dir.path() +
                       " --size 4M --engines uring,posix --blocks 64K,128K --qds 1,2 --time 0.05"
                       " --json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("aio")) << r.out;
  for (const char* k : {"block_size", "queue_depth", "intra_op_parallelism", "single_submit",
                        "overlap_events", "engine"}) {
    EXPECT_TRUE(j["aio"].contains(k)) << k;
  }
  uint64_t block = j["aio"]["block_size"];
  EXPECT_TRUE(block == 65536 || block == 131072) << block;
  EXPECT_GT(j["best_read"]["gbps"].get<double>(), 0);
  EXPECT_GT(j["best_write"]["gbps"].get<double>(), 0);
  // Grid 2 ops x 4 shapes, then the second engine on 2 shapes per op, then 3 rounds of 3
  // finalists per op.
  EXPECT_EQ(j["runs"].get<int>(), 8 + 4 + 18);
}

TEST(TuneCliTest, RefusesBadTime) {
  TempDir dir;
  auto r = RunZinf("tune --path " + dir.path() + " --time -3", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--time"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
