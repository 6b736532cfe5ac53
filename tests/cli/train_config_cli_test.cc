// `zinf train`'s config (tools/train_config.h) end to end: one set of defaults under a config
// file, --print-config with each value's source, --schedule, and --init taking the model's
// sizes from the file. Tiny runs and --print-config calls, each well under a second.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

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

std::string SourceOf(const std::string& printed, const std::string& key,
                     const std::string& block = "");

// One set of defaults: a config file's keys replace the default job's, the rest stay the
// default job's (batch 8, NVMe offload, 44M/24M budgets), not Config's own (batch 1, nothing
// offloaded, budgets sized from the machine) — except the training semantics DeepSpeed gives a
// config that leaves them out: no scheduler block is a constant lr (not the default job's
// warm-up from 0), no gradient_clipping is no clipping.
TEST(TrainConfigCliTest, AConfigFileStartsFromTheDefaultJob) {
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
  EXPECT_EQ(s.value("device_budget_bytes", 0u), 44u << 20) << s;
  EXPECT_EQ(s.value("pinned_budget_bytes", 0u), 24u << 20) << s;
  auto losses = ReadJsonLines(dir / "losses.jsonl");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0]["lr"].get<double>(), 2e-3) << "DeepSpeed's constant lr, no warm-up";
  EXPECT_EQ(losses[1]["lr"].get<double>(), 2e-3);
  auto printed = RunZinf("train --config " + only_model + " --print-config", dir.path());
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  const nlohmann::json pj = nlohmann::json::parse(printed.out, nullptr, false, true);
  EXPECT_TRUE(pj["scheduler"].is_null()) << printed.out;
  EXPECT_EQ(SourceOf(printed.out, "scheduler"),
            only_model + " (no scheduler block: DeepSpeed's constant lr)");
  EXPECT_EQ(pj["gradient_clipping"], 0.0) << printed.out;
  EXPECT_EQ(SourceOf(printed.out, "gradient_clipping"),
            only_model + " (absent: DeepSpeed's 0, no clipping)");
  // Neither bf16 nor fp16: DeepSpeed's fp32, which zinf does not train; said, not silent.
  EXPECT_EQ(pj["bf16"]["enabled"], true) << printed.out;
  EXPECT_EQ(SourceOf(printed.out, "enabled", "bf16"),
            only_model + " (neither bf16 nor fp16 enabled: DeepSpeed would train in fp32, which "
                         "zinf does not; a bf16 working copy with fp32 master weights)");
  EXPECT_NE(printed.err.find("neither bf16 nor fp16 is enabled, which in DeepSpeed means fp32"),
            std::string::npos)
      << printed.err;
  const std::string with_bf16 = dir / "bf16.json";
  std::ofstream(with_bf16) << "{" << model << R"(, "bf16": {"enabled": true}})";
  auto quiet = RunZinf("train --config " + with_bf16 + " --print-config", dir.path());
  ASSERT_EQ(quiet.exit_code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("neither bf16 nor fp16"), std::string::npos) << quiet.err;
  // Without a file, the default job's schedule and clipping.
  printed = RunZinf("train --print-config", dir.path());
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_EQ(nlohmann::json::parse(printed.out, nullptr, false, true)["scheduler"]["type"],
            "WarmupCosineLR");
  EXPECT_EQ(nlohmann::json::parse(printed.out, nullptr, false, true)["gradient_clipping"], 1.0);
  // An optimizer block is read whole: the lr it leaves out is DeepSpeed's 1e-3, not the
  // default job's 2e-3.
  const std::string opt = dir / "opt.json";
  std::ofstream(opt) << R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": 0.1}}})";
  printed = RunZinf("train --config " + opt + " --print-config", dir.path());
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_EQ(nlohmann::json::parse(printed.out, nullptr, false, true)["optimizer"]["params"]["lr"],
            1e-3) << printed.out;
  EXPECT_EQ(SourceOf(printed.out, "lr"), opt);

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
                     const std::string& block) {
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
TEST(TrainConfigCliTest, PrintConfigNamesWhereEachValueCameFrom) {
  TempDir dir;
  const std::string file = dir / "run.json";
  std::ofstream(file) << R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "gradient_clipping": 0.5, "zinf": {"model": {"layers": 3},
      "budgets": {"pinned_bytes": "auto"}}})";
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
  // "auto" in the file: zinf's choice, asked for by the file (not the default job's 24M).
  EXPECT_EQ(j["zinf"]["budgets"]["pinned_bytes"], "auto");
  EXPECT_EQ(SourceOf(r.out, "pinned_bytes"), file + " (auto)");

  // Read back as a config file, it is the same config.
  const std::string printed = dir / "printed.json";
  std::ofstream(printed) << r.out;
  auto again = RunZinf("train --config " + printed + " --print-config", dir.path());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out, nullptr, false, true), j) << again.out;
  EXPECT_EQ(SourceOf(again.out, "width"), printed);
}

// --preset NAME: the published shape fills every zinf.model key left at its default, the
// source names the preset; a key given that disagrees is refused naming both values; the
// printed config reads back as the same config.
TEST(TrainConfigCliTest, PresetFillsTheModelKeysAndRefusesADisagreeingOne) {
  TempDir dir;
  auto r = RunZinf("train --preset qwen2.5-0.5b --seq-len 256 --device-budget 4G --print-config",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false, true);
  ASSERT_TRUE(j.is_object()) << r.out;
  const nlohmann::json& m = j["zinf"]["model"];
  EXPECT_EQ(m["arch"], "llama");
  EXPECT_EQ(m["layers"], 24);
  EXPECT_EQ(m["width"], 896);
  EXPECT_EQ(m["kv_heads"], 2);
  EXPECT_EQ(m["intermediate"], 4864);
  EXPECT_EQ(m["vocab"], 151936);
  EXPECT_EQ(m["qkv_bias"], true);
  EXPECT_EQ(m["tie_embeddings"], true);
  EXPECT_EQ(m["rope_theta"], 1000000.0);
  EXPECT_EQ(SourceOf(r.out, "intermediate"), "--preset qwen2.5-0.5b");
  EXPECT_EQ(m["seq_len"], 256);
  EXPECT_EQ(SourceOf(r.out, "seq_len"), "--seq-len");  // the training length stays the run's
  const std::string printed = dir / "printed.json";
  std::ofstream(printed) << r.out;
  auto again = RunZinf("train --config " + printed + " --print-config", dir.path());
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(nlohmann::json::parse(again.out, nullptr, false, true)["zinf"]["model"], m);

  r = RunZinf("train --preset llama2-7b --width 1024 --print-config", dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("zinf.model.width: 1024 (from --width) disagrees with --preset "
                       "llama2-7b, whose width is 4096"),
            std::string::npos)
      << r.err;
  r = RunZinf("train --preset llama9-1t --print-config", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("tinyllama-1.1b, llama2-7b"), std::string::npos) << r.err;
}

// --schedule constant: no warm-up, step 1 trains at --lr (the default job warms up from 0);
// the other names pick DeepSpeed's schedulers, keeping the config's parameters.
TEST(TrainConfigCliTest, ScheduleConstantTrainsTheFirstStepAtLr) {
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
TEST(TrainConfigCliTest, InitTakesTheModelSizesFromTheFile) {
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
            nlohmann::json({{"arch", "gpt2"}, {"layers", 2}, {"width", 32}, {"heads", 4},
                            {"seq_len", 16}, {"vocab", 64}}));
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

}  // namespace
}  // namespace zinf
