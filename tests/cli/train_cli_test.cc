// `zinf train` end to end on a tiny model (2 blocks of width 32, 28,032 parameters; each run well
// under a second here): the progress lines, the summary and losses files, the trace, --save then
// --init, --data, config errors, fp16, the three placements (nvme, cpu, none) and Ctrl-C.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <map>

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

// The fields the summary promises, and the budgets kept.
void ExpectSummary(const nlohmann::json& s, uint64_t steps, bool nvme) {
  ASSERT_TRUE(s.is_object()) << s;
  for (const char* k : {"steps", "final_loss", "first_loss", "tokens_per_s", "step_seconds_median",
                        "stall_fraction", "nvme_read_bytes", "nvme_write_bytes",
                        "peak_device_bytes", "device_budget_bytes", "peak_pinned_bytes",
                        "pinned_budget_bytes", "params", "h2d_bytes", "d2h_bytes",
                        "device_evictions", "host_evictions", "peak_rss_bytes"}) {
    ASSERT_TRUE(s.contains(k) && s[k].is_number()) << "summary lacks a number " << k << ": " << s;
  }
  EXPECT_EQ(s["steps"].get<uint64_t>(), steps);
  EXPECT_EQ(s["params"].get<uint64_t>(), kParams);
  // An untrained model over 64 tokens: the loss starts near ln 64 = 4.16.
  EXPECT_NEAR(s["first_loss"].get<double>(), std::log(64.0), 0.5);
  EXPECT_TRUE(std::isfinite(s["final_loss"].get<double>()));
  EXPECT_GT(s["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(s["step_seconds_median"].get<double>(), 0);
  EXPECT_GE(s["stall_fraction"].get<double>(), 0);
  EXPECT_LE(s["stall_fraction"].get<double>(), 1);
  if (nvme) {
    EXPECT_GT(s["nvme_read_bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(s["nvme_write_bytes"].get<uint64_t>(), 0u);
  } else {
    EXPECT_EQ(s["nvme_read_bytes"].get<uint64_t>(), 0u);
    EXPECT_EQ(s["nvme_write_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(s["device_budget_bytes"].get<uint64_t>(), kDeviceBudget);
  EXPECT_EQ(s["pinned_budget_bytes"].get<uint64_t>(), kPinnedBudget);
  EXPECT_GT(s["peak_device_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(s["peak_device_bytes"].get<uint64_t>(), kDeviceBudget);
  EXPECT_GT(s["peak_pinned_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(s["peak_pinned_bytes"].get<uint64_t>(), kPinnedBudget);
  EXPECT_GT(s["h2d_bytes"].get<uint64_t>(), 0u);  // weights up
  EXPECT_GT(s["d2h_bytes"].get<uint64_t>(), 0u);  // gradients down
  // The pinned pool is locked: resident whole.
  EXPECT_GE(s["peak_rss_bytes"].get<uint64_t>(), kPinnedBudget);
}

// --pinned-budget auto sizes the pool from what the run wants (every shard's host copy), within
// what the machine allows: a tiny model locks a few hundred KiB, not the 2 GiB cap.
TEST(TrainCliTest, AnAutomaticPinnedBudgetIsWhatTheRunWants) {
  TempDir dir;
  std::string args = Tiny(2);
  args.replace(args.find("--pinned-budget 16M"), 19, "--pinned-budget auto");
  auto r = RunZinf(args + " --offload cpu --summary-json " + dir / "summary.json", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = ReadJson(dir / "summary.json");
  ASSERT_TRUE(s.is_object());
  const uint64_t budget = s["pinned_budget_bytes"].get<uint64_t>();
  EXPECT_LT(budget, 4u << 20) << s;
  EXPECT_GE(budget, s["peak_pinned_bytes"].get<uint64_t>());
  EXPECT_NE(r.err.find("pinned budget auto"), std::string::npos) << r.err;
  // With NVMe it is at least one aio.block_size (1 MiB), which any budget must hold (this tiny
  // model wants less: the run was refused before).
  auto nvme = RunZinf(args + " --offload nvme --swap-dir " + dir / "swap" + " --summary-json " +
                          dir / "nvme.json",
                      dir.path());
  ASSERT_EQ(nvme.exit_code, 0) << nvme.err;
  EXPECT_EQ(ReadJson(dir / "nvme.json")["pinned_budget_bytes"].get<uint64_t>(), 1u << 20);
  args.replace(args.find("--pinned-budget auto"), 20, "--pinned-budget lots");
  auto bad = RunZinf(args, dir.path());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--pinned-budget"), std::string::npos) << bad.err;
}

// The default job's device budget holds the activations and only some blocks' weights: the
// device tier pages within every step (a unit is copied up more than once a step), as the README
// says. (Its old 48 MiB held every unit at once: no device eviction, one copy a step.)
TEST(TrainCliTest, TheDefaultJobPagesTheDeviceTierWithinAStep) {
  TempDir dir;
  auto r = RunZinf("train --steps 2 --swap-dir " + dir / "swap" + " --summary-json " +
                       dir / "summary.json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = ReadJson(dir / "summary.json");
  ASSERT_TRUE(s.is_object());
  const uint64_t param16_bytes = 2 * s["params"].get<uint64_t>();
  EXPECT_GT(s["device_evictions"].get<uint64_t>(), 2u) << s;
  EXPECT_GT(s["h2d_bytes"].get<uint64_t>(), 2 * param16_bytes) << s;
  EXPECT_LE(s["peak_device_bytes"].get<uint64_t>(), s["device_budget_bytes"].get<uint64_t>());
  // The progress line says it too.
  EXPECT_NE(r.out.find("evicted dev "), std::string::npos) << r.out;
}

TEST(TrainCliTest, TinyRunPrintsEveryStepAndWritesSummaryLossesAndTrace) {
  TempDir dir;
  auto r = RunZinf(TinyNvme(3, dir) + " --summary-json " + dir / "summary.json" + " --losses " +
                       dir / "losses.jsonl" + " --trace " + dir / "trace.json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto progress = ProgressLines(r.out);
  ASSERT_EQ(progress.size(), 3u) << r.out;
  for (size_t i = 0; i < progress.size(); ++i) {
    const std::string& l = progress[i];
    const std::string count = std::to_string(i + 1) + "/3 |";  // "step    1/3 | loss ..."
    EXPECT_NE(l.find(count), std::string::npos) << l;
    for (const char* k : {"loss", "tok/s", "stall", "nvme", "ETA"}) {
      EXPECT_NE(l.find(k), std::string::npos) << "no " << k << " in: " << l;
    }
  }
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;

  const nlohmann::json s = ReadJson(dir / "summary.json");
  ExpectSummary(s, 3, /*nvme=*/true);

  const auto losses = ReadJsonLines(dir / "losses.jsonl");
  ASSERT_EQ(losses.size(), 3u);
  for (size_t i = 0; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i].value("step", 0u), i + 1) << losses[i];
    ASSERT_TRUE(losses[i].contains("loss") && losses[i]["loss"].is_number()) << losses[i];
    EXPECT_TRUE(losses[i].contains("lr")) << losses[i];
  }
  EXPECT_EQ(losses.front()["loss"].get<double>(), s["first_loss"].get<double>());
  EXPECT_EQ(losses.back()["loss"].get<double>(), s["final_loss"].get<double>());

  const nlohmann::json trace = ReadJson(dir / "trace.json");
  ASSERT_FALSE(trace.is_discarded()) << "trace is not JSON";
  ASSERT_TRUE(trace.contains("traceEvents") && trace["traceEvents"].is_array());
  int spans = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e.value("ph", "") == "X") {
      EXPECT_TRUE(e.contains("ts") && e.contains("dur") && e.contains("name")) << e;
      ++spans;
    }
  }
  EXPECT_GT(spans, 0) << "no duration events in the trace";
  // The swap space is not left behind.
  EXPECT_TRUE(fs::is_empty(dir / "swap"));
}

// --save writes nanoGPT-named fp32 weights; --init of that file with lr 0 for one step saves the
// same bytes again: what was saved is what was loaded.
TEST(TrainCliTest, SaveThenInitRoundTrips) {
  TempDir dir;
  auto r = RunZinf(TinyNvme(3, dir) + " --save " + dir / "a.safetensors", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json h = SafetensorsHeader(dir / "a.safetensors");
  ASSERT_TRUE(h.is_object()) << "not a safetensors file";
  ASSERT_TRUE(h.contains("transformer.wte.weight")) << h;
  EXPECT_EQ(h["transformer.wte.weight"]["shape"], nlohmann::json::array({64, 32}));
  EXPECT_EQ(h["transformer.wte.weight"]["dtype"], "F32");
  EXPECT_EQ(h["transformer.h.1.mlp.c_proj.weight"]["shape"], nlohmann::json::array({32, 128}));
  EXPECT_EQ(h.size(), 2u + 12u * 2u + 2u + 1u);  // wte, wpe, 12 per block, ln_f, __metadata__

  r = RunZinf(TinyNvme(1, dir) + " --lr 0 --init " + dir / "a.safetensors" + " --save " +
                  dir / "b.safetensors",
              dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ProgressLines(r.out).size(), 1u) << r.out;
  const std::string a = ReadFile(dir / "a.safetensors"), b = ReadFile(dir / "b.safetensors");
  EXPECT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "weights saved after --init with lr 0 differ from the file loaded";
}

TEST(TrainCliTest, TrainsOnATextFileAndNamesAMissingOne) {
  TempDir dir;
  {
    std::ofstream text(dir / "text.txt");
    const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"};
    std::mt19937 rng(1);
    for (int i = 0; i < 4000; ++i) text << words[rng() % 9] << (i % 12 == 11 ? '\n' : ' ');
  }
  // Bytes are tokens: ASCII needs a vocabulary of 128.
  auto r = RunZinf("train --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 128 --batch 4 "
                   "--steps 3 --offload none --data " + dir / "text.txt" + " --summary-json " +
                       dir / "summary.json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ProgressLines(r.out).size(), 3u) << r.out;
  const nlohmann::json s = ReadJson(dir / "summary.json");
  EXPECT_EQ(s.value("steps", 0u), 3u) << s;
  EXPECT_NEAR(s.value("first_loss", 0.0), std::log(128.0), 0.5) << s;

  // The same file with a vocabulary of 64: its letters are not tokens; refused, naming the file.
  r = RunZinf(Tiny(3) + " --offload none --data " + dir / "text.txt", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir / "text.txt"), std::string::npos) << r.err;
  EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;

  const std::string missing = dir / "no-such-corpus.txt";
  r = RunZinf(Tiny(3) + " --offload none --data " + missing, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(missing), std::string::npos) << r.err;
  EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;
}

TEST(TrainCliTest, TakesTheModelFromAConfigAndRefusesATypo) {
  TempDir dir;
  const std::string good = dir / "good.json";
  std::ofstream(good) << R"({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
      "zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": ")"
                      << dir / "swap" << R"("}, "offload_optimizer": {"device": "nvme",
      "nvme_path": ")" << dir / "swap" << R"("}},
      "zinf": {"model": {"layers": 1, "width": 32, "heads": 2, "seq_len": 8, "vocab": 64},
               "budgets": {"device_bytes": "4M", "pinned_bytes": "16M"}}})";
  auto r = RunZinf("train --config " + good + " --steps 2 --synthetic-bytes 65536 --summary-json " +
                       dir / "summary.json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json s = ReadJson(dir / "summary.json");
  EXPECT_EQ(s.value("params", 0u), (12u * 32 * 32 + 13 * 32) + (64u + 8) * 32 + 2 * 32) << s;
  EXPECT_EQ(s.value("tokens_per_step", 0u), 2u * 8) << s;
  EXPECT_EQ(s.value("device_budget_bytes", 0u), kDeviceBudget) << s;
  EXPECT_GT(s.value("nvme_read_bytes", 0u), 0u) << s;

  const std::string typo = dir / "typo.json";
  std::ofstream(typo) << R"({"train_micro_batch_size_per_gpu": 4, "gradient_clippin": 1.0})";
  r = RunZinf(Tiny(3) + " --offload none --config " + typo, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("gradient_clippin"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(typo), std::string::npos) << r.err;
  EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;

  const std::string nested = dir / "nested.json";
  std::ofstream(nested) << R"({"zinf": {"modle": {"layers": 2}}})";
  r = RunZinf(Tiny(3) + " --offload none --config " + nested, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("zinf.modle"), std::string::npos) << r.err;
}

// A flag out of the range the config file's key has is bad usage (exit 2, naming the flag), as
// the same value in a file would be; before anything runs.
TEST(TrainCliTest, RefusesOutOfRangeFlags) {
  TempDir dir;
  for (const char* bad : {"--steps 0", "--batch 0", "--grad-accum 0", "--layers 0", "--seq-len 0",
                          "--vocab 1", "--heads 0", "--width 0", "--lr -1", "--clip -2"}) {
    const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
    // The tiny model's flags without the one under test.
    std::string args = "train --steps 3 --offload none --synthetic-bytes 65536";
    for (const char* f : {"--layers 2", "--width 32", "--heads 4", "--seq-len 16", "--vocab 64",
                          "--batch 4"}) {
      if (std::string(f).rfind(flag + " ", 0) != 0) args += std::string(" ") + f;
    }
    if (flag == "--steps") args.replace(args.find("--steps 3"), 9, "");
    auto r = RunZinf(args + " " + bad, dir.path());
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(flag), std::string::npos) << bad << ": " << r.err;
    EXPECT_TRUE(ProgressLines(r.out).empty()) << bad << ": " << r.out;
  }
}

TEST(TrainCliTest, Fp16RunsWithALossScale) {
  TempDir dir;
  auto r = RunZinf(TinyNvme(3, dir) + " --precision fp16 --summary-json " + dir / "summary.json" +
                       " --losses " + dir / "losses.jsonl",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ProgressLines(r.out).size(), 3u) << r.out;
  ExpectSummary(ReadJson(dir / "summary.json"), 3, /*nvme=*/true);
  for (const auto& l : ReadJsonLines(dir / "losses.jsonl")) {
    EXPECT_GT(l.value("loss_scale", 0.0), 1.0) << l;
  }
}

// Where the state lives changes where bytes go, not the arithmetic: the same losses with the
// state on NVMe, in host memory (cpu) or resident (none), and no NVMe traffic for the last two.
TEST(TrainCliTest, PlacementsAgreeAndOnlyNvmeTouchesTheDisk) {
  TempDir dir;
  std::vector<nlohmann::json> losses;
  for (const std::string placement : {"nvme", "cpu", "none"}) {
    const std::string summary = dir / (placement + ".json"), lpath = dir / (placement + ".jsonl");
    auto r = RunZinf(Tiny(3) + " --offload " + placement + " --swap-dir " + dir / "swap" +
                         " --summary-json " + summary + " --losses " + lpath,
                     dir.path());
    ASSERT_EQ(r.exit_code, 0) << placement << ": " << r.err;
    EXPECT_EQ(ProgressLines(r.out).size(), 3u) << r.out;
    ExpectSummary(ReadJson(summary), 3, /*nvme=*/placement == "nvme");
    const auto l = ReadJsonLines(lpath);
    ASSERT_EQ(l.size(), 3u);
    for (const auto& x : l) losses.push_back(x["loss"]);
  }
  for (size_t i = 3; i < losses.size(); ++i) {
    EXPECT_EQ(losses[i].get<double>(), losses[i % 3].get<double>()) << "step " << i % 3 + 1;
  }
}

// zinf.optimizer_state_dtype bf16: every placement trains alike bit for bit (the moments are
// rounded the same way in memory and on NVMe: stochastically, from the run's seed), the state is 8 bytes a parameter instead of 12,
// the NVMe step moves fewer bytes, and the moments' rounding changes the losses (from step 3:
// the first update uses the unrounded moments, the second sees their rounding first).
TEST(TrainCliTest, Bf16MomentsAgreeAcrossPlacementsInTwoThirdsTheBytes) {
  TempDir dir;
  constexpr int kSteps = 4;
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, nlohmann::json> summaries;
  for (const std::string dtype : {"fp32", "bf16"}) {
    for (const std::string placement : {"nvme", "cpu", "none"}) {
      const std::string key = dtype + " " + placement;
      const std::string summary = dir / (dtype + placement + ".json");
      const std::string lpath = dir / (dtype + placement + ".jsonl");
      auto r = RunZinf(Tiny(kSteps) + " --offload " + placement + " --swap-dir " +
                           dir / ("swap-" + dtype + placement) + " --optimizer-state-dtype " +
                           dtype + " --summary-json " + summary + " --losses " + lpath,
                       dir.path());
      ASSERT_EQ(r.exit_code, 0) << key << ": " << r.err;
      summaries[key] = ReadJson(summary);
      for (const auto& x : ReadJsonLines(lpath)) losses[key].push_back(x["loss"].get<double>());
      ASSERT_EQ(losses[key].size(), static_cast<size_t>(kSteps)) << key;
    }
  }
  for (const std::string placement : {"cpu", "none"}) {
    EXPECT_EQ(losses["bf16 " + placement], losses["bf16 nvme"]) << placement;
    EXPECT_EQ(losses["fp32 " + placement], losses["fp32 nvme"]) << placement;
  }
  EXPECT_EQ(losses["bf16 nvme"][1], losses["fp32 nvme"][1]);
  EXPECT_NE(losses["bf16 nvme"][kSteps - 1], losses["fp32 nvme"][kSteps - 1])
      << "bf16 moments did not change the run: was the setting applied?";
  EXPECT_NEAR(losses["bf16 nvme"][kSteps - 1], losses["fp32 nvme"][kSteps - 1], 0.05);
  EXPECT_EQ(summaries["bf16 nvme"]["optimizer_state_bytes"].get<double>(), 8.0 * kParams);
  EXPECT_EQ(summaries["fp32 nvme"]["optimizer_state_bytes"].get<double>(), 12.0 * kParams);
  EXPECT_LT(summaries["bf16 nvme"]["nvme_read_bytes"].get<uint64_t>(),
            summaries["fp32 nvme"]["nvme_read_bytes"].get<uint64_t>());
  EXPECT_LT(summaries["bf16 nvme"]["nvme_write_bytes"].get<uint64_t>(),
            summaries["fp32 nvme"]["nvme_write_bytes"].get<uint64_t>());
}

// Ctrl-C ends the run after the current step: exit status 130, the summary printed and written,
// the weights saved.
TEST(TrainCliTest, InterruptEndsTheRunCleanly) {
  TempDir dir;
  const std::string err_path = dir / "stderr.txt", swap = dir / "swap",
                    save = dir / "w.safetensors", summary = dir / "summary.json",
                    lpath = dir / "losses.jsonl";
  std::vector<std::string> args = {"train", "--layers", "2", "--width", "32",
                                   "--heads", "4", "--seq-len", "16", "--vocab", "64",
                                   "--batch", "4", "--steps", "2000", "--device-budget", "4M",
                                   "--pinned-budget", "16M", "--synthetic-bytes", "65536",
                                   "--offload", "nvme", "--swap-dir", swap, "--save", save,
                                   "--summary-json", summary, "--losses", lpath};
  int out_fd = -1;
  const pid_t pid = testing::SpawnZinf(args, err_path, &out_fd);
  ASSERT_GT(pid, 0);
  std::string out;
  bool sent = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      ADD_FAILURE() << "zinf train did not end within 60 s of starting; output:\n" << out;
      break;
    }
    pollfd p{out_fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_fd, buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child closed stdout (exited)
    out.append(buf, static_cast<size_t>(n));
    if (!sent && out.find("step ") != std::string::npos &&
        out.find('\n', out.find("step ")) != std::string::npos) {
      ASSERT_EQ(kill(pid, SIGINT), 0);
      sent = true;
    }
  }
  close(out_fd);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  const std::string err = ReadFile(err_path);
  ASSERT_TRUE(sent) << "no progress line before the end; stdout:\n" << out << "\nstderr:\n" << err;
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << "; stderr:\n" << err;
  EXPECT_EQ(WEXITSTATUS(status), 130) << out << err;
  EXPECT_NE(out.find("done: "), std::string::npos) << out;
  const nlohmann::json s = ReadJson(summary);
  ASSERT_TRUE(s.is_object()) << "no summary written";
  const uint64_t steps = s.value("steps", uint64_t{0});
  EXPECT_GE(steps, 1u);
  EXPECT_LT(steps, 2000u) << "the run was not stopped";
  // Every step that ran was reported and logged, and the summary counts exactly those.
  EXPECT_EQ(ProgressLines(out).size(), steps) << out;
  EXPECT_EQ(ReadJsonLines(lpath).size(), steps);
  const nlohmann::json h = SafetensorsHeader(save);
  ASSERT_TRUE(h.is_object()) << "--save file not written or not safetensors";
  EXPECT_TRUE(h.contains("transformer.wte.weight"));
  EXPECT_TRUE(fs::is_empty(swap));
}

}  // namespace
}  // namespace zinf
