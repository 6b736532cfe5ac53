// Checkpoints of a run across ranks (`zinf launch --nproc N -- zinf train --checkpoint-dir`):
// every rank writes its part (`step-<s>/rank<r>/`), rank 0 commits the checkpoint's manifest
// once every part is there. A run stopped and resumed on the same world size ends bit for bit
// as the uninterrupted one (weights, losses), for ZeRO stages 0, 1, 2 and 3 with the state in
// memory and on NVMe, on 2, 3 and 4 ranks; `zinf ckpt export` consolidates the parts into the
// same bytes as the run's --save; a checkpoint without its manifest is not one (the previous one
// resumes). A checkpoint of another world size or partition rule is re-partitioned on resume,
// bit for bit one rank's run with the same global batch; what cannot resume is refused with the
// reason: a part named instead of the checkpoint, swap files the re-partitioned state is read
// from. A rank killed at random moments (start-up, a step, a commit) ends the run; resumed each
// time from the last whole checkpoint, the run still ends as the uninterrupted one. SIGTERM to
// the launcher stops every rank after the same step with a checkpoint, exit 0.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
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
using testing::Drain;
using testing::RunZinf;
using testing::Split;
using testing::TempDir;
using namespace zinf::testing::ranks;

constexpr int kSteps = 6;

