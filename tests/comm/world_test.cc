// torchrun's environment contract: defaults, and every bad value named.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "src/comm/world.h"

namespace zinf::comm {
namespace {

Result<WorldEnv> Read(std::map<std::string, std::string> env) {
  return ReadWorldEnv([&](const char* n) -> const char* {
    auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(WorldEnvTest, NothingSetIsAWorldOfOne) {
  auto e = Read({});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->world, 1);
  EXPECT_EQ(e->rank, 0);
}

TEST(WorldEnvTest, EachLocalRankHasItsGpuSharedRoundRobinWhenTooFew) {
  WorldEnv e;
  e.world = e.local_world = 4;
  e.local_rank = 3;
  EXPECT_EQ(GpuOfRank(e, 4).ordinal, 3);
  EXPECT_FALSE(GpuOfRank(e, 4).shared);
  EXPECT_EQ(GpuOfRank(e, 8).ordinal, 3);
  EXPECT_EQ(GpuOfRank(e, 2).ordinal, 1);
  EXPECT_TRUE(GpuOfRank(e, 2).shared);
  EXPECT_EQ(GpuOfRank(e, 0).ordinal, 0);  // no GPU: the host device, no ordinal used
  EXPECT_FALSE(GpuOfRank(e, 0).shared);
  e.local_rank = 0;
  EXPECT_FALSE(GpuOfRank(e, 1).shared);
  EXPECT_STREQ(CommBackendName(CommBackend::kNccl), "nccl");
  EXPECT_STREQ(CommBackendName(CommBackend::kGloo), "gloo");
}

TEST(WorldEnvTest, ReadsTorchrunsVariables) {
  auto e = Read({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"},
                 {"ZINF_RUN_ID", "job7"}});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->world, 4);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->local_world, 2);
  EXPECT_EQ(e->master_addr, "node0");
  EXPECT_EQ(e->master_port, 29400);
  EXPECT_EQ(e->run_id, "job7");
  EXPECT_EQ(e->Describe(), "rank 3 of 4 (local 1 of 2), store node0:29400");
}

TEST(WorldEnvTest, BadValuesAreNamed) {
  struct Case {
    std::map<std::string, std::string> env;
    const char* want;
  } cases[] = {
      {{{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
      {{{"WORLD_SIZE", "2"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK=2 is not below WORLD_SIZE=2"},
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK='x': expected an integer"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE='0'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT='70000'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}, "LOCAL_RANK is not set"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, "LOCAL_RANK='2'"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", ""}}, "MASTER_ADDR is empty"},
  };
  for (const auto& c : cases) {
    auto e = Read(c.env);
    ASSERT_FALSE(e.ok()) << c.want;
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(e.status().message().find(c.want), std::string::npos) << e.status().message();
  }
}

TEST(WorldEnvTest, AWorldOfOneConnectsWithoutPeers) {
  auto c = Connect(WorldEnv{}, CommOptions{});
  ASSERT_TRUE(c.ok());
  float x = 2.5f, y = 0;
  EXPECT_TRUE((*c)->AllReduce(&x, DType::kF32, &y, DType::kF32, 1).Wait().ok());
  EXPECT_EQ(y, 2.5f);
  EXPECT_EQ((*c)->Describe(), "single rank");
}

}  // namespace
}  // namespace zinf::comm
