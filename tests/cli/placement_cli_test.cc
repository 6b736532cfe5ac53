// `zinf train --placement` / `--host-budget` end to end on the tiny model (28,032 parameters):
// every unit's optimizer state on NVMe or in host memory trains bit for bit as all of it on
// NVMe (losses and final weights), with fp32 and bf16 moments, the plain and the overlapped
// step; the state in memory stays within zinf.budgets.host_bytes and the NVMe bytes fall with
// it (the state's, and the 16-bit weights', which are cast from the master in memory;
// `--host-budget auto` sizes it from the memory available); a checkpoint of a mixed placement puts the units in memory in state.bin and names the others in the swap file,
// verifies, and resumes bit for bit; bad placements are refused naming the problem.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::RunZinf;
using testing::TempDir;
namespace fs = std::filesystem;

// The tiny model's units: embedding (80 x 32 = 2,560 parameters), block0 and block1 (12,704
// each), final (64). Optimizer state: 12 bytes a parameter (8 with bf16 moments).
constexpr uint64_t kEmbedding = 80 * 32, kBlock = 12 * 32 * 32 + 13 * 32, kFinal = 64;
static_assert(kEmbedding + 2 * kBlock + kFinal == kParams);

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

struct RunResult {
  std::vector<std::string> losses;
  std::string weights;
  nlohmann::json summary;
  std::string out, err;
};

RunResult Train(const TempDir& dir, const std::string& name, const std::string& flags,
          uint64_t steps = 4) {
  RunResult run;
  const std::string lpath = dir / (name + ".jsonl"), save = dir / (name + ".safetensors"),
                    summary = dir / (name + ".json");
  auto r = RunZinf(Tiny(steps) + " --offload nvme --swap-dir " + dir / ("swap-" + name) + " " +
                       flags + " --losses " + lpath + " --save " + save + " --summary-json " +
                       summary,
                   dir.path());
  EXPECT_EQ(r.exit_code, 0) << name << ": " << r.out << r.err;
  run.losses = LossRecords({lpath});
  run.weights = ReadFile(save);
  run.summary = ReadJson(summary);
  run.out = r.out;
  run.err = r.err;
  return run;
}

class PlacementTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PlacementTest, EveryMixOfHomesTrainsBitForBitAsAllOnNvme) {
  TempDir dir;
  const std::string extra = GetParam();
  const uint64_t per_param = extra.find("bf16") != std::string::npos ? 8 : 12;
  WriteText(dir / "alternate.json",
            R"({"optimizer_state": {"embedding": "memory", "block0": "nvme", "block1": "memory"}})");
  WriteText(dir / "all.json",
            R"({"optimizer_state": {"embedding": "memory", "block0": "memory",
                                    "block1": "memory", "final": "memory"}})");
  const RunResult nvme = Train(dir, "nvme", extra + " --placement nvme --host-budget 1M");
  ASSERT_EQ(nvme.losses.size(), 4u);
  EXPECT_EQ(nvme.summary["optimizer_state_memory_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(nvme.summary["optimizer_state_nvme_bytes"].get<uint64_t>(), per_param * kParams);
  struct Case {
    std::string name, flags;
    uint64_t memory_params;  // whose state the placement keeps in memory
  };
  // auto with a budget of final + block1's state (and not block0's too): from the last unit back.
  const uint64_t two_units = per_param * (kFinal + kBlock);
  const std::vector<Case> cases = {
      {"auto", extra + " --host-budget " + std::to_string(two_units + 100), kFinal + kBlock},
      {"file", extra + " --placement " + dir / "alternate.json", kEmbedding + kBlock},
      {"all", extra + " --placement " + dir / "all.json", kParams},
  };
  for (const Case& c : cases) {
    const RunResult run = Train(dir, c.name, c.flags);
    EXPECT_EQ(run.losses, nvme.losses) << c.name;
    EXPECT_TRUE(run.weights == nvme.weights) << c.name << ": final weights differ";
    EXPECT_EQ(run.summary["optimizer_state_memory_bytes"].get<uint64_t>(),
              per_param * c.memory_params)
        << c.name;
    EXPECT_EQ(run.summary["optimizer_state_nvme_bytes"].get<uint64_t>(),
              per_param * (kParams - c.memory_params))
        << c.name;
    // Each parameter in memory saves at least its state's read and write in every step after
    // the first (whose step may finish in the next: --losses counts it there).
    EXPECT_LE(run.summary["nvme_read_bytes"].get<uint64_t>() + 3 * per_param * c.memory_params,
              nvme.summary["nvme_read_bytes"].get<uint64_t>())
        << c.name;
    // Their 16-bit weights are cast from the master weights in memory, never written to NVMe:
    // 2 bytes a parameter more saved in every step's writes.
    EXPECT_EQ(run.summary["param16_derived_bytes"].get<uint64_t>(), 2 * c.memory_params) << c.name;
    EXPECT_GT(run.summary["param16_derived_load_bytes"].get<uint64_t>(), 0u) << c.name;
    EXPECT_LE(run.summary["nvme_write_bytes"].get<uint64_t>() +
                  3 * (per_param + 2) * c.memory_params,
              nvme.summary["nvme_write_bytes"].get<uint64_t>())
        << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(MomentsAndSteps, PlacementTest,
                         ::testing::Values("", "--optimizer-state-dtype bf16", "--overlap-adam",
                                           "--grad-accum 2"),
                         [](const auto& info) {
                           std::string n;
                           for (char c : info.param) {
                             n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           }
                           return n.empty() ? std::string("fp32") : n;
                         });

// A checkpoint of a mixed placement: the units in memory in state.bin, the others named in the
// swap file; `zinf ckpt verify` reads both; `--resume` alone (the placement comes from the
// checkpoint) ends bit for bit where the uninterrupted run does; another placement is refused.
TEST(PlacementCheckpointTest, MixedStateCheckpointsVerifiesAndResumesBitForBit) {
  TempDir dir;
  WriteText(dir / "alternate.json",
            R"({"optimizer_state": {"embedding": "memory", "block1": "memory"}})");
  const std::string place = " --placement " + dir / "alternate.json";
  const RunResult ref = Train(dir, "ref", place, 6);
  const std::string root = dir / "ckpt";
  auto first = RunZinf(Tiny(6) + " --offload nvme --swap-dir " + dir / "swap" + place +
                           " --checkpoint-dir " + root + " --checkpoint-every 2 --stop-after 4" +
                           " --losses " + dir / "a.jsonl",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string ck = root + "/step-0000000004";
  const nlohmann::json m = ReadJson(ck + "/manifest.json");
  EXPECT_EQ(m["training"]["optimizer_state"], "mixed");
  EXPECT_EQ(m["training"]["optimizer_state_in_memory"],
            nlohmann::json::array({"embedding", "block1"}));
  std::map<std::string, std::string> file_of;  // "master/2" -> file
  for (const auto& s : m["shards"]) {
    file_of[s["role"].get<std::string>() + "/" + std::to_string(s["unit"].get<int>())] =
        s["file"].get<std::string>();
  }
  for (const char* key : {"master/0", "exp_avg_sq/2", "master/1", "exp_avg/3"}) {
    ASSERT_EQ(file_of.count(key), 1u) << key;
  }
  EXPECT_EQ(file_of["master/0"], "state.bin");
  EXPECT_EQ(file_of["exp_avg_sq/2"], "state.bin");
  EXPECT_NE(file_of["master/1"], "state.bin");
  EXPECT_NE(file_of["exp_avg/3"], "state.bin");
  EXPECT_EQ(fs::file_size(ck + "/state.bin"), 12 * (kEmbedding + kBlock));
  auto verify = RunZinf("ckpt verify " + ck, dir.path());
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  auto inspect = RunZinf("ckpt inspect " + ck, dir.path());
  EXPECT_NE(inspect.out.find("optimizer state in memory for embedding, block1, on NVMe for the "
                             "rest"),
            std::string::npos)
      << inspect.out;

  // Another placement is refused, naming both; another device names the device.
  auto other = RunZinf("train --resume " + root + " --placement nvme", dir.path());
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.err.find("--placement / zinf.budgets.host_bytes: the optimizer state is in "
                           "nvme for every unit here, in memory for embedding, block1, on NVMe "
                           "for the rest in the checkpoint"),
            std::string::npos)
      << other.err;
  auto cpu = RunZinf("train --resume " + root + " --offload cpu", dir.path());
  EXPECT_NE(cpu.exit_code, 0);
  EXPECT_NE(cpu.err.find("zero_optimization.offload_optimizer.device: cpu here, nvme in the "
                         "checkpoint"),
            std::string::npos)
      << cpu.err;

  auto second = RunZinf("train --resume " + root + " --losses " + dir / "b.jsonl" + " --save " +
                            dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_EQ(LossRecords({dir / "a.jsonl", dir / "b.jsonl"}), ref.losses);
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == ref.weights) << "final weights differ";
}

// A checkpoint of state all on NVMe (or all placed in memory) resumed under --placement auto
// keeps that placement whatever zinf.budgets.host_bytes now says: the swap file's layout
// follows it. The run then matches the uninterrupted one bit for bit.
TEST(PlacementCheckpointTest, AResumeUnderAutoKeepsTheCheckpointsPlacement) {
  TempDir dir;
  const RunResult ref = Train(dir, "ref", "--placement nvme", 4);
  const std::string root = dir / "ckpt";
  auto first = RunZinf(Tiny(4) + " --offload nvme --swap-dir " + dir / "swap" +
                           " --checkpoint-dir " + root + " --stop-after 2 --losses " +
                           dir / "a.jsonl",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  auto second = RunZinf("train --resume " + root + " --host-budget 1M --losses " + dir / "b.jsonl" +
                            " --save " + dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("placement the checkpoint's: no unit in memory"), std::string::npos)
      << second.err;
  EXPECT_EQ(LossRecords({dir / "a.jsonl", dir / "b.jsonl"}), ref.losses);
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == ref.weights) << "final weights differ";
}

// DeepSpeed's offload_param nvme with offload_optimizer cpu: every unit's master weights are in
// memory, so its 16-bit weights are cast from them when loaded and nothing goes to NVMe; the
// training is bit for bit the run with the 16-bit weights homed in pinned memory: the step
// under the next forward, the overlapped step (Adam unit by unit during backward), and budgets
// that hold one unit at a time on the device and few in the pinned pool (each weight derived
// again, evictions in both tiers).
struct ParamsOnNvmeCase {
  std::string name;
  std::string model;   // the train flags of the model and its device budget
  std::string pinned;  // the pinned budget of the run with the weights on NVMe
  std::string extra;
};

class ParamsOnNvmeTest : public ::testing::TestWithParam<ParamsOnNvmeCase> {};

TEST_P(ParamsOnNvmeTest, WithTheStateInMemoryTrainBitForBitAndWriteNothingThere) {
  TempDir dir;
  const ParamsOnNvmeCase& c = GetParam();
  WriteText(dir / "pn.json",
            R"({"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": ")" +
                std::string(dir / "swap-pn") + R"("}, "offload_optimizer": {"device": "cpu"}}, )" +
                kDefaultJobTraining + "}");
  fs::create_directories(dir / "swap-pn");
  auto run = [&](const std::string& name, const std::string& flags) {
    RunResult r;
    const std::string l = dir / (name + ".jsonl"), save = dir / (name + ".safetensors"),
                      summary = dir / (name + ".json");
    auto z = RunZinf(c.model + " " + flags + " " + c.extra + " --losses " + l + " --save " +
                         save + " --summary-json " + summary,
                     dir.path());
    EXPECT_EQ(z.exit_code, 0) << name << ": " << z.out << z.err;
    r.losses = LossRecords({l});
    r.weights = ReadFile(save);
    r.summary = ReadJson(summary);
    return r;
  };
  const RunResult pinned = run("cpu", "--offload cpu --pinned-budget 16M");
  const RunResult pn =
      run("pn", "--config " + std::string(dir / "pn.json") + " --pinned-budget " + c.pinned);
  ASSERT_EQ(pn.losses.size(), 4u);
  EXPECT_EQ(pn.losses, pinned.losses);
  EXPECT_TRUE(pn.weights == pinned.weights) << "final weights differ";
  const uint64_t p16 = pn.summary["param16_bytes"].get<uint64_t>();
  EXPECT_EQ(pn.summary["param16_derived_bytes"].get<uint64_t>(), p16);
  // Every step loads every unit's weights at least once (forward), all of them derived.
  EXPECT_GE(pn.summary["param16_derived_load_bytes"].get<uint64_t>(), 4 * p16);
  EXPECT_EQ(pn.summary["nvme_write_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(pn.summary["nvme_read_bytes"].get<uint64_t>(), 0u);
  if (c.name == "TightBudgets") {  // the copies were evicted and derived again
    EXPECT_GT(pn.summary["host_evictions"].get<uint64_t>(), 0u);
    EXPECT_GT(pn.summary["device_evictions"].get<uint64_t>(), 0u);
    EXPECT_GT(pn.summary["param16_derived_load_bytes"].get<uint64_t>(), 4 * p16);
  }
}

const std::string kTinyModel =
    "train --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 64 --batch 4 --steps 4 "
    "--device-budget 4M --synthetic-bytes 65536";
INSTANTIATE_TEST_SUITE_P(
    Steps, ParamsOnNvmeTest,
    ::testing::Values(ParamsOnNvmeCase{"UnderTheNextForward", kTinyModel, "16M", ""},
                      ParamsOnNvmeCase{"Overlapped", kTinyModel, "16M", "--overlap-adam"},
                      // 0.8M parameters: its units' 16-bit weights (1.6 MB) exceed the pinned
                      // pool's cache, and one unit at a time fits on the device.
                      ParamsOnNvmeCase{"TightBudgets",
                                       "train --layers 4 --width 128 --heads 4 --seq-len 16 "
                                       "--vocab 64 --batch 4 --steps 4 --device-budget 4M "
                                       "--synthetic-bytes 65536",
                                       "3M", ""}),
    [](const auto& info) { return info.param.name; });

// --host-budget auto (and "host_bytes": "auto" in a config) sizes the budget from the memory
// available: the tiny model's state (328 KiB) then fits in memory whole, and trains bit for bit
// as all of it on NVMe. Absent, nothing is in memory; the config records "auto" and null apart.
TEST(PlacementFlagsTest, HostBudgetAutoIsSizedFromTheMemoryAvailable) {
  TempDir dir;
  RunResult nvme = Train(dir, "nvme", "");
  EXPECT_EQ(nvme.summary["optimizer_state_memory_bytes"], 0);
  RunResult flag = Train(dir, "flag", "--host-budget auto");
  EXPECT_NE(flag.err.find("host budget auto: "), std::string::npos) << flag.err;
  EXPECT_EQ(flag.summary["optimizer_state_nvme_bytes"], 0) << flag.summary.dump();
  EXPECT_EQ(flag.summary["optimizer_state_memory_bytes"], 12 * 28032);
  EXPECT_EQ(flag.losses, nvme.losses);
  EXPECT_TRUE(flag.weights == nvme.weights) << "final weights differ";
  WriteText(dir / "auto.json", std::string(R"({"zinf": {"budgets": {"host_bytes": "auto"}}, )") +
                                   kDefaultJobTraining + "}");
  RunResult file = Train(dir, "file", "--config " + dir / "auto.json");
  EXPECT_EQ(file.summary["optimizer_state_memory_bytes"], 12 * 28032) << file.out;
  EXPECT_TRUE(file.weights == nvme.weights) << "final weights differ";
}

TEST(PlacementFlagsTest, RefusalsNameTheProblem) {
  TempDir dir;
  WriteText(dir / "unknown.json", R"({"optimizer_state": {"block7": "memory"}})");
  WriteText(dir / "home.json", R"({"optimizer_state": {"block0": "gpu"}})");
  WriteText(dir / "key.json", R"({"optimizer_state": {}, "params": {}})");
  WriteText(dir / "broken.json", R"({"optimizer_state": )");
  WriteText(dir / "big.json", R"({"optimizer_state": {"block0": "memory", "block1": "memory"}})");
  struct Case {
    std::string flags, expected;
  };
  const std::vector<Case> cases = {
      {"--offload nvme --placement " + dir / "unknown.json",
       "optimizer_state.block7: no such unit; the model's are embedding, block0..block1, final"},
      {"--offload nvme --placement " + dir / "home.json",
       "optimizer_state.block0: \"gpu\"; expected \"memory\" or \"nvme\""},
      {"--offload nvme --placement " + dir / "key.json", "unknown key \"params\""},
      {"--offload nvme --placement " + dir / "broken.json", "not JSON"},
      {"--offload nvme --placement " + dir / "missing.json", "cannot open the file"},
      {"--offload nvme --host-budget 200K --placement " + dir / "big.json",
       "304896 bytes (297.8 KiB) of optimizer state in memory, more than "
       "zinf.budgets.host_bytes 204800"},
      {"--offload cpu --placement " + dir / "big.json",
       "zero_optimization.offload_optimizer.device is not \"nvme\""},
  };
  for (const Case& c : cases) {
    auto r = RunZinf(Tiny(2) + " --swap-dir " + dir / "swap " + c.flags, dir.path());
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.err.find(c.expected), std::string::npos) << c.flags << "\n" << r.err;
  }
}

}  // namespace
}  // namespace zinf