std::vector<std::string> StepDirs(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (e.path().filename().string().starts_with("step-")) out.push_back(e.path().filename());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string Config(const TempDir& dir, int stage) {
  const std::string path = dir / ("stage" + std::to_string(stage) + ".json");
  std::ofstream(path) << R"({"zero_optimization": {"stage": )" << stage << "}}";
  return " --config " + path;
}

struct Case {
  const char* name;
  int stage;
  const char* offload;
  int world = 2;
};

class RanksResumeTest : public ::testing::TestWithParam<Case> {};

// Checkpoints every 2 steps, stopped after step 4 (committed at 2 and 4), resumed to 6 with
// no flags but --resume (the config comes from the checkpoint; each rank its own paths).
TEST_P(RanksResumeTest, IsBitwiseTheUninterruptedRun) {
  const Case& k = GetParam();
  TempDir dir;
  const std::string job = Tiny(kSteps) + Config(dir, k.stage) + " --offload " + k.offload;
  const std::string parts_listed = "in " + std::to_string(k.world) + " parts";
  auto ref = RunZinf(Launch(k.world) + job + " --swap-dir " + dir / "sw-ref" + " --losses " +
                         dir / "ref.jsonl" + " --save " + dir / "ref.safetensors",
                     dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;

  const std::string root = dir / "ckpt";
  auto first = RunZinf(Launch(k.world) + job + " --swap-dir " + dir / "sw" +
                           " --checkpoint-dir " +
                           root + " --checkpoint-every 2 --stop-after 4 --losses " +
                           dir / "a.jsonl",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("checkpoints: 2 committed"), std::string::npos) << first.out;
  // keep 1: the checkpoint of step 2 pruned, step 4's whole: its manifest and both parts.
  EXPECT_EQ(StepDirs(root), std::vector<std::string>{"step-0000000004"});
  const fs::path step4 = fs::path(root) / "step-0000000004";
  EXPECT_TRUE(fs::exists(step4 / "manifest.json"));
  for (int r = 0; r < k.world; ++r) {
    EXPECT_TRUE(fs::exists(step4 / ("rank" + std::to_string(r)) / "manifest.json")) << r;
  }
  auto global = nlohmann::json::parse(ReadFile(step4 / "manifest.json"));
  EXPECT_EQ(global["world"]["size"], k.world);
  EXPECT_EQ(global["world"]["partition"], k.stage == 0 ? "replicated" : "unit-chunks");
  EXPECT_EQ(global["parts"].size(), static_cast<size_t>(k.world));
  EXPECT_TRUE(global["shards"].empty());

  auto second = RunZinf(Launch(k.world) + "train --resume " + root + " --losses " +
                            dir / "b.jsonl" +
                            " --save " + dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("(resumed from step 4)"), std::string::npos) << second.out;
  EXPECT_EQ(LossRecords({dir / "a.jsonl", dir / "b.jsonl"}), LossRecords({dir / "ref.jsonl"}));
  const std::string weights = ReadFile(dir / "ref.safetensors");
  ASSERT_FALSE(weights.empty());
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == weights) << "final weights differ";

  // The parts consolidated: the final checkpoint's F32 export is the run's --save.
  EXPECT_EQ(StepDirs(root), std::vector<std::string>{"step-0000000006"});
  auto exp = RunZinf("ckpt export " + root + " --out " + dir / "x.safetensors", dir.path());
  ASSERT_EQ(exp.exit_code, 0) << exp.out << exp.err;
  EXPECT_TRUE(ReadFile(dir / "x.safetensors") == weights) << "the export differs from --save";
  auto verify = RunZinf("ckpt verify " + root, dir.path());
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  auto inspect = RunZinf("ckpt inspect " + root, dir.path());
  EXPECT_NE(inspect.out.find(parts_listed), std::string::npos) << inspect.out;
}

INSTANTIATE_TEST_SUITE_P(StagesAndPlacements, RanksResumeTest,
                         ::testing::Values(Case{"stage0_cpu", 0, "cpu"},
                                           Case{"stage1_nvme", 1, "nvme"},
                                           Case{"stage2_cpu", 2, "cpu"},
                                           Case{"stage2_nvme", 2, "nvme"},
                                           Case{"stage0_nvme_overlap", 0, "nvme --overlap-adam"},
                                           Case{"stage2_nvme_overlap", 2, "nvme --overlap-adam"},
                                           Case{"stage1_cpu_4ranks", 1, "cpu", 4},
                                           Case{"stage2_nvme_3ranks", 2, "nvme", 3},
                                           Case{"stage3_nvme", 3, "nvme"},
                                           Case{"stage3_cpu_3ranks", 3, "cpu", 3}),
                         [](const auto& info) { return std::string(info.param.name); });

// A checkpoint whose manifest rank 0 never committed is not one: the resume takes the previous
// and still ends as the uninterrupted run. A part changed after the commit is refused by its
// hash, and a rank's state corrupted in its part is named.
TEST(RanksCheckpointTest, AnUncommittedCheckpointIsSkippedAndADamagedPartIsNamed) {
  TempDir dir;
  const std::string job = Tiny(kSteps) + Config(dir, 1) + " --offload cpu";
  auto ref = RunZinf(Launch(2) + job + " --save " + dir / "ref.safetensors", dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string root = dir / "ckpt";
  auto first = RunZinf(Launch(2) + job + " --checkpoint-dir " + root +
                           " --checkpoint-every 2 --keep-checkpoints 2 --stop-after 4",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  ASSERT_EQ(StepDirs(root), (std::vector<std::string>{"step-0000000002", "step-0000000004"}));
  // As if rank 0 died before committing step 4: its parts are there, its manifest is not.
  fs::remove(fs::path(root) / "step-0000000004" / "manifest.json");
  auto second = RunZinf(Launch(2) + "train --resume " + root + " --save " +
                            dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("(resumed from step 2)"), std::string::npos) << second.out;
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == ReadFile(dir / "ref.safetensors"));

  // The final checkpoint's rank-1 part edited: its hash no longer matches the manifest's.
  const fs::path last = fs::path(root) / "step-0000000006";
  const std::string part = last / "rank1" / "manifest.json";
  std::string text = ReadFile(part);
  ASSERT_FALSE(text.empty());
  std::ofstream(part, std::ios::trunc) << text << " ";
  auto bad = RunZinf("ckpt verify " + root, dir.path());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("rank1/manifest.json"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("not the one committed"), std::string::npos) << bad.err;
  std::ofstream(part, std::ios::trunc) << text;
  // A byte of rank 1's state flipped: verify names the shard and its file.
  const std::string state = last / "rank1" / "state.bin";
  {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  auto corrupt = RunZinf("ckpt verify " + root, dir.path());
  EXPECT_NE(corrupt.exit_code, 0);
  EXPECT_NE(corrupt.err.find("rank1/state.bin"), std::string::npos) << corrupt.err;
}

// A checkpoint written by another world size, or with another partition rule, is re-partitioned
// on resume: each rank reads its share of every unit from all the old parts. With the global
// batch kept (the accumulation steps worked out again: micro-batch x accumulation x world), the
// run ends bit for bit as one rank accumulating the same micro-batches uninterrupted.
struct Hop {
  int world;
  int stage;
  std::string extra;  // more flags for this leg
};
struct RepartitionCase {
  const char* name;
  const char* offload;
  int ref_grad_accum;  // the one-rank reference's accumulation steps (the global batch / 4)
  std::vector<Hop> hops;  // the first starts the run, each next resumes the previous's
  std::string model = "";  // zinf train's model and budget flags; empty: Tiny's
};

std::string Job(const RepartitionCase& k, int steps) {
  if (k.model.empty()) return Tiny(steps);
  return "train " + k.model + " --steps " + std::to_string(steps);
}

class RanksRepartitionTest : public ::testing::TestWithParam<RepartitionCase> {};

TEST_P(RanksRepartitionTest, ResumesOnAnotherWorldSizeBitwise) {
  const RepartitionCase& k = GetParam();
  TempDir dir;
  // Bit for bit holds where the fp32 sums of the 16-bit micro-batch gradients are exact: the
  // ranks add their partial sums in rank order, one rank adds the micro-batches one by one, and
  // the two orders round alike only when neither rounds. With this model's gradients that is so
  // for OpenBLAS's Haswell kernels; on a CPU with AVX512-BF16, OpenBLAS's own choice gives
  // gradients of which one element in 4,096 rounds (1 ulp) three ranks to one. The kernel is
  // pinned (the runs inherit it) so that every machine checks the same numbers.
  setenv("OPENBLAS_CORETYPE", "Haswell", 1);
  const int steps = 2 * static_cast<int>(k.hops.size());
  // The reference reads a config file too, so it trains as the legs do: a file without a
  // scheduler or gradient_clipping means DeepSpeed's constant lr and no clipping (one rank works
  // alike at any stage).
  auto ref = RunZinf(Job(k, steps) + Config(dir, 3) + " --offload " + k.offload + " --grad-accum " +
                         std::to_string(k.ref_grad_accum) + " --swap-dir " + dir / "sw-ref" +
                         " --losses " + dir / "ref.jsonl" + " --save " + dir / "ref.safetensors",
                     dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string root = dir / "ckpt";
  std::vector<std::string> losses;
  for (size_t i = 0; i < k.hops.size(); ++i) {
    const Hop& h = k.hops[i];
    const std::string launch = h.world > 1 ? Launch(h.world) : std::string();
    const std::string leg = dir / ("leg" + std::to_string(i) + ".jsonl");
    losses.push_back(leg);
    std::string cmd;
    if (i == 0) {
      cmd = launch + Job(k, steps) + Config(dir, h.stage) + " --offload " + k.offload +
            " --grad-accum " + std::to_string(k.ref_grad_accum / h.world) + " --swap-dir " +
            dir / "sw" + " --checkpoint-dir " + root + " --checkpoint-every 2";
    } else {
      // Only the stage may be given: the batch, the model and the paths come from the
      // checkpoint, the accumulation steps from its global batch.
      cmd = launch + "train --resume " + root + Config(dir, h.stage);
    }
    cmd += " --losses " + leg + " " + h.extra;
    if (i + 1 < k.hops.size()) cmd += " --stop-after " + std::to_string(2 * (i + 1));
    else cmd += " --save " + dir / "out.safetensors";
    SCOPED_TRACE(cmd);
    auto run = RunZinf(cmd, dir.path());
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    if (i > 0) {
      EXPECT_NE((run.out + run.err).find("re-partitioning"), std::string::npos) << run.out;
      EXPECT_NE(run.out.find("(resumed from step " + std::to_string(2 * i) + ")"),
                std::string::npos) << run.out;
    }
  }
  // The losses bit for bit; the reported norm (summed in another order across ranks, not used
  // without clipping) to its last bits.
  const auto got = LossRecords(losses), want = LossRecords({dir / "ref.jsonl"});
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    auto a = nlohmann::json::parse(got[i]), b = nlohmann::json::parse(want[i]);
    const double na = a["grad_norm"], nb = b["grad_norm"];
    EXPECT_NEAR(na, nb, 1e-12 * nb) << "step " << i + 1;
    a.erase("grad_norm");
    b.erase("grad_norm");
    EXPECT_EQ(a, b) << "step " << i + 1;
  }
  const std::string weights = ReadFile(dir / "ref.safetensors");
  ASSERT_FALSE(weights.empty());
  EXPECT_TRUE(ReadFile(dir / "out.safetensors") == weights) << "final weights differ";
}

INSTANTIATE_TEST_SUITE_P(
    WorldsAndStages, RanksRepartitionTest,
    ::testing::Values(
        RepartitionCase{"two_to_one_stage2_nvme", "nvme", 2, {{2, 2, ""}, {1, 2, ""}}},
        RepartitionCase{"one_to_two_stage1_nvme", "nvme", 2, {{1, 1, ""}, {2, 1, ""}}},
        // bf16 moments rounded stochastically: a chunk draws from its offset in the unit.
        RepartitionCase{"two_to_one_stage1_bf16_nvme", "nvme --optimizer-state-dtype bf16", 2,
                        {{2, 1, ""}, {1, 1, ""}}},
        RepartitionCase{"three_to_two_to_one_stage3_cpu", "cpu", 6,
                        {{3, 3, ""}, {2, 3, ""}, {1, 1, ""}}},
        // Same world, another partition rule: replicated (stage 0) to chunks (stage 2) and back.
        RepartitionCase{"stage0_to_stage2_to_stage0_cpu", "cpu", 2,
                        {{2, 0, ""}, {2, 2, ""}, {2, 0, ""}}},
        // Blocks of 3.2M parameters: each old shard (12.6 MB whole, 6.3 MB a chunk) streams
        // through the reader's 4 MiB buffer in pieces, a chunk's edge inside a piece.
        RepartitionCase{"one_to_two_to_one_wide_stage2_cpu", "cpu", 2,
                        {{1, 2, ""}, {2, 2, ""}, {1, 2, ""}},
                        "--layers 2 --width 512 --heads 8 --seq-len 16 --vocab 64 --batch 4 "
                        "--device-budget 64M --pinned-budget 256M --synthetic-bytes 65536"}),
    [](const auto& info) { return std::string(info.param.name); });

// Re-partitioning reads every old part's shards and checks each against its recorded hash
// before any of it is used: a flipped byte of rank 1's state is named.
TEST(RanksCheckpointTest, RepartitioningNamesACorruptPart) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  auto first = RunZinf(Launch(2) + Tiny(4) + Config(dir, 1) + " --offload cpu" +
                           " --checkpoint-dir " + root + " --checkpoint-every 2 --stop-after 2",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  const std::string state = fs::path(root) / "step-0000000002" / "rank1" / "state.bin";
  {
    std::fstream f(state, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << state;
    f.seekg(100);
    const char was = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(was ^ 0x40));
  }
  auto one = RunZinf("train --resume " + root, dir.path());
  EXPECT_NE(one.exit_code, 0);
  EXPECT_NE(one.err.find("rank1"), std::string::npos) << one.err;
  EXPECT_NE(one.err.find("the data is corrupt"), std::string::npos) << one.err;
}

// What cannot resume is refused, naming the reason and what to do: a part named instead of its
// checkpoint; a re-partitioning resume whose swap files would be the checkpoint's own (it reads
// the state from them).
TEST(RanksCheckpointTest, APartOrACheckpointsOwnSwapFilesAreRefused) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  auto first = RunZinf(Launch(2) + Tiny(4) + Config(dir, 1) + " --offload nvme --swap-dir " +
                           dir / "sw" + " --checkpoint-dir " + root +
                           " --checkpoint-every 2 --stop-after 2",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  // Three ranks in the same swap directory: ranks 0 and 1 would empty the files it reads.
  auto three = RunZinf(Launch(3) + "train --resume " + root, dir.path());
  EXPECT_NE(three.exit_code, 0);
  EXPECT_NE(three.err.find("reads the checkpoint's optimizer state from its swap files"),
            std::string::npos) << three.out << three.err;
  EXPECT_NE(three.err.find("give this run another --swap-dir"), std::string::npos) << three.err;
  // A part named instead of its checkpoint.
  auto part = RunZinf(Launch(2) + "train --resume " + root + "/step-0000000002/rank0",
                      dir.path());
  EXPECT_NE(part.exit_code, 0);
  EXPECT_NE(part.err.find("rank 0's part of a checkpoint across 2 ranks"), std::string::npos)
      << part.out << part.err;
  // With another swap directory it resumes.
  auto moved = RunZinf(Launch(3) + "train --resume " + root + " --swap-dir " + dir / "sw3",
                       dir.path());
  EXPECT_EQ(moved.exit_code, 0) << moved.out << moved.err;
}

// The ranks `zinf launch` (pid) started: its children.
std::vector<pid_t> Children(pid_t parent) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

std::vector<std::string> Committed(const std::string& root) {
  std::vector<std::string> out;
  for (const std::string& d : StepDirs(root)) {
    if (fs::exists(fs::path(root) / d / "manifest.json")) out.push_back(d);
  }
  return out;
}

// Two ranks of stage 1 with a checkpoint after every step; one rank (chosen at random) killed
// with SIGKILL after a random time, eight times, each run resumed from the last committed
// checkpoint (or started afresh when there is none); then run to the end.
TEST(RanksCheckpointKillTest, RandomRankKillsThenResumeMatchTheUninterruptedRun) {
  for (const std::string placement : {"--offload nvme", "--offload cpu"}) {
    SCOPED_TRACE(placement);
    TempDir dir;
    constexpr int kKillSteps = 100;
    const std::string job = Tiny(kKillSteps) + Config(dir, 1) + " " + placement;
    auto ref = RunZinf(Launch(2) + job + " --swap-dir " + dir / "sw-ref" + " --losses " +
                           dir / "ref.jsonl" + " --save " + dir / "ref.safetensors",
                       dir.path());
    ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
    const std::vector<std::string> ref_losses = LossRecords({dir / "ref.jsonl"});
    ASSERT_EQ(ref_losses.size(), static_cast<size_t>(kKillSteps));
    const std::string root = dir / "ckpt";
    std::mt19937_64 rng(placement.size() * 7919 + 3);
    std::map<uint64_t, std::string> seen;  // step -> its losses record, from every run
    bool complete = false;
    int kills = 0;
    for (int attempt = 0; attempt < 9 && !complete; ++attempt) {
      const auto committed = Committed(root);
      const std::string losses = dir / ("l" + std::to_string(attempt) + ".jsonl");
      const std::string args =
          (committed.empty() ? job + " --swap-dir " + dir / "sw" + " --checkpoint-dir " + root +
                                   " --checkpoint-every 1"
                             : "train --resume " + root) +
          " --losses " + losses + " --save " + dir / "w.safetensors";
      if (!committed.empty() && committed.back() == fmt::format("step-{:010}", kKillSteps)) {
        complete = true;  // killed after its last commit
        break;
      }
      int fd = -1;
      const pid_t pid = testing::SpawnZinf(Split(Launch(2) + args), dir / "err.txt", &fd);
      ASSERT_GT(pid, 0);
      bool killed = false;
      if (attempt < 8) {
        // The random time counts from the ranks' start: on a loaded machine the launcher may
        // take longer than the shortest wait to start them (the kill then found no rank).
        for (int i = 0; i < 2000 && Children(pid).size() < 2; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(30 + rng() % 500));
        const auto ranks = Children(pid);
        if (!ranks.empty()) killed = kill(ranks[rng() % ranks.size()], SIGKILL) == 0;
      }
      const std::string out = Drain(fd);
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status));
      if (WEXITSTATUS(status) == 0) {
        complete = true;
      } else {
        ASSERT_TRUE(killed) << "failed without a kill:\n" << out << ReadFile(dir / "err.txt");
        ++kills;
      }
      if (fs::exists(losses)) {
        for (const std::string& rec : LossRecords({losses})) {
          const uint64_t step = nlohmann::json::parse(rec)["step"].get<uint64_t>();
          EXPECT_EQ(rec, ref_losses.at(step - 1)) << "step " << step << " after a kill";
          seen[step] = rec;
        }
      }
    }
    ASSERT_TRUE(complete) << "never completed";
    std::printf("%s: %d runs with a rank killed before one completed\n", placement.c_str(),
                kills);
    EXPECT_GE(kills, 1) << "no kill landed: the test checked nothing";
    EXPECT_EQ(seen.size(), static_cast<size_t>(kKillSteps));
    if (fs::exists(dir / "w.safetensors")) {
      EXPECT_TRUE(ReadFile(dir / "w.safetensors") == ReadFile(dir / "ref.safetensors"));
    }
    auto exp = RunZinf("ckpt export " + root + " --out " + dir / "x.safetensors", dir.path());
    ASSERT_EQ(exp.exit_code, 0) << exp.err;
    EXPECT_TRUE(ReadFile(dir / "x.safetensors") == ReadFile(dir / "ref.safetensors"));
  }
}

// SIGTERM to the launcher reaches every rank; they agree to stop after the same step, commit a
// checkpoint of it, and exit 0; the resume runs to the end as the uninterrupted run.
TEST(RanksCheckpointSignalTest, SigtermStopsEveryRankAfterTheSameStepWithACheckpoint) {
  TempDir dir;
  const std::string job = Tiny(60) + Config(dir, 2) + " --offload nvme";
  auto ref = RunZinf(Launch(2) + job + " --swap-dir " + dir / "sw-ref" + " --save " +
                         dir / "ref.safetensors",
                     dir.path());
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string root = dir / "ckpt";
  int fd = -1;
  const pid_t pid = testing::SpawnZinf(
      Split(Launch(2) + job + " --swap-dir " + dir / "sw" + " --checkpoint-dir " + root +
            " --losses " + dir / "a.jsonl"),
      dir / "err.txt", &fd);
  ASSERT_GT(pid, 0);
  // Until rank 0 has logged a few steps.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline &&
         (!fs::exists(dir / "a.jsonl") || Lines(ReadFile(dir / "a.jsonl")).size() < 3)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const std::string out = Drain(fd);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << out << ReadFile(dir / "err.txt");
  const size_t steps = Lines(ReadFile(dir / "a.jsonl")).size();
  const auto committed = Committed(root);
  ASSERT_EQ(committed.size(), 1u) << out;
  EXPECT_EQ(committed.back(), fmt::format("step-{:010}", steps));
  EXPECT_LT(steps, 60u) << "the signal did not stop the run";
  auto resumed = RunZinf(Launch(2) + "train --resume " + root + " --save " +
                             dir / "b.safetensors",
                         dir.path());
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == ReadFile(dir / "ref.safetensors"));
}

}  // namespace
}  // namespace zinf
