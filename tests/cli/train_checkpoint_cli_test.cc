// `zinf train` checkpoints end to end on the tiny model (28,032 parameters): a run stopped at a
// checkpoint and resumed gives the uninterrupted run's losses, weights and optimizer state bit for
// bit (every placement and precision); corrupt, truncated, missing and hostile checkpoints are
// refused or skipped as documented; the flags' refusals; SIGTERM commits and exits 0; a run killed
// at random moments resumes from its last committed checkpoint and still matches; a full disk
// during a commit stops the run and leaves the previous checkpoint loadable.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::Drain;
using testing::RunZinf;
using testing::Split;
using testing::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kSteps = 8;

// The committed checkpoint directories under root, oldest first.
std::vector<std::string> Checkpoints(const std::string& root) {
  std::vector<std::string> r;
  if (!fs::exists(root)) return r;
  for (const auto& e : fs::directory_iterator(root)) {
    if (fs::exists(e.path() / "manifest.json")) r.push_back(e.path().string());
  }
  std::sort(r.begin(), r.end());
  return r;
}

// role/unit -> the shard's hash, of the checkpoint in `dir`.
std::map<std::string, std::string> ShardHashes(const std::string& dir) {
  std::map<std::string, std::string> r;
  const nlohmann::json m = ReadJson(dir + "/manifest.json");
  for (const auto& s : m.value("shards", nlohmann::json::array())) {
    r[s["role"].get<std::string>() + "/" + std::to_string(s["unit"].get<int>())] =
        s["xxh64"].get<std::string>();
  }
  return r;
}

// The uninterrupted run: kSteps steps with one checkpoint at the end (its optimizer state).
struct Reference {
  std::vector<std::string> losses;
  std::string weights;
  std::map<std::string, std::string> state;
};

