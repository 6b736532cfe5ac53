// `zinf launch --nproc N -- zinf train` over Gloo between processes, with
// zero_optimization.stage 0 (state replicated, gradients all-reduced), 1 (optimizer state
// partitioned, gradients reduce-scattered, new weights all-gathered), 2 (gradients partitioned
// too) and 3 (the 16-bit weights too, gathered before each use): the same global batch
// trained by one rank and by 2, 3 or 4 ranks, compared bit for bit (final weights, losses,
// gradient norms) where the arithmetic allows; the state held per rank and the bytes on the
// wire against the ZeRO formulas; and the failures: a rank given another config, a wrong world
// size, a rank killed mid-run, what cannot run across ranks.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "src/base/cuda_probe.h"
#include "tests/cli/cli_util.h"
#include "tests/cli/rank_cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::RunZinf;
using testing::TempDir;
using namespace zinf::testing::ranks;

// The losses file without the step times and NVMe bytes.
std::string Losses(const std::string& path) {
  std::string out;
  for (const auto& line : Lines(ReadFile(path))) {
    auto j = nlohmann::json::parse(line);
    j.erase("seconds");  // and what the step moved: a resumed or sharded run differs there
    j.erase("nvme_read_bytes");
    j.erase("nvme_write_bytes");
    out += j.dump() + "\n";
  }
  return out;
}

struct TrainRun {
  testing::CommandResult r;
  std::string weights, losses;
  nlohmann::json summary;
};

// save: --save the final weights (GPT-2's nanoGPT-named file; a Llama run has none yet).
TrainRun Train(const TempDir& dir, const std::string& name, const std::string& prefix,
          const std::string& args, bool save = true) {
  std::filesystem::create_directories(dir / name);
  const std::string base = dir / name;
  TrainRun run;
  run.r = RunZinf(prefix + args + (save ? " --save " + base + "/w.safetensors" : "") +
                      " --losses " + base + "/l.jsonl --summary-json " + base + "/s.json",
                  base);
  run.weights = ReadFile(base + "/w.safetensors");
  run.losses = Losses(base + "/l.jsonl");
  std::ifstream s(base + "/s.json");
  if (s) run.summary = nlohmann::json::parse(s, nullptr, false);
  return run;
}

std::string Stage1(const TempDir& dir) {
  const std::string path = dir / "stage1.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 1}})";
  return " --config " + path;
}

std::string Stage2(const TempDir& dir) {
  const std::string path = dir / "stage2.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 2}})";
  return " --config " + path;
}

// A stage by FSDP's name.
std::string Preset(const TempDir& dir, const std::string& name) {
  const std::string path = dir / (name + ".json");
  std::ofstream(path) << R"({"zinf": {"sharding_strategy": ")" << name << R"("}})";
  return " --config " + path;
}

std::string Stage3(const TempDir& dir) {
  const std::string path = dir / "stage3.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 3}})";
  return " --config " + path;
}

std::string Stage0(const TempDir& dir) {
  const std::string path = dir / "stage0.json";
  std::ofstream(path) << R"({"zero_optimization": {"stage": 0}})";
  return " --config " + path;
}

