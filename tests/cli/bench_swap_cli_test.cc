// `zinf bench-swap` end to end on a small state: the JSON fields and the budget it keeps.
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;

TEST(BenchSwapCliTest, ReportsTheStepAgainstItsBounds) {
  TempDir dir, scratch;
  auto r = RunZinf("bench-swap --path " + dir.path() +
                       " --params 2M --units 16 --pinned-budget 8M --steps 2 --qd 8 --json"
                       " --trace " + scratch / "trace.json",
                   scratch.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream trace_in(scratch / "trace.json");
  auto trace = nlohmann::json::parse(trace_in);
  std::set<std::string> tracks;
  for (auto& e : trace["traceEvents"]) {
    if (e["name"] == "thread_name") tracks.insert(e["args"]["name"].get<std::string>());
  }
  for (const char* t : {"nvme read", "nvme write", "adam", "adam worker 0", "h2d"}) {
    EXPECT_TRUE(tracks.count(t)) << "no track " << t;
  }
  auto j = nlohmann::json::parse(r.out);
  for (const char* k : {"state_bytes", "pinned_budget_bytes", "peak_pinned_bytes", "step_seconds",
                        "io_bound_seconds", "adam_bound_seconds", "step_over_bound",
                        "stall_seconds", "prefetch_hits", "prefetch_misses"}) {
    EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_GE(j["state_bytes"].get<double>(), 3.0 * j["pinned_budget_bytes"].get<double>());
  EXPECT_LE(j["peak_pinned_bytes"].get<uint64_t>(), j["pinned_budget_bytes"].get<uint64_t>());
  EXPECT_GT(j["step_seconds"].get<double>(), 0);
  double bound = std::max(j["io_bound_seconds"].get<double>(), j["adam_bound_seconds"].get<double>());
  EXPECT_NEAR(j["step_over_bound"].get<double>(), j["step_seconds"].get<double>() / bound, 1e-9);
  // Nothing is left behind in the swap directory.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(BenchSwapCliTest, RefusesSlabsLargerThanTheBudget) {
  TempDir dir;
  auto r = RunZinf("bench-swap --path " + dir.path() + " --params 64M --units 2 --pinned-budget 8M",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("pinned"), std::string::npos) << r.err;
}

TEST(BenchSwapCliTest, TakesSettingsFromAConfigAndRefusesTypos) {
  TempDir dir, scratch;
  std::string good = scratch / "good.json";
  std::ofstream(good) << R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
      "nvme_path": ")" << dir.path() << R"("}}, "aio": {"queue_depth": 4, "engine": "posix"},
      "zinf": {"budgets": {"pinned_bytes": "8M"}, "pipeline_depth": 1}})";
  auto r = RunZinf("bench-swap --config " + good + " --params 2M --units 16 --steps 1 --json",
                   scratch.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["engine"], "posix");
  EXPECT_EQ(j["pipeline_depth"], 2);
  EXPECT_EQ(j["pinned_budget_bytes"], 8u << 20);
  std::string typo = scratch / "typo.json";
  std::ofstream(typo) << R"({"zero_optimization": {"offload_optimzer": {"device": "nvme"}}})";
  r = RunZinf("bench-swap --config " + typo, scratch.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("offload_optimizer"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(typo), std::string::npos) << r.err;
  // A DeepSpeed key zinf does not implement: a warning, or an error with --strict.
  std::string unimpl = scratch / "unimpl.json";
  std::ofstream(unimpl) << R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
      "nvme_path": ")" << dir.path() << R"("}, "overlap_comm": true},
      "zinf": {"budgets": {"pinned_bytes": "8M"}}})";
  r = RunZinf("bench-swap --config " + unimpl + " --strict --params 2M --units 16", scratch.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("overlap_comm"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
