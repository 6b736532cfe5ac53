// The training run's rank helpers (src/train/ranks.h) over threads as ranks: the global mean of
// the ranks' micro-batch losses, a stop any rank asks for, each rank's swap directories, and a
// config every rank must share.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "src/train/ranks.h"
#include "tests/comm/comm_test_util.h"

namespace zinf::train {
namespace {

using comm::testing::LocalWorld;
using comm::testing::OnThreads;

// A world of ranks whose communicators come from a LocalWorld.
std::vector<Ranks> MakeRanks(LocalWorld& lw) {
  std::vector<Ranks> out(lw.comms.size());
  for (size_t r = 0; r < out.size(); ++r) {
    out[r].env.rank = int(r);
    out[r].env.world = int(out.size());
    out[r].comm = std::move(lw.comms[r]);
  }
  return out;
}

// Each rank's GPU and link: LOCAL_RANK's GPU for the device, NCCL only with a GPU a rank.
TEST(RanksTest, NcclIsRefusedWithoutAGpuARankAndGlooSharesThem) {
  comm::WorldEnv env;
  env.rank = 5;
  env.world = 6;
  env.local_rank = 2;
  env.local_world = 3;
  Config gloo = Config::Defaults();
  gloo.source = "job.json";
  Config nccl = gloo;
  nccl.zinf.comm.backend = "nccl";
  CudaProbe three{.built_with_cuda = true, .device_count = 3}, two = three, none = three;
  two.device_count = 2;
  none.device_count = 0;
  none.detail = "no driver";
  int ordinal = -1;

  auto link = RankLink(env, gloo, two, &ordinal);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  EXPECT_EQ(link->backend, comm::CommBackend::kGloo);
  EXPECT_EQ(ordinal, 0);  // local rank 2 of 3 on 2 GPUs: shares GPU 0

  link = RankLink(env, nccl, three, &ordinal);
  ASSERT_TRUE(link.ok()) << link.status().ToString();
  EXPECT_EQ(link->backend, comm::CommBackend::kNccl);
  EXPECT_EQ(link->cuda_ordinal, 2);
  EXPECT_EQ(ordinal, 2);

  link = RankLink(env, nccl, two, &ordinal);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find(
                "job.json: zinf.comm.backend \"nccl\" needs a GPU a rank: rank 5 is LOCAL_RANK 2 "
                "but this node has 2 GPU(s) (NCCL refuses two ranks on one GPU)"),
            std::string::npos)
      << link.status().ToString();

  link = RankLink(env, nccl, none, &ordinal);
  ASSERT_FALSE(link.ok());
  EXPECT_NE(link.status().message().find("no GPU answers on rank 5 (no driver); use \"gloo\""),
            std::string::npos)
      << link.status().ToString();
}

TEST(RanksTest, MeanLossIsTheOneRankMeanInGlobalOrder) {
  const std::vector<double> losses = {4.1, 3.7, 5.3, 2.9, 4.4, 3.3};  // 3 ranks x 2
  double one = 0;
  for (double l : losses) one += l / 6.0;
  LocalWorld lw(3);
  auto ranks = MakeRanks(lw);
  std::vector<double> got(3);
  OnThreads(3, [&](int r) {
    auto m = MeanLoss(ranks[size_t(r)], std::span(losses).subspan(size_t(r) * 2, 2));
    ASSERT_TRUE(m.ok());
    got[size_t(r)] = *m;
  });
  for (double g : got) EXPECT_EQ(std::memcmp(&g, &one, sizeof(double)), 0);
  Ranks solo;
  auto m = MeanLoss(solo, std::span(losses));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, one);
}

TEST(RanksTest, AStopAnyRankAsksForStopsThemAll) {
  LocalWorld lw(3);
  auto ranks = MakeRanks(lw);
  std::vector<int> got(3, -1);
  OnThreads(3, [&](int r) {
    auto a = AnyRank(ranks[size_t(r)], r == 2);
    ASSERT_TRUE(a.ok());
    got[size_t(r)] = *a;
  });
  EXPECT_EQ(got, (std::vector<int>{1, 1, 1}));
  OnThreads(3, [&](int r) { EXPECT_FALSE(*AnyRank(ranks[size_t(r)], false)); });
}

TEST(RanksTest, EachRankHasItsOwnSwapDirectories) {
  Config c;
  c.zero.offload_optimizer.nvme_path = "/nvme/a";
  c.zinf.swap_dir = "/nvme/swap";
  c.zinf.stripe_paths = {"/d1", "/d2"};
  const Config r = PerRankPaths(c, 3);
  EXPECT_EQ(r.zero.offload_optimizer.nvme_path, "/nvme/a/rank3");
  EXPECT_EQ(r.zero.offload_param.nvme_path, "");
  EXPECT_EQ(r.zinf.swap_dir, "/nvme/swap/rank3");
  EXPECT_EQ(r.zinf.stripe_paths, (std::vector<std::string>{"/d1/rank3", "/d2/rank3"}));
}

TEST(RanksTest, ADifferentConfigOnOneRankFailsEveryRank) {
  LocalWorld lw(2);
  auto ranks = MakeRanks(lw);
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    Config c;
    c.optimizer.lr = r == 0 ? 1e-3 : 2e-3;
    got[size_t(r)] = CheckRanksAgree(ranks[size_t(r)], c, {.steps = 10});
  });
  for (const Status& s : got) {
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("the ranks disagree on the training job"), std::string::npos);
  }
  std::vector<Status> same(2);
  LocalWorld lw2(2);
  auto ranks2 = MakeRanks(lw2);
  OnThreads(2, [&](int r) { same[size_t(r)] = CheckRanksAgree(ranks2[size_t(r)], Config{}, {}); });
  EXPECT_TRUE(same[0].ok() && same[1].ok());
}

}  // namespace
}  // namespace zinf::train