// One rank accumulating N micro-batches against N ranks of one each: the rank-ordered sum of
// the ranks' gradients is the accumulator's sum, so everything is equal bit for bit — with the
// state in memory and on NVMe, with the optimizer overlapping backward, and in fp16.
TEST(TrainRanksCliTest, RanksTrainBitForBitAsOneRank) {
  TempDir dir;
  const std::string f16 = dir / "f16.json";
  // FSDP's NO_SHARD is stage 0; the sequence of collectives checked on every one.
  std::ofstream(f16) << R"({"zinf": {"sharding_strategy": "NO_SHARD",
                                     "comm": {"check_sequence": true}},
                            "fp16": {"enabled": true}})";
  struct Case {
    const char* name;
    int world;
    std::string extra;
  } cases[] = {
      {"cpu2", 2, Stage0(dir) + " --offload cpu"},
      {"nvme4", 4, Stage0(dir) + " --offload nvme"},
      {"overlap2", 2, Stage0(dir) + " --offload nvme --overlap-adam"},
      {"fp16_2", 2, " --config " + f16 + " --offload cpu"},
  };
  for (const Case& c : cases) {
    const std::string w = std::to_string(c.world);
    TrainRun one = Train(dir, std::string(c.name) + "_one", "",
                    Tiny(4) + c.extra + " --swap-dir " + dir / "sw1" + " --grad-accum " + w);
    TrainRun many = Train(dir, std::string(c.name) + "_many", Launch(c.world),
                     Tiny(4) + c.extra + " --swap-dir " + dir / "swN" + " --grad-accum 1");
    ASSERT_EQ(one.r.exit_code, 0) << c.name << one.r.err;
    ASSERT_EQ(many.r.exit_code, 0) << c.name << many.r.out << many.r.err;
    EXPECT_FALSE(one.weights.empty());
    EXPECT_TRUE(one.weights == many.weights) << c.name << ": final weights differ";
    EXPECT_EQ(one.losses, many.losses) << c.name;
    EXPECT_EQ(many.summary.value("world", 0), c.world) << c.name;
    EXPECT_EQ(many.summary["tokens_per_step"], one.summary["tokens_per_step"]) << c.name;
    EXPECT_NE(many.r.out.find("[rank 0] done: 4 steps"), std::string::npos) << many.r.out;
    EXPECT_EQ(many.r.out.find("[rank 1] done"), std::string::npos) << "rank 0 reports alone";
    if (std::string(c.name) == "nvme4") {
      for (int r = 0; r < 4; ++r)
        EXPECT_TRUE(std::filesystem::exists(dir / ("swN/rank" + std::to_string(r))));
    }
  }
}

// The Llama family through the same ranks (untied head, grouped-query attention): ZeRO-1 with
// the state in memory and ZeRO-3 with it on NVMe, 2 ranks of one micro-batch against one rank
// accumulating two, the losses and gradient norms bit for bit.
TEST(TrainRanksCliTest, LlamaTrainsBitForBitAsOneRank) {
  TempDir dir;
  const std::string llama = " --arch llama --kv-heads 2 --intermediate 48 --clip 0";
  for (const auto& [name, extra] :
       {std::pair{"z1cpu", Stage1(dir) + " --offload cpu"},
        std::pair{"z3nvme", Stage3(dir) + " --offload nvme"}}) {
    TrainRun one = Train(dir, std::string(name) + "_one", "",
                         Tiny(4) + llama + extra + " --swap-dir " + dir / "sw1" +
                             " --grad-accum 2", /*save=*/false);
    TrainRun two = Train(dir, std::string(name) + "_two", Launch(2),
                         Tiny(4) + llama + extra + " --swap-dir " + dir / "sw2" +
                             " --grad-accum 1", /*save=*/false);
    ASSERT_EQ(one.r.exit_code, 0) << name << one.r.err;
    ASSERT_EQ(two.r.exit_code, 0) << name << two.r.out << two.r.err;
    ASSERT_EQ(Lines(one.losses).size(), 4u) << name;
    EXPECT_EQ(one.losses, two.losses) << name;
    EXPECT_EQ(two.summary.value("world", 0), 2) << name;
    EXPECT_NE(one.r.err.find("llama: 2 layers"), std::string::npos) << one.r.err;
  }
}

// Two micro-batches on each of two ranks against four on one: the ranks' sums are added in
// another association ((m0 + m1) + (m2 + m3) instead of ((m0 + m1) + m2) + m3). Sums of a few
// bf16 values are exact in fp32 unless their exponents differ by more than 15, so the results
// agree here to float32 noise at most; the bound checks the losses.
TEST(TrainRanksCliTest, AccumulationOnEachRankAgreesWithOneRank) {
  TempDir dir;
  // Stage 0 sums each rank's accumulated gradient; ZeRO-2 reduces every micro-batch and each
  // rank accumulates its chunk of the sums: ((m0 + m2) + (m1 + m3)).
  for (const std::string& stage : {Stage0(dir), Stage2(dir)}) {
    TrainRun one = Train(dir, "one", "", Tiny(4) + stage + " --offload cpu --grad-accum 4");
    TrainRun two = Train(dir, "two", Launch(2), Tiny(4) + stage + " --offload cpu --grad-accum 2");
    ASSERT_EQ(one.r.exit_code, 0) << one.r.err;
    ASSERT_EQ(two.r.exit_code, 0) << two.r.err;
    const auto a = Lines(one.losses), b = Lines(two.losses);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      const double la = nlohmann::json::parse(a[i])["loss"];
      const double lb = nlohmann::json::parse(b[i])["loss"];
      EXPECT_NEAR(la, lb, 1e-5 * std::abs(la)) << stage << " step " << i + 1;
    }
  }
}

