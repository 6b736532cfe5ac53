// MakeOffloadRuntime: one config builds the engine, pool, swap file and tier manager it names.
#include "src/runtime/offload_runtime.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf {
namespace {

using zinf::testing::TempDir;

Config Load(const std::string& json) {
  auto c = Config::FromString(json, {.source_name = "test.json", .log_warnings = false});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config::Defaults();
}

TEST(OffloadRuntimeTest, BuildsWhatTheConfigNames) {
  TempDir dir;
  Config c = Load(fmt::format(R"({{
    "zero_optimization": {{"offload_optimizer": {{"device": "nvme", "nvme_path": "{}"}}}},
    "aio": {{"engine": "posix", "block_size": 262144, "queue_depth": 4}},
    "zinf": {{"budgets": {{"device_bytes": "4M", "pinned_bytes": "8M"}}, "prefetch_depth": 1}}
  }})", dir.path()));
  auto rt = MakeOffloadRuntime(c, {.swap_bytes = 16 << 20});
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  EXPECT_EQ((*rt)->engine->name(), "posix");
  EXPECT_EQ((*rt)->engine->options().queue_depth, 4u);
  EXPECT_EQ((*rt)->pool->budget_bytes(), 8u << 20);
  EXPECT_EQ((*rt)->device->budget_bytes(), 4u << 20);
  EXPECT_EQ((*rt)->swap->capacity(), 16u << 20);
  auto id = (*rt)->tiers->Register({.name = "w", .bytes = 1 << 20});
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto lease = (*rt)->tiers->Acquire(*id, offload::Tier::kDevice);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(lease->Wait().ok());
  ASSERT_TRUE((*rt)->tiers->Release(std::move(*lease), false).ok());
}

TEST(OffloadRuntimeTest, NoNvmeMeansNoEngine) {
  Config c = Load(R"({"zinf": {"budgets": {"device_bytes": "4M", "pinned_bytes": "4M"}}})");
  auto rt = MakeOffloadRuntime(c, {});
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  EXPECT_EQ((*rt)->engine, nullptr);
  auto nvme = (*rt)->tiers->Register({.name = "x", .bytes = 4096, .home = offload::Tier::kNvme});
  EXPECT_FALSE(nvme.ok());
}

TEST(OffloadRuntimeTest, MissingSwapDirectoryNamesTheField) {
  TempDir dir;
  Config c = Load(fmt::format(R"({{
    "zero_optimization": {{"offload_optimizer": {{"device": "nvme", "nvme_path": "{}/nope"}}}},
    "zinf": {{"budgets": {{"device_bytes": "4M", "pinned_bytes": "4M"}}}}
  }})", dir.path()));
  auto rt = MakeOffloadRuntime(c, {.swap_bytes = 1 << 20});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kNotFound);
  EXPECT_NE(rt.status().message().find("nvme_path"), std::string::npos) << rt.status().message();
  EXPECT_NE(rt.status().message().find("test.json"), std::string::npos);
}

TEST(OffloadRuntimeTest, ImpossiblePinnedBudgetIsRefusedAtStart) {
  Config c = Load(R"({"zinf": {"budgets": {"device_bytes": "4M", "pinned_bytes": "4096T"}}})");
  auto rt = MakeOffloadRuntime(c, {});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(rt.status().message().find("zinf.budgets.pinned_bytes"), std::string::npos)
      << rt.status().message();
}

TEST(OffloadRuntimeTest, AnUnknownEvictionPolicyIsRefusedNamingTheKeyAndTheChoices) {
  Config c = Load(R"({"zinf": {"budgets": {"device_bytes": "4M", "pinned_bytes": "4M"},
                               "eviction_policy": "fifo"}})");
  auto rt = MakeOffloadRuntime(c, {});
  ASSERT_FALSE(rt.ok());
  const std::string m(rt.status().message());
  EXPECT_NE(m.find("test.json: zinf.eviction_policy"), std::string::npos) << m;
  EXPECT_NE(m.find("\"belady\", \"lru\", \"cost\""), std::string::npos) << m;
  c = Load(R"({"zinf": {"budgets": {"device_bytes": "4M", "pinned_bytes": "4M"},
                        "eviction_policy": "cost"}})");
  EXPECT_TRUE(MakeOffloadRuntime(c, {}).ok());
}

}  // namespace
}  // namespace zinf
