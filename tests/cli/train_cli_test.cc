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

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;
namespace fs = std::filesystem;

constexpr uint64_t kParams = 2 * (12 * 32 * 32 + 13 * 32) + (64 + 16) * 32 + 2 * 32;  // 28,032
constexpr uint64_t kDeviceBudget = 4ull << 20, kPinnedBudget = 16ull << 20;

// The tiny model and its budgets; the placement and step count are the caller's.
std::string Tiny(uint64_t steps) {
  return "train --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 64 --batch 4 --steps " +
         std::to_string(steps) + " --device-budget 4M --pinned-budget 16M --synthetic-bytes 65536";
}
// ... paged through NVMe, with its swap under `dir`.
std::string TinyNvme(uint64_t steps, const TempDir& dir) {
  return Tiny(steps) + " --offload nvme --swap-dir " + dir / "swap";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// The progress lines of a run's stdout ("step    1/3 | loss ... | ETA 0s").
std::vector<std::string> ProgressLines(const std::string& out) {
  std::vector<std::string> r;
  for (const std::string& l : Lines(out)) {
    if (l.rfind("step ", 0) == 0) r.push_back(l);
  }
  return r;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> r;
  for (const std::string& l : Lines(ReadFile(path))) {
    r.push_back(nlohmann::json::parse(l, nullptr, false));
    EXPECT_FALSE(r.back().is_discarded()) << path << ": " << l;
  }
  return r;
}

// The JSON header of a safetensors file (8-byte little-endian length, then the JSON).
nlohmann::json SafetensorsHeader(const std::string& path) {
  const std::string bytes = ReadFile(path);
  if (bytes.size() < 8) return nlohmann::json::value_t::discarded;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
}

// The fields the summary promises, and the budgets kept.
void ExpectSummary(const nlohmann::json& s, uint64_t steps, bool nvme) {
  ASSERT_TRUE(s.is_object()) << s;
  for (const char* k : {"steps", "final_loss", "first_loss", "tokens_per_s", "step_seconds_median",
                        "stall_fraction", "nvme_read_bytes", "nvme_write_bytes",
                        "peak_device_bytes", "device_budget_bytes", "peak_pinned_bytes",
                        "pinned_budget_bytes", "params"}) {
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

// One set of defaults: a config file's keys replace the default job's, the rest stay the
// default job's (batch 8, NVMe offload, 48M/24M budgets, warm-up from lr 0), not Config's own
// (batch 1, nothing offloaded, constant lr, budgets sized from the machine).
TEST(TrainCliTest, AConfigFileStartsFromTheDefaultJob) {
  TempDir dir;
  const std::string model =
      R"("zinf": {"model": {"layers": 2, "width": 32, "heads": 4, "seq_len": 16, "vocab": 64}})";
  const std::string only_model = dir / "model.json";
  std::ofstream(only_model) << "{" << model << "}";
  const std::string run = " --steps 2 --synthetic-bytes 65536 --swap-dir " + dir / "swap" +
                          " --summary-json " + dir / "summary.json" + " --losses " +
                          dir / "losses.jsonl";
  auto r = RunZinf("train --config " + only_model + run, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json s = ReadJson(dir / "summary.json");
  EXPECT_EQ(s.value("params", 0u), kParams) << s;
  EXPECT_EQ(s.value("tokens_per_step", 0u), 8u * 16) << s;
  EXPECT_GT(s.value("nvme_read_bytes", 0u), 0u) << s;
  EXPECT_EQ(s.value("device_budget_bytes", 0u), 48u << 20) << s;
  EXPECT_EQ(s.value("pinned_budget_bytes", 0u), 24u << 20) << s;
  auto losses = ReadJsonLines(dir / "losses.jsonl");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0]["lr"].get<double>(), 0.0) << "not the default job's warm-up";

  // DeepSpeed's keys keep their meaning on top of the defaults: "cpu" is host memory, no NVMe.
  const std::string on_cpu = dir / "cpu.json";
  std::ofstream(on_cpu) << R"({"zero_optimization": {"offload_param": {"device": "cpu"},
      "offload_optimizer": {"device": "cpu"}}, )" << model << "}";
  r = RunZinf("train --config " + on_cpu + run, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  s = ReadJson(dir / "summary.json");
  EXPECT_EQ(s.value("nvme_read_bytes", 1u), 0u) << s;
  EXPECT_EQ(s.value("tokens_per_step", 0u), 8u * 16) << s;
}

// The text after "// " on the first line of `"key": ` in --print-config's output (after the
// line of `"block": `, when given).
std::string SourceOf(const std::string& printed, const std::string& key,
                     const std::string& block = "") {
  bool in_block = block.empty();
  for (const std::string& l : Lines(printed)) {
    if (!in_block) {
      in_block = l.find("\"" + block + "\": ") != std::string::npos;
      continue;
    }
    const size_t at = l.find("\"" + key + "\": ");
    const size_t comment = l.find("// ");
    if (at != std::string::npos && comment != std::string::npos) return l.substr(comment + 3);
  }
  return "<no line for " + key + ">";
}