// An all-reduce sends 2(N-1)/N of the vector per rank: for 2 ranks, the fp32 gradients once.
TEST(TrainRanksCliTest, GradientWireBytesAreTwoPsiOverN) {
  TempDir dir;
  TrainRun two = Train(dir, "two", Launch(2), Tiny(3) + Stage0(dir) + " --offload cpu");
  ASSERT_EQ(two.r.exit_code, 0) << two.r.err;
  const double params = two.summary["params"];
  EXPECT_EQ(two.summary["grad_comm_sent_bytes_per_step"].get<double>(), 4 * params);
  // Everything else on the wire (the losses, the stop flags) is a few bytes a step.
  EXPECT_LT(two.summary["comm_sent_bytes_per_step"].get<double>(), 4 * params + 256);
  EXPECT_NE(two.r.out.find("2 ranks over gloo tcp"), std::string::npos) << two.r.out;
}

// ZeRO-1 and ZeRO-2: each rank steps its chunk of every unit (ZeRO-2 also keeps only its chunk
// of the gradients). Adam is elementwise and the reduce-scatter sums in rank order, so without
// clipping the run is one rank's bit for bit (uneven chunks with 3 ranks, state on NVMe and in
// memory, bf16 moments rounded stochastically too). With clipping the global norm is the ranks'
// partial sums added, not one sum over whole units: its last bits differ (it is reported
// within 1e-12), the coefficient with them, and the losses agree to float noise (1e-6).
TEST(TrainRanksCliTest, Zero1And2And3TrainAsOneRank) {
  TempDir dir;
  struct Case {
    const char* name;
    int world;
    int stage;
    std::string extra;
    const char* preset = nullptr;  // FSDP's name for the stage
  } cases[] = {{"z1cpu2", 2, 1, " --offload cpu --clip 0"},
               {"z1nvme3", 3, 1, " --offload nvme --clip 0"},
               {"z2cpu2", 2, 2, " --offload cpu --clip 0"},
               {"z2nvme4", 4, 2, " --offload nvme --clip 0"},
               {"z3cpu2", 2, 3, " --offload cpu --clip 0"},
               {"z3nvme3", 3, 3, " --offload nvme --clip 0"},
               {"z3nvme4_full_shard", 4, 3, " --offload nvme --clip 0", "FULL_SHARD"},
               {"z3hybrid_one_node", 2, 3, " --offload cpu --clip 0", "HYBRID_SHARD"},
               {"z2shard_grad_op", 2, 2, " --offload cpu --clip 0", "SHARD_GRAD_OP"},
               {"z3fp16cpu2", 2, 3, " --offload cpu --clip 0 --precision fp16"},
               // Part of each rank's state in memory (--host-budget: final's and block1's
               // chunks), the rest on NVMe.
               {"z1mixed2", 2, 1, " --offload nvme --clip 0 --host-budget 80K"},
               {"z3mixed2", 2, 3, " --offload nvme --clip 0 --host-budget 80K"},
               // bf16 moments rounded stochastically: each chunk draws from its offset in the
               // unit, so the ranks round as one rank does (uneven chunks, memory and NVMe).
               {"z1bf16cpu3", 3, 1, " --offload cpu --clip 0 --optimizer-state-dtype bf16"},
               {"z2bf16nvme2", 2, 2, " --offload nvme --clip 0 --optimizer-state-dtype bf16"},
               // zinf.overlap_adam: each unit's chunk steps during the last backward (one rank
               // overlaps too): NVMe and memory, every partitioned stage.
               {"z1overlap_nvme2", 2, 1, " --offload nvme --clip 0 --overlap-adam"},
               {"z2overlap_cpu2", 2, 2, " --offload cpu --clip 0 --overlap-adam"},
               {"z3overlap_nvme3", 3, 3, " --offload nvme --clip 0 --overlap-adam"}};
  // The tiny model: units embedding (V x C + T x C), 2 blocks (12 C^2 + 13 C), final (2 C).
  constexpr double kC = 32, kBlock = 12 * kC * kC + 13 * kC;
  for (const Case& c : cases) {
    const std::string w = std::to_string(c.world);
    const std::string stage = c.preset != nullptr ? Preset(dir, c.preset)
                              : c.stage == 1      ? Stage1(dir)
                              : c.stage == 2      ? Stage2(dir)
                                                  : Stage3(dir);
    TrainRun one = Train(dir, std::string(c.name) + "_one", "",
                         Tiny(4) + stage + c.extra + " --swap-dir " + dir / "sw1" +
                             " --grad-accum " + w);
    TrainRun many = Train(dir, std::string(c.name) + "_many", Launch(c.world),
                          Tiny(4) + stage + c.extra + " --swap-dir " + dir / "swN" +
                              " --grad-accum 1");
    ASSERT_EQ(one.r.exit_code, 0) << c.name << one.r.err;
    ASSERT_EQ(many.r.exit_code, 0) << c.name << many.r.out << many.r.err;
    EXPECT_TRUE(one.weights == many.weights) << c.name << ": final weights differ";
    // The losses bit for bit; the reported norm (not used without clipping) to its last bits.
    const auto a = Lines(one.losses), b = Lines(many.losses);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      auto ja = nlohmann::json::parse(a[i]), jb = nlohmann::json::parse(b[i]);
      const double na = ja["grad_norm"], nb = jb["grad_norm"];
      EXPECT_NEAR(na, nb, 1e-12 * na) << c.name << " step " << i + 1;
      ja.erase("grad_norm");
      jb.erase("grad_norm");
      EXPECT_EQ(ja, jb) << c.name << " step " << i + 1;
    }
    // Rank 0 holds its chunk of the state: 12 bytes a parameter over the world, give or take
    // a parameter a unit.
    const double params = many.summary["params"], units = 4;
    const double state = many.summary["optimizer_state_bytes"];
    const double per_param = c.extra.find("bf16") != std::string::npos ? 8 : 12;
    EXPECT_GE(state, per_param * (params / c.world - units)) << c.name;
    EXPECT_LE(state, per_param * (params / c.world + units)) << c.name;
    EXPECT_EQ(one.summary["optimizer_state_bytes"].get<double>(), per_param * params);
    // On the wire: the gradients reduce-scattered (ZeRO-1: the fp32 sums once a step; ZeRO-2
    // and 3: each micro-batch's 16-bit values) and the 16-bit weights all-gathered, (world - 1)
    // / world of each (chunks padded to equal sizes): 2Ψ elements, as the ZeRO paper counts.
    // ZeRO-3 gathers the weights before each unit's forward and the blocks' again before their
    // backward (the embedding and final units are still on the device then): 3Ψ less those.
    const double gb = c.stage == 1 ? 4 : 2;
    const double grad_sent = many.summary["grad_comm_sent_bytes_per_step"];
    const double share = double(c.world - 1) / c.world;
    EXPECT_GE(grad_sent, gb * params * share) << c.name;
    EXPECT_LE(grad_sent, gb * (params + c.world * units) * share) << c.name;
    const double gathered = c.stage == 3 ? params + 2 * kBlock : params;
    const double sent = many.summary["comm_sent_bytes_per_step"];
    EXPECT_GE(sent, (gb * params + 2 * gathered) * share) << c.name;
    EXPECT_LE(sent, (gb * params + 2 * gathered + 3 * 2 * c.world * units) * share + 256)
        << c.name;
    // The gradients held: the unit's fp32 values (ZeRO-1, padded) or the chunk's (ZeRO-2, 3).
    const double grads = many.summary["gradient_bytes"];
    const double want = c.stage == 1 ? 4 * params : 4 * params / c.world;
    EXPECT_GE(grads, want) << c.name;
    EXPECT_LE(grads, want + 4 * c.world * units) << c.name;
    // The 16-bit weights held: the whole model's, or with ZeRO-3 the rank's chunks (2 bytes a
    // parameter / world): with the gradients and state, 18Ψ/N per rank (fp32 gradients).
    const double p16 = many.summary["param16_bytes"];
    const double want16 = c.stage == 3 ? 2 * params / c.world : 2 * params;
    EXPECT_GE(p16, want16) << c.name;
    EXPECT_LE(p16, want16 + 2 * units) << c.name;
    EXPECT_EQ(one.summary["param16_bytes"].get<double>(), 2 * params) << c.name;
    // The swap file a rank reserves holds only its share (sizing.h's formula, tested there):
    // less than one rank's, which holds the whole model.
    if (c.extra.find("nvme") != std::string::npos) {
      const double swap = many.summary["swap_file_bytes"];
      EXPECT_GT(swap, 0) << c.name;
      EXPECT_LT(swap, one.summary["swap_file_bytes"].get<double>()) << c.name;
    }
  }
  TrainRun one = Train(dir, "clip_one", "", Tiny(4) + Stage1(dir) + " --offload cpu --grad-accum 2");
  TrainRun two = Train(dir, "clip_two", Launch(2), Tiny(4) + Stage1(dir) + " --offload cpu");
  ASSERT_EQ(two.r.exit_code, 0) << two.r.err;
  const auto a = Lines(one.losses), b = Lines(two.losses);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double la = nlohmann::json::parse(a[i])["loss"], lb = nlohmann::json::parse(b[i])["loss"];
    EXPECT_NEAR(la, lb, 1e-6 * std::abs(la)) << "step " << i + 1;
  }
}

