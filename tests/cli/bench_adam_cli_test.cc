// `zinf bench-adam` end to end: the JSON fields, and bad values refused with exit status 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;

TEST(BenchAdamCliTest, JsonHasTheStepAndTheMemoryProbes) {
  TempDir scratch;
  auto r = RunZinf("bench-adam --elements 1M --threads 1 --iters 2 --json", scratch.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"variant", "elements", "threads", "adam_gbps", "copy_gbps", "triad_gbps",
                        "ratio", "ns_per_element"}) {
    EXPECT_TRUE(j.contains(k)) << k << " missing in " << r.out;
  }
  EXPECT_EQ(j["elements"].get<uint64_t>(), 1u << 20);
  EXPECT_NEAR(j["ratio"].get<double>(),
              j["adam_gbps"].get<double>() / j["copy_gbps"].get<double>(), 1e-6);
}

TEST(BenchAdamCliTest, ASizeSweepRunsEachSize) {
  TempDir scratch;
  auto r = RunZinf("bench-adam --elements 16K,64K --threads 1 --iters 1 --json", scratch.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One JSON object per line, per size; small sizes time many calls per sample.
  const auto nl = r.out.find('\n');
  ASSERT_NE(nl, std::string::npos) << r.out;
  auto a = nlohmann::json::parse(r.out.substr(0, nl));
  auto b = nlohmann::json::parse(r.out.substr(nl + 1));
  EXPECT_EQ(a["elements"].get<uint64_t>(), 16u << 10);
  EXPECT_EQ(b["elements"].get<uint64_t>(), 64u << 10);
  EXPECT_EQ(a["calls_per_sample"].get<uint64_t>(), 1024u);
  r = RunZinf("bench-adam --elements 16K,64K --threads 1 --iters 1", scratch.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("size sweep"), std::string::npos) << r.out;
  r = RunZinf("bench-adam --elements 16K,,1M", scratch.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--elements '16K,,1M'"), std::string::npos) << r.err;
}

TEST(BenchAdamCliTest, BadValuesExitTwo) {
  TempDir scratch;
  EXPECT_EQ(RunZinf("bench-adam --variant avx3", scratch.path()).exit_code, 2);
  EXPECT_EQ(RunZinf("bench-adam --grad fp8", scratch.path()).exit_code, 2);
  auto r = RunZinf("bench-adam --no-such-flag", scratch.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no-such-flag"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