// --print-config: the merged config with each value's source (a default, the file, a flag over
// the file), without training or creating anything; the output loads back as the same config.
TEST(TrainCliTest, PrintConfigNamesWhereEachValueCameFrom) {
  TempDir dir;
  const std::string file = dir / "run.json";
  std::ofstream(file) << R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "gradient_clipping": 0.5, "zinf": {"model": {"layers": 3}}})";
  const std::string swap = dir / "swap";
  auto r = RunZinf("train --config " + file + " --lr 5e-4 --swap-dir " + swap + " --print-config",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;
  EXPECT_EQ(r.out.find("done:"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(swap)) << "--print-config created the swap directory";
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false,
                                                 /*ignore_comments=*/true);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["optimizer"]["params"]["lr"], 5e-4);
  EXPECT_EQ(SourceOf(r.out, "lr"), "--lr");  // the flag over the file
  EXPECT_EQ(j["gradient_clipping"], 0.5);
  EXPECT_EQ(SourceOf(r.out, "gradient_clipping"), file);
  EXPECT_EQ(j["zinf"]["model"]["layers"], 3);
  EXPECT_EQ(SourceOf(r.out, "layers"), file);
  EXPECT_EQ(j["zinf"]["model"]["width"], 192);  // the default job's
  EXPECT_EQ(SourceOf(r.out, "width"), "default");
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(SourceOf(r.out, "train_micro_batch_size_per_gpu"), "default");
  EXPECT_EQ(j["zero_optimization"]["offload_param"]["nvme_path"], swap);
  EXPECT_EQ(SourceOf(r.out, "nvme_path"), "--swap-dir");

  // Read back as a config file, it is the same config.
  const std::string printed = dir / "printed.json";
  std::ofstream(printed) << r.out;
  auto again = RunZinf("train --config " + printed + " --print-config", dir.path());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out, nullptr, false, true), j) << again.out;
  EXPECT_EQ(SourceOf(again.out, "width"), printed);
}

// --schedule constant: no warm-up, step 1 trains at --lr (the default job warms up from 0);
// the other names pick DeepSpeed's schedulers, keeping the config's parameters.
TEST(TrainCliTest, ScheduleConstantTrainsTheFirstStepAtLr) {
  TempDir dir;
  auto r = RunZinf(Tiny(2) + " --offload none --schedule constant --lr 5e-4 --losses " +
                       dir / "losses.jsonl",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto progress = ProgressLines(r.out);
  ASSERT_EQ(progress.size(), 2u) << r.out;
  EXPECT_NE(progress[0].find("| lr 5.00e-04 |"), std::string::npos) << progress[0];
  const auto losses = ReadJsonLines(dir / "losses.jsonl");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0]["lr"].get<double>(), 5e-4);
  EXPECT_EQ(losses[1]["lr"].get<double>(), 5e-4);

  r = RunZinf("train --schedule constant --print-config", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(nlohmann::json::parse(r.out, nullptr, false, true)["scheduler"].is_null()) << r.out;
  EXPECT_EQ(SourceOf(r.out, "scheduler"), "--schedule");
  for (const auto& [name, type] : {std::pair{"warmup", "WarmupLR"}, {"cosine", "WarmupCosineLR"},
                                   {"decay", "WarmupDecayLR"}}) {
    r = RunZinf(std::string("train --print-config --schedule ") + name, dir.path());
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out, nullptr, false, true);
    EXPECT_EQ(j["scheduler"]["type"], type) << r.out;
    EXPECT_EQ(SourceOf(r.out, "type", "scheduler"), "--schedule") << r.out;
    EXPECT_EQ(j["scheduler"]["params"]["warmup_num_steps"], 10) << r.out;  // the default job's
  }
  r = RunZinf("train --print-config --schedule linear", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--schedule"), std::string::npos) << r.err;
}