// --profile across ranks measures the step's collectives alone too (every rank times them;
// rank 0 reports), and they count toward the bound; the run's own wire bytes exclude them.
TEST(TrainRanksCliTest, ProfileMeasuresTheCollectivesAlone) {
  TempDir dir;
  for (int stage : {0, 3}) {
    const std::string name = "profile" + std::to_string(stage);
    TrainRun plain = Train(dir, name + "_plain", Launch(2),
                           Tiny(3) + (stage == 0 ? Stage0(dir) : Stage3(dir)) + " --offload cpu");
    TrainRun prof = Train(dir, name, Launch(2),
                          Tiny(3) + (stage == 0 ? Stage0(dir) : Stage3(dir)) +
                              " --offload cpu --profile");
    ASSERT_EQ(prof.r.exit_code, 0) << prof.r.out << prof.r.err;
    EXPECT_NE(prof.r.out.find("| collectives "), std::string::npos) << prof.r.out;
    EXPECT_GT(prof.summary.value("comm_bound_seconds", 0.0), 0.0) << stage;
    EXPECT_GT(prof.summary.value("step_over_bound", 0.0), 0.0) << stage;
    EXPECT_EQ(prof.summary["comm_sent_bytes_per_step"], plain.summary["comm_sent_bytes_per_step"])
        << stage;
  }
}

