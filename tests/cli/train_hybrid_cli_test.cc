// HYBRID_SHARD across nodes (`zinf.sharding_strategy`): ZeRO-3 within each node, the state
// replicated across nodes (each node's ranks hold one copy; the gradient chunks all-reduced
// across the nodes). Two "nodes" of two ranks on this machine: one `zinf launch --nproc 4`
// whose ranks are told LOCAL_WORLD_SIZE=2 and LOCAL_RANK=RANK%2, as torchrun numbers two nodes.
// The run trains as one rank with the same global batch (the losses to float noise: the sums
// associate as (m0 + m1) + (m2 + m3)), holds the state of a node's share (12Ψ/2 a rank, not
// 12Ψ/4), and its checkpoints resume bit for bit, export, and re-partition onto one node.
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/cli/rank_cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using namespace zinf::testing::train_cli;
using testing::RunZinf;
using testing::TempDir;
using namespace zinf::testing::ranks;

// Four ranks as two nodes of two, up to `zinf`'s arguments (appended after the prefix).
std::string TwoNodesOfTwo() {
  return LaunchPrefix(4) + "sh -c 'LOCAL_WORLD_SIZE=2 LOCAL_RANK=$((RANK % 2)) exec " +
         ZINF_BINARY + " \"$@\"' zinf ";
}

std::string Hybrid(const TempDir& dir) {
  const std::string path = dir / "hybrid.json";
  std::ofstream(path) << R"({"zinf": {"sharding_strategy": "HYBRID_SHARD",
                                     "comm": {"check_sequence": true}}})";
  return " --config " + path;
}

nlohmann::json Summary(const std::string& path) {
  std::ifstream s(path);
  return nlohmann::json::parse(s, nullptr, false);
}

void ExpectLossesNear(const std::vector<std::string>& got, const std::vector<std::string>& want,
                      double rel) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = nlohmann::json::parse(got[i])["loss"];
    const double b = nlohmann::json::parse(want[i])["loss"];
    EXPECT_NEAR(a, b, rel * std::abs(b)) << "step " << i + 1;
  }
}

TEST(HybridShardTest, TwoNodesOfTwoTrainAsOneRankHoldingANodesShare) {
  TempDir dir;
  const std::string job = Tiny(4) + Hybrid(dir) + " --offload nvme --clip 0";
  auto one = RunZinf(job + " --grad-accum 4 --swap-dir " + dir / "sw1" + " --losses " +
                         dir / "one.jsonl" + " --summary-json " + dir / "one.json",
                     dir.path());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  auto four = RunZinf(TwoNodesOfTwo() + job + " --grad-accum 1 --swap-dir " + dir / "sw4" +
                          " --losses " + dir / "four.jsonl" + " --summary-json " +
                          dir / "four.json",
                      dir.path());
  ASSERT_EQ(four.exit_code, 0) << four.out << four.err;
  // Without the all-reduce across nodes each node would step on its half of the batch.
  ExpectLossesNear(LossRecords({dir / "four.jsonl"}), LossRecords({dir / "one.jsonl"}), 1e-5);
  const nlohmann::json s = Summary(dir / "four.json");
  EXPECT_EQ(s.value("world", 0), 4);
  EXPECT_NE(s.value("transport", std::string()).find("HYBRID_SHARD: 2 nodes of 2 ranks"),
            std::string::npos) << s.dump();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(dir / ("sw4/rank" + std::to_string(r))));
  // Rank 0 holds half of the state, the 16-bit weights and the gradients (its node's share),
  // give or take a parameter a unit.
  const double params = s["params"], units = 4;
  const double state = s["optimizer_state_bytes"], p16 = s["param16_bytes"],
               grads = s["gradient_bytes"];
  EXPECT_GE(state, 12 * (params / 2 - units));
  EXPECT_LE(state, 12 * (params / 2 + units));
  EXPECT_GE(p16, 2 * params / 2);
  EXPECT_LE(p16, 2 * params / 2 + 2 * units);
  EXPECT_GE(grads, 4 * params / 2);
  EXPECT_LE(grads, 4 * params / 2 + 4 * 2 * units);
  // The gradients on the wire: each micro-batch's bf16 values reduce-scattered within the node
  // (2 bytes x Ψ x 1/2) and the fp32 chunk all-reduced across the 2 nodes (2 x 1/2 of 4 bytes
  // x Ψ/2): 3Ψ bytes, chunks padded to equal sizes.
  const double grad_sent = s["grad_comm_sent_bytes_per_step"];
  EXPECT_GE(grad_sent, 3 * params);
  EXPECT_LE(grad_sent, 3 * (params + 2 * units));
}