// A copy of the safetensors file `from` without its __metadata__ (as another tool writes it).
void WriteWithoutMetadata(const std::string& from, const std::string& to) {
  const std::string bytes = ReadFile(from);
  uint64_t old_n = 0;
  std::memcpy(&old_n, bytes.data(), 8);
  nlohmann::ordered_json h = nlohmann::ordered_json::parse(bytes.substr(8, old_n));
  h.erase("__metadata__");
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::ofstream out(to, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text << bytes.substr(8 + old_n);
}

// --init FILE takes the model's sizes from what FILE records: no size flags needed, and the
// weights come back exactly; a flag or a config key that disagrees is refused naming both
// values and their sources. A file recording no sizes takes them from the flags, and a shape
// that does not fit is refused saying so.
TEST(TrainCliTest, InitTakesTheModelSizesFromTheFile) {
  TempDir dir;
  const std::string a = dir / "a.safetensors";
  auto r = RunZinf(Tiny(2) + " --offload none --save " + a, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json meta = SafetensorsHeader(a)["__metadata__"];
  EXPECT_EQ(meta["n_layer"], "2") << meta;
  EXPECT_EQ(meta["n_embd"], "32") << meta;
  EXPECT_EQ(meta["n_head"], "4") << meta;
  EXPECT_EQ(meta["block_size"], "16") << meta;
  EXPECT_EQ(meta["vocab_size"], "64") << meta;

  // No size flags: the file's model; with lr 0 the weights saved again are the same bytes.
  const std::string run = " --steps 1 --batch 4 --lr 0 --offload none --synthetic-bytes 65536";
  const std::string b = dir / "b.safetensors";
  r = RunZinf("train --init " + a + run + " --save " + b, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(ReadFile(a) == ReadFile(b)) << "the weights differ after --init and lr 0";
  r = RunZinf("train --init " + a + " --print-config", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto printed = nlohmann::json::parse(r.out, nullptr, false, true);
  EXPECT_EQ(printed["zinf"]["model"],
            nlohmann::json({{"layers", 2}, {"width", 32}, {"heads", 4}, {"seq_len", 16},
                            {"vocab", 64}}));
  EXPECT_EQ(SourceOf(r.out, "width"), "--init " + a);
  // A flag that agrees is fine.
  r = RunZinf("train --init " + a + " --width 32 --print-config", dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(SourceOf(r.out, "width"), "--width");

  // Disagreeing: a flag, and a config file's key.
  r = RunZinf("train --init " + a + " --width 64" + run, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  for (const std::string& s : {std::string("zinf.model.width: 64 (from --width)"), a,
                               std::string("n_embd 32")}) {
    EXPECT_NE(r.err.find(s), std::string::npos) << s << " not in: " << r.err;
  }
  EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;
  const std::string heads = dir / "heads.json";
  std::ofstream(heads) << R"({"zinf": {"model": {"heads": 2}}})";
  r = RunZinf("train --init " + a + " --config " + heads + run, dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("zinf.model.heads: 2 (from " + heads + ")"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("n_head 4"), std::string::npos) << r.err;

  // Another tool's file, without metadata: the sizes come from the flags ...
  const std::string bare = dir / "bare.safetensors", c = dir / "c.safetensors";
  WriteWithoutMetadata(a, bare);
  ASSERT_TRUE(SafetensorsHeader(bare).is_object());
  ASSERT_FALSE(SafetensorsHeader(bare).contains("__metadata__"));
  r = RunZinf(Tiny(1) + " --lr 0 --offload none --init " + bare + " --save " + c, dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(ReadFile(a) == ReadFile(c)) << "the weights differ after --init of the bare file";
  // ... and without them the default model's shapes do not fit: refused, saying why.
  r = RunZinf("train --init " + bare + run, dir.path());
  EXPECT_EQ(r.exit_code, 1);
  for (const char* s : {"transformer.wte.weight", "has shape [64, 32], expected [256, 192]",
                        "records no model sizes", "--width"}) {
    EXPECT_NE(r.err.find(s), std::string::npos) << s << " not in: " << r.err;
  }
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

// Ctrl-C ends the run after the current step: exit status 130, the summary printed and written,
// the weights saved.
TEST(TrainCliTest, InterruptEndsTheRunCleanly) {
  TempDir dir;
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  const std::string err_path = dir / "stderr.txt", swap = dir / "swap",
                    save = dir / "w.safetensors", summary = dir / "summary.json",
                    lpath = dir / "losses.jsonl";
  std::vector<std::string> args = {ZINF_BINARY, "train", "--layers", "2", "--width", "32",
                                   "--heads", "4", "--seq-len", "16", "--vocab", "64",
                                   "--batch", "4", "--steps", "2000", "--device-budget", "4M",
                                   "--pinned-budget", "16M", "--synthetic-bytes", "65536",
                                   "--offload", "nvme", "--swap-dir", swap, "--save", save,
                                   "--summary-json", summary, "--losses", lpath};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: stdout to the pipe, stderr to a file, SIGINT at its default and unblocked.
    dup2(out_pipe[1], STDOUT_FILENO);
    close(out_pipe[0]);
    close(out_pipe[1]);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (err >= 0) dup2(err, STDERR_FILENO);
    signal(SIGINT, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  std::string out;
  bool sent = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      ADD_FAILURE() << "zinf train did not end within 60 s of starting; output:\n" << out;
      break;
    }
    pollfd p{out_pipe[0], POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_pipe[0], buf, sizeof buf);
    if (n <= 0) break;  // EOF: the child closed stdout (exited)
    out.append(buf, static_cast<size_t>(n));
    if (!sent && out.find("step ") != std::string::npos &&
        out.find('\n', out.find("step ")) != std::string::npos) {
      ASSERT_EQ(kill(pid, SIGINT), 0);
      sent = true;
    }
  }
  close(out_pipe[0]);
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