// --pinned-budget auto across ranks: the pool is sized from the shards as each stage registers
// them (fp32 gradients, padded chunks, ZeRO-3's gathered units) plus a copy in transfer per
// size, so every stage starts and runs within it; with NVMe it is at least aio.block_size.
TEST(TrainRanksCliTest, AnAutomaticPinnedBudgetHoldsEveryStage) {
  TempDir dir;
  const std::string model =
      "train --layers 2 --width 128 --heads 4 --seq-len 32 --vocab 512 --batch 4 --steps 2 "
      "--device-budget 16M --pinned-budget auto --synthetic-bytes 65536 --offload nvme";
  TrainRun one = Train(dir, "auto_one", "", model + " --swap-dir " + dir / "sw1");
  ASSERT_EQ(one.r.exit_code, 0) << one.r.err;
  for (int stage : {0, 1, 2, 3}) {
    const std::string cfg = stage == 0 ? Stage0(dir) : stage == 1 ? Stage1(dir)
                            : stage == 2 ? Stage2(dir) : Stage3(dir);
    TrainRun many = Train(dir, "auto" + std::to_string(stage), Launch(2),
                          model + cfg + " --swap-dir " + dir / ("sw" + std::to_string(stage + 2)));
    ASSERT_EQ(many.r.exit_code, 0) << stage << many.r.err;
    EXPECT_NE(many.r.err.find("pinned budget auto"), std::string::npos) << many.r.err;
    EXPECT_GE(many.summary["pinned_budget_bytes"].get<uint64_t>(),
              many.summary["peak_pinned_bytes"].get<uint64_t>());
  }
}