Reference RunUninterrupted(const std::string& placement, const TempDir& dir,
                           uint64_t steps = kSteps) {
  Reference ref;
  const std::string root = dir / "ref-ckpt";
  auto r = RunZinf(Tiny(steps) + " " + placement + " --swap-dir " + dir / "ref-swap" +
                       " --checkpoint-dir " + root + " --losses " + dir / "ref.jsonl" +
                       " --save " + dir / "ref.safetensors",
                   dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  ref.losses = LossRecords({dir / "ref.jsonl"});
  ref.weights = ReadFile(dir / "ref.safetensors");
  const auto cks = Checkpoints(root);
  EXPECT_EQ(cks.size(), 1u) << "the last step commits a checkpoint";
  if (!cks.empty()) ref.state = ShardHashes(cks.back());
  return ref;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

// Stopped after step 5 with checkpoints every 2 steps (committed at 2, 4 and 5), resumed to 8.
TEST_P(ResumeTest, IsBitwiseTheUninterruptedRun) {
  TempDir dir;
  const std::string placement = GetParam();
  const Reference ref = RunUninterrupted(placement, dir);
  ASSERT_EQ(ref.losses.size(), kSteps);
  ASSERT_FALSE(ref.state.empty());

  const std::string root = dir / "ckpt";
  auto first = RunZinf(Tiny(kSteps) + " " + placement + " --swap-dir " + dir / "swap" +
                           " --checkpoint-dir " + root + " --checkpoint-every 2 --stop-after 5" +
                           " --keep-checkpoints " + (placement.find("nvme") != std::string::npos ? "1" : "2") +
                           " --losses " + dir / "a.jsonl",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_NE(first.out.find("checkpoints: 3 committed"), std::string::npos) << first.out;
  const auto cks = Checkpoints(root);
  ASSERT_FALSE(cks.empty());
  EXPECT_EQ(fs::path(cks.back()).filename(), "step-0000000005");

  // No flags but --resume: the model, placement and step count come from the checkpoint.
  auto second = RunZinf("train --resume " + root + " --losses " + dir / "b.jsonl" + " --save " +
                            dir / "b.safetensors",
                        dir.path());
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("(resumed from step 5)"), std::string::npos) << second.out;
  EXPECT_EQ(ProgressLines(second.out).size(), kSteps - 5) << second.out;

  EXPECT_EQ(LossRecords({dir / "a.jsonl", dir / "b.jsonl"}), ref.losses);
  EXPECT_TRUE(ReadFile(dir / "b.safetensors") == ref.weights) << "final weights differ";
  const auto after = Checkpoints(root);
  ASSERT_FALSE(after.empty());
  EXPECT_EQ(fs::path(after.back()).filename(), "step-0000000008");
  EXPECT_EQ(ShardHashes(after.back()), ref.state) << "final optimizer state differs";
}

INSTANTIATE_TEST_SUITE_P(
    EveryPlacementAndPrecision, ResumeTest,
    ::testing::Values("--offload nvme", "--offload cpu", "--offload none",
                      "--offload nvme --precision fp16", "--offload cpu --precision fp16 --grad-accum 2",
                      "--offload nvme --grad-accum 2", "--offload nvme --overlap-adam",
                      "--offload cpu --overlap-adam", "--offload nvme --optimizer-state-dtype bf16",
                      "--offload cpu --optimizer-state-dtype bf16",
                      "--offload nvme --optimizer-state-dtype bf16 --optimizer-state-rounding nearest",
                      // final and block1's state in memory, the rest on NVMe (--placement auto)
                      "--offload nvme --host-budget 160K"),
    [](const auto& info) {
      std::string n;
      for (char c : info.param) n += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      return n;
    });

// A run with two committed checkpoints of host-held state (--offload cpu keeps 2).
struct TwoCheckpoints {
  TempDir dir;
  std::string root;
  std::vector<std::string> cks;
  explicit TwoCheckpoints(const std::string& placement = "--offload cpu") {
    root = dir / "ckpt";
    const bool nvme = placement.find("nvme") != std::string::npos;
    auto r = RunZinf(Tiny(4) + " " + placement + " --swap-dir " + dir / "swap" +
                         " --checkpoint-dir " + root + " --checkpoint-every 2" +
                         " --keep-checkpoints " + (nvme ? "1" : "2") +
                         " --stop-after 3",
                     dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    cks = Checkpoints(root);
  }
};

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x20);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(CheckpointIntegrityTest, AFlippedByteInHostStateIsNamedAndNeverTrainedOn) {
  TwoCheckpoints t;
  ASSERT_EQ(t.cks.size(), 2u);
  const nlohmann::json m = ReadJson(t.cks.back() + "/manifest.json");
  const auto& shard = m["shards"][3];
  const std::string file = t.cks.back() + "/" + shard["file"].get<std::string>();
  const uint64_t at = shard["offset"].get<uint64_t>() + 17;
  FlipByte(file, at);
  auto r = RunZinf("train --resume " + t.root, t.dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(ProgressLines(r.out).size(), 0u) << "trained on bad state:\n" << r.out;
  EXPECT_NE(r.err.find("DataLoss"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(shard["role"].get<std::string>()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("state.bin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::to_string(shard["offset"].get<uint64_t>())), std::string::npos) << r.err;
  // The older checkpoint, named, still resumes.
  auto older = RunZinf("train --resume " + t.cks.front(), t.dir.path());
  EXPECT_NE(older.exit_code, 0) << "a resume of an older checkpoint than the latest is refused";
  EXPECT_NE(older.err.find("newer"), std::string::npos) << older.err;
}

TEST(CheckpointIntegrityTest, AFlippedByteInTheSwapFileIsNamed) {
  TwoCheckpoints t("--offload nvme");
  ASSERT_EQ(t.cks.size(), 1u) << "NVMe state keeps one checkpoint";
  const nlohmann::json m = ReadJson(t.cks.back() + "/manifest.json");
  const auto& shard = m["shards"][5];
  const std::string file = shard["file"].get<std::string>();
  ASSERT_EQ(file, fs::weakly_canonical(t.dir / "swap/zinf.swap").string());
  FlipByte(file, shard["offset"].get<uint64_t>() + 4);
  auto r = RunZinf("train --resume " + t.root, t.dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(ProgressLines(r.out).size(), 0u) << "trained on bad state:\n" << r.out;
  EXPECT_NE(r.err.find("DataLoss"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(std::to_string(shard["offset"].get<uint64_t>())), std::string::npos) << r.err;
}

TEST(CheckpointIntegrityTest, ATruncatedStateFileIsRefused) {
  TwoCheckpoints t;
  ASSERT_EQ(t.cks.size(), 2u);
  const std::string file = t.cks.back() + "/state.bin";
  fs::resize_file(file, fs::file_size(file) / 2);
  auto r = RunZinf("train --resume " + t.root, t.dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(ProgressLines(r.out).size(), 0u);
  EXPECT_NE(r.err.find("state.bin"), std::string::npos) << r.err;
}

TEST(CheckpointIntegrityTest, ADeletedManifestFallsBackToThePreviousCheckpoint) {
  TwoCheckpoints t;
  ASSERT_EQ(t.cks.size(), 2u);
  fs::remove(t.cks.back() + "/manifest.json");
  // A stray temporary manifest (a commit cut off before its rename) is not a checkpoint either.
  std::ofstream(t.cks.back() + "/.manifest.json.tmp-1234") << "{\"step\": 3}";
  auto r = RunZinf("train --resume " + t.root, t.dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(resumed from step 2)"), std::string::npos) << r.out;
  EXPECT_EQ(ProgressLines(r.out).size(), 2u) << r.out;

  TempDir empty;
  fs::create_directories(empty / "ckpt/step-0000000002");
  auto none = RunZinf("train --resume " + empty / "ckpt", empty.path());
  EXPECT_NE(none.exit_code, 0);
  EXPECT_NE(none.err.find("no committed checkpoint"), std::string::npos) << none.err;
}

// A manifest naming a file neither in its directory nor the run's swap file: an error naming the
// file, whether the checkpoint is named or found as the latest (never the older one instead).
TEST(CheckpointIntegrityTest, AManifestNamingAFileOutsideItIsRefused) {
  TwoCheckpoints t;
  ASSERT_EQ(t.cks.size(), 2u);
  const std::string outside = t.dir / "outside.bin";
  std::ofstream(outside) << std::string(1 << 20, 'x');
  const std::string good = ReadFile(t.cks.back() + "/manifest.json");
  for (const std::string& name :
       {std::string("../outside.bin"), outside, t.dir / "swap/zinf.swap"}) {
    for (const std::string& resume : {t.root, t.cks.back()}) {
      nlohmann::json m = nlohmann::json::parse(good);
      m["files"][0]["name"] = name;
      if (name.find("zinf.swap") != std::string::npos) m["files"][0]["kind"] = "swap";
      for (auto& s : m["shards"]) s["file"] = name;
      std::ofstream(t.cks.back() + "/manifest.json") << m.dump();
      auto r = RunZinf("train --resume " + resume, t.dir.path());
      EXPECT_NE(r.exit_code, 0) << name << ": " << r.out;
      EXPECT_EQ(ProgressLines(r.out).size(), 0u);
      EXPECT_NE(r.err.find(name), std::string::npos) << r.err;
    }
  }
}

TEST(CheckpointFlagsTest, RefusalsNameTheProblem) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  struct Case {
    std::string args, expect;
  };
  for (const Case& c : std::vector<Case>{
           {Tiny(2) + " --offload cpu --checkpoint-every 1", "checkpoint"},
           {Tiny(2) + " --offload cpu --checkpoint-dir " + root + " --keep-checkpoints 0", "keep"},
           {Tiny(2) + " --offload nvme --swap-dir " + dir / "s" + " --checkpoint-dir " + root +
                " --keep-checkpoints 64",
            "at most 63"},
       }) {
    auto r = RunZinf(c.args, dir.path());
    EXPECT_NE(r.exit_code, 0) << c.args << r.out;
    EXPECT_EQ(ProgressLines(r.out).size(), 0u) << c.args;
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.args << "\n" << r.err;
  }
  // A fresh run into a root holding committed checkpoints would make them stale: refused.
  auto made = RunZinf(Tiny(2) + " --offload cpu --checkpoint-dir " + root, dir.path());
  ASSERT_EQ(made.exit_code, 0) << made.err;
  auto again = RunZinf(Tiny(2) + " --offload cpu --checkpoint-dir " + root, dir.path());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.err.find(root), std::string::npos) << again.err;
  // --init and --resume both say where the weights come from.
  auto both = RunZinf("train --resume " + root + " --init " + dir / "w.safetensors", dir.path());
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("--init"), std::string::npos) << both.err;
  // The checkpoint is of the last step: nothing is left to run.
  auto done = RunZinf("train --resume " + root, dir.path());
  EXPECT_NE(done.exit_code, 0);
  EXPECT_NE(done.err.find("step"), std::string::npos) << done.err;
  // Its moments are fp32: resuming them as bf16 is refused, naming the key.
  auto moments = RunZinf("train --resume " + root + " --steps 4 --optimizer-state-dtype bf16",
                         dir.path());
  EXPECT_NE(moments.exit_code, 0);
  EXPECT_EQ(ProgressLines(moments.out).size(), 0u);
  EXPECT_NE(moments.err.find("zinf.optimizer_state_dtype"), std::string::npos) << moments.err;
}

// The swap file a checkpoint names is not emptied by another run started on the same swap
// directory: refused naming it and the checkpoints, until those are gone.
TEST(CheckpointFlagsTest, AnotherRunDoesNotEmptyASwapFileACheckpointNames) {
  TempDir dir;
  auto first = RunZinf(Tiny(2) + " --offload nvme --swap-dir " + dir / "swap" +
                           " --checkpoint-dir " + dir / "ck",
                       dir.path());
  ASSERT_EQ(first.exit_code, 0) << first.err;
  for (const std::string& extra : {std::string(""), " --checkpoint-dir " + dir / "other"}) {
    auto second = RunZinf(Tiny(2) + " --offload nvme --swap-dir " + dir / "swap" + extra,
                          dir.path());
    EXPECT_NE(second.exit_code, 0) << extra;
    EXPECT_EQ(ProgressLines(second.out).size(), 0u);
    EXPECT_NE(second.err.find(dir / "ck"), std::string::npos) << second.err;
    EXPECT_NE(second.err.find("--resume"), std::string::npos) << second.err;
  }
  // The checkpoint still verifies: nothing was emptied.
  EXPECT_EQ(RunZinf("ckpt verify " + dir / "ck", dir.path()).exit_code, 0);
  fs::remove_all(dir / "ck");
  auto third = RunZinf(Tiny(2) + " --offload nvme --swap-dir " + dir / "swap", dir.path());
  EXPECT_EQ(third.exit_code, 0) << third.err;
}

// Reads the child's stdout until `n` progress lines have appeared (or EOF); returns the text.
std::string ReadUntilSteps(int fd, size_t n, std::chrono::seconds limit) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline && ProgressLines(out).size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof buf);
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

TEST(CheckpointSignalTest, SigtermCommitsACheckpointAndExitsZero) {
  TempDir dir;
  const std::string root = dir / "ckpt";
  int fd = -1;
  const pid_t pid = testing::SpawnZinf(Split(Tiny(100000) + " --offload nvme --swap-dir " + dir / "swap" +
                                " --checkpoint-dir " + root + " --losses " + dir / "a.jsonl"),
                          dir / "err.txt", &fd);
  ASSERT_GT(pid, 0);
  std::string out = ReadUntilSteps(fd, 3, std::chrono::seconds(60));
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  out += Drain(fd);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << ReadFile(dir / "err.txt");
  EXPECT_EQ(WEXITSTATUS(status), 0) << out << ReadFile(dir / "err.txt");
  const size_t steps = ReadJsonLines(dir / "a.jsonl").size();
  const auto cks = Checkpoints(root);
  ASSERT_EQ(cks.size(), 1u) << out;
  EXPECT_EQ(ReadJson(cks.back() + "/manifest.json")["step"].get<uint64_t>(), steps);
  EXPECT_TRUE(fs::exists(dir / "swap/zinf.swap")) << "the swap file a checkpoint names is kept";
}

// A child trains 60 steps (about 0.3 s here) with a checkpoint after every step and is killed
// (SIGKILL) after a random time; then resumed and killed again, ten kills in all, then resumed to
// the end. Every resume starts from the last committed checkpoint, and the run's losses,
// weights and state are the uninterrupted run's.
TEST(CheckpointKillTest, RandomKillsThenResumeMatchTheUninterruptedRun) {
  for (const std::string placement : {"--offload nvme", "--offload cpu"}) {
    SCOPED_TRACE(placement);
    TempDir dir;
    constexpr uint64_t kKillSteps = 60;
    const Reference ref = RunUninterrupted(placement, dir, kKillSteps);
    ASSERT_EQ(ref.losses.size(), kKillSteps);
    const std::string root = dir / "ckpt";
    std::mt19937_64 rng(placement.size() * 7919 + 1);
    // step -> the losses record the killed runs logged for it (a step may run twice: once in
    // the killed run, after its last checkpoint, and again after the resume; both must agree).
    std::map<uint64_t, std::string> seen;
    bool complete = false, saved = false;
    int kills = 0;
    for (int attempt = 0; attempt < 11 && !complete; ++attempt) {
      const bool first = !fs::exists(root) || Checkpoints(root).empty();
      const std::string losses = dir / ("l" + std::to_string(attempt) + ".jsonl");
      const std::string args =
          first ? Tiny(kKillSteps) + " " + placement + " --swap-dir " + dir / "swap" +
                      " --checkpoint-dir " + root + " --checkpoint-every 1 --losses " + losses +
                      " --save " + dir / "w.safetensors"
                : "train --resume " + root + " --losses " + losses + " --save " +
                      dir / "w.safetensors";
      const uint64_t resumed_at =
          first ? 0 : ReadJson(Checkpoints(root).back() + "/manifest.json")["step"].get<uint64_t>();
      if (resumed_at == kKillSteps) {  // killed after its last commit, before it exited
        complete = true;
        break;
      }
      int fd = -1;
      const pid_t pid = testing::SpawnZinf(Split(args), dir / "err.txt", &fd);
      ASSERT_GT(pid, 0);
      // Ten kills, each after 2 to 150 ms: during start-up, a step's optimizer write, a commit,
      // or between; then the run may end (however slow the machine is under load).
      if (attempt < 10) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2 + rng() % 149));
        kill(pid, SIGKILL);
      }
      const std::string out = Drain(fd);
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      if (WIFSIGNALED(status)) {
        ++kills;
      } else {
        ASSERT_EQ(WEXITSTATUS(status), 0) << args << "\n" << out << ReadFile(dir / "err.txt");
        complete = saved = true;
      }
      if (!first) {
        // A resume starts where the last committed checkpoint ended.
        const auto lines = ProgressLines(out);
        if (!lines.empty()) {
          EXPECT_EQ(std::stoull(lines.front().substr(5)), resumed_at + 1) << lines.front();
        }
      }
      if (fs::exists(losses)) {
        for (const std::string& rec : LossRecords({losses})) {
          const uint64_t step = nlohmann::json::parse(rec)["step"].get<uint64_t>();
          EXPECT_EQ(rec, ref.losses.at(step - 1)) << "step " << step << " after a kill";
          seen[step] = rec;
        }
      }
    }
    ASSERT_TRUE(complete) << "never completed";
    std::printf("%s: %d runs killed before one completed\n", placement.c_str(), kills);
    EXPECT_GE(kills, 1) << "no kill landed: the test checked nothing";
    EXPECT_EQ(seen.size(), kKillSteps);
    if (saved) {
      EXPECT_TRUE(ReadFile(dir / "w.safetensors") == ref.weights);
    }
    EXPECT_EQ(ShardHashes(Checkpoints(root).back()), ref.state);
  }
}

// A checkpoint root without room for the checkpoints kept plus the one being written is refused
// at start with the numbers; a disk that fills up during the run (the checkpoint root on a small
// tmpfs, filled after the first commit) stops the run at its next commit with the error, and the
// first checkpoint still resumes.
TEST(CheckpointDiskFullTest, TooLittleRoomIsRefusedAtStartAFullDiskStopsTheRun) {
  TempDir dir;
  const std::string root = dir / "small";
  testing::ScopedTmpfs small(root, "900k");
  if (!small.mounted()) GTEST_SKIP() << "mounting a tmpfs is not permitted here";
  // One checkpoint of --offload cpu state: 28,032 * 12 bytes = 328.5 KiB, and 64 KiB for its
  // manifest: two need 785 KiB, three 1.15 MiB.
  auto refused = RunZinf(Tiny(4) + " --offload cpu --checkpoint-dir " + root + "/ckpt" +
                             " --keep-checkpoints 2",
                         dir.path());
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_EQ(ProgressLines(refused.out).size(), 0u);
  EXPECT_NE(refused.err.find("ResourceExhausted"), std::string::npos) << refused.err;
  EXPECT_NE(refused.err.find(std::to_string(3 * (12 * kParams + (64 << 10)))), std::string::npos)
      << refused.err;

  // Slow copies (a 1 MB/s device link): a step takes about half a second.
  int fd = -1;
  const pid_t pid = testing::SpawnZinf(
      Split(Tiny(40) + " --offload cpu --h2d-gbps 0.001 --checkpoint-dir " + root + "/ckpt" +
            " --checkpoint-every 1"),
      dir / "err.txt", &fd);
  ASSERT_GT(pid, 0);
  const std::string first = root + "/ckpt/step-0000000001/manifest.json";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(first) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(fs::exists(first));
  {
    // Fill what is left.
    std::ofstream filler(root + "/filler", std::ios::binary);
    const std::string mib(1 << 16, 'f');
    while (filler.write(mib.data(), static_cast<std::streamsize>(mib.size()))) {
    }
  }
  const std::string out = Drain(fd);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string err = ReadFile(dir / "err.txt");
  ASSERT_TRUE(WIFEXITED(status)) << err;
  EXPECT_EQ(WEXITSTATUS(status), 1) << out << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_LT(ProgressLines(out).size(), 40u) << "training went on after the failed commit";
  fs::remove(root + "/filler");
  const auto cks = Checkpoints(root + "/ckpt");
  ASSERT_GE(cks.size(), 1u);
  // The last committed one verifies and resumes (into a root with room) to the end.
  const uint64_t at = ReadJson(cks.back() + "/manifest.json")["step"].get<uint64_t>();
  auto resumed = RunZinf("train --resume " + cks.back() + " --checkpoint-dir " + dir / "big" +
                             " --h2d-gbps 0",
                         dir.path());
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("(resumed from step " + std::to_string(at) + ")"), std::string::npos)
      << resumed.out;
}

}  // namespace
}  // namespace zinf