// Checkpoints every 2 steps, stopped after 4, resumed to 6 on the same two nodes: bit for bit
// the uninterrupted run; the manifest records 2 chunks of 4 parts, export consolidates them into
// the run's --save. The same checkpoint resumed on one node of 2 ranks (FULL_SHARD there) is
// re-partitioned from parts 0 and 1 and ends as the two nodes do, to float noise.
TEST(HybridShardTest, CheckpointsResumeBitwiseExportAndMoveToOneNode) {
  TempDir dir;
  const std::string job = Tiny(6) + Hybrid(dir) + " --offload cpu --clip 0";
  auto ref = RunZinf(TwoNodesOfTwo() + job + " --losses " + dir / "ref.jsonl" + " --save " +
                         dir / "ref.safetensors",
                     dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string root = dir / "ckpt";
  auto first = RunZinf(TwoNodesOfTwo() + job + " --checkpoint-dir " + root +
                           " --checkpoint-every 2 --keep-checkpoints 2 --stop-after 4 --losses " +
                           dir / "a.jsonl",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const fs::path step4 = fs::path(root) / "step-0000000004";
  auto global = nlohmann::json::parse(ReadFile(step4 / "manifest.json"));
  EXPECT_EQ(global["world"]["size"], 4);
  EXPECT_EQ(global["world"]["partition"], "unit-chunks");
  EXPECT_EQ(global["world"]["chunks"], 2);
  EXPECT_EQ(global["parts"].size(), 4u);
  // The ranks of node 1 hold what node 0's hold.
  for (int r : {0, 1}) {
    auto mine = nlohmann::json::parse(ReadFile(step4 / ("rank" + std::to_string(r)) /
                                               "manifest.json"));
    auto replica = nlohmann::json::parse(ReadFile(step4 / ("rank" + std::to_string(r + 2)) /
                                                  "manifest.json"));
    ASSERT_EQ(mine["shards"].size(), replica["shards"].size());
    for (size_t i = 0; i < mine["shards"].size(); ++i) {
      EXPECT_EQ(mine["shards"][i]["xxh64"], replica["shards"][i]["xxh64"]) << r << " " << i;
    }
  }

  auto second = RunZinf(TwoNodesOfTwo() + "train --resume " + root + " --losses " +
                            dir / "b.jsonl" + " --save " + dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("(resumed from step 4)"), std::string::npos) << second.out;
  EXPECT_EQ(LossRecords({dir / "a.jsonl", dir / "b.jsonl"}), LossRecords({dir / "ref.jsonl"}));
  const std::string weights = ReadFile(dir / "ref.safetensors");
  ASSERT_FALSE(weights.empty());
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == weights) << "final weights differ";
  auto exp = RunZinf("ckpt export " + root + " --out " + dir / "x.safetensors", dir.path());
  ASSERT_EQ(exp.exit_code, 0) << exp.out << exp.err;
  EXPECT_TRUE(ReadFile(dir / "x.safetensors") == weights) << "the export differs from --save";
  auto inspect = RunZinf("ckpt inspect " + root, dir.path());
  EXPECT_NE(inspect.out.find("unit-chunks in 2 chunks"), std::string::npos) << inspect.out;

  // Step 4's checkpoint on one node of two ranks: the global batch kept (2 micro-batches a rank).
  auto moved = RunZinf(Launch(2) + "train --resume " + (step4.string()) + " --checkpoint-dir " +
                           dir / "ckpt2" + " --losses " + dir / "c.jsonl",
                       dir.path());
  ASSERT_EQ(moved.exit_code, 0) << moved.out << moved.err;
  EXPECT_NE((moved.out + moved.err).find("re-partitioning"), std::string::npos) << moved.out;
  ExpectLossesNear(LossRecords({dir / "a.jsonl", dir / "c.jsonl"}),
                   LossRecords({dir / "ref.jsonl"}), 1e-5);
}

// As two machines would run it: one `zinf launch --nnodes 2 --node-rank K` on each "node"
// (two launches here), the same command on both.
TEST(HybridShardTest, TwoLaunchesAsTwoNodes) {
  TempDir dir;
  const std::string port = std::to_string(FreePort());
  const std::string common = " --nproc 2 --nnodes 2 --master-port " + port +
                             " --run-id hybrid -- " + ZINF_BINARY + " " + Tiny(3) + Hybrid(dir) +
                             " --offload cpu --summary-json " + dir / "s.json";
  fs::create_directories(dir / "n1");
  testing::CommandResult node1;
  std::thread t([&] { node1 = RunZinf("launch --node-rank 1" + common, dir / "n1"); });
  auto node0 = RunZinf("launch --node-rank 0" + common, dir.path());
  t.join();
  ASSERT_EQ(node0.exit_code, 0) << node0.out << node0.err;
  ASSERT_EQ(node1.exit_code, 0) << node1.out << node1.err;
  EXPECT_NE(node0.out.find("HYBRID_SHARD: 2 nodes of 2 ranks"), std::string::npos) << node0.out;
  EXPECT_EQ(Summary(dir / "s.json").value("world", 0), 4);
}

}  // namespace
}  // namespace zinf