TEST(TrainRanksCliTest, ARankWithAnotherConfigIsNamed) {
  TempDir dir;
  // Rank 1 asks for 5 steps, rank 0 for 4.
  const std::string tiny_without_steps =
      " train --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 64 --batch 4 --device-budget "
      "4M --pinned-budget 16M --synthetic-bytes 65536";
  auto r = RunZinf(LaunchPrefix(2) + "sh -c '" + ZINF_BINARY + tiny_without_steps +
                       Stage0(dir) + " --offload cpu --steps $((4 + RANK))'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("the ranks disagree on the training job"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 ("), std::string::npos) << r.err;
}

TEST(TrainRanksCliTest, AWrongWorldSizeIsNamed) {
  TempDir dir;
  const std::string port = std::to_string(FreePort());
  const std::string cmd = std::string(ZINF_BINARY) + " " + Tiny(2) + Stage0(dir) +
                          " --offload cpu --comm-timeout 5";
  auto r = RunZinf("info >/dev/null; { RANK=0 WORLD_SIZE=2 MASTER_PORT=" + port + " " + cmd +
                       " & RANK=1 WORLD_SIZE=3 MASTER_PORT=" + port + " " + cmd + "; wait; }",
                   dir.path());
  EXPECT_NE(r.err.find("wrong world size: rank 0 runs WORLD_SIZE=2, rank 1 was given "
                       "WORLD_SIZE=3"),
            std::string::npos) << r.err;
}

// Without a launcher to end it, rank 0 fails by itself when rank 1 dies, naming it.
TEST(TrainRanksCliTest, ARankKilledMidRunIsNamedByTheOthers) {
  TempDir dir;
  const std::string env = "WORLD_SIZE=2 MASTER_PORT=" + std::to_string(FreePort());
  const std::string cmd = std::string(ZINF_BINARY) + " " + Tiny(100000) + Stage0(dir) +
                          " --offload cpu --comm-timeout 30";
  const auto t0 = std::chrono::steady_clock::now();
  // Rank 1 is killed once rank 0 has logged a step (both are then training, however slowly
  // the machine starts them; at the latest after 30 s).
  const std::string losses = dir / "l.jsonl";
  auto r = RunZinf("info >/dev/null; RANK=1 " + env + " " + cmd +
                       " >/dev/null 2>&1 & p=$!; (for i in $(seq 600); do [ -s " + losses +
                       " ] && break; sleep 0.05; done; kill -9 $p) & RANK=0 " + env + " " + cmd +
                       " --losses " + losses + " >/dev/null",
                   dir.path());
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed"), std::string::npos) << r.err;
  EXPECT_LT(secs, 30.0);
}

// What cannot run across ranks is refused with the reason: HYBRID_SHARD with one rank a node
// (nothing to shard within a node: LOCAL_WORLD_SIZE 1 of WORLD_SIZE 2).
TEST(TrainRanksCliTest, WhatCannotRunAcrossRanksIsRefused) {
  TempDir dir;
  const std::string hybrid = dir / "hybrid.json";
  std::ofstream(hybrid) << R"({"zinf": {"sharding_strategy": "HYBRID_SHARD"}})";
  auto r = RunZinf(LaunchPrefix(2) + "sh -c 'LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 " + ZINF_BINARY +
                       " " + Tiny(2) + " --config " + hybrid + " --offload cpu'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("HYBRID_SHARD shards within a node and replicates across nodes: it needs "
                       "at least 2 ranks on each node"),
            std::string::npos) << r.err;

  // NCCL with no GPU: each rank says why before it joins the others (GPU machines: the
  // gpu-labelled nccl_transport_gpu_test).
  if (ProbeCuda().device_count > 0) return;
  const std::string nccl = dir / "nccl.json";
  std::ofstream(nccl) << R"({"zinf": {"comm": {"backend": "nccl"}}})";
  r = RunZinf(LaunchPrefix(2) + ZINF_BINARY + " " + Tiny(2) + " --config " + nccl +
                  " --offload cpu",
              dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find(nccl + ": zinf.comm.backend \"nccl\" needs a GPU a rank, and no GPU "
                       "answers on rank "),
            std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
