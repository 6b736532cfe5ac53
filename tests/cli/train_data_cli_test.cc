// `zinf train --data` on token files end to end (the tiny model, 2 steps, well under a second
// each): nanoGPT and llm.c files written here with their exact layouts, auto detection and
// --data-format, --val-data, and the refusals a user sees (truncated files, an llm.c header
// zinf does not read, a token outside the vocabulary).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/cli/cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"
#include "tests/train/token_file_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::Iota;
using testing::LlmcBytes;
using testing::NanoGptBytes;
using testing::RunZinf;
using testing::TempDir;
using testing::WriteBytes;

// 6000 tokens of the tiny model's vocabulary (64) with some structure to learn.
std::vector<uint16_t> Corpus(uint16_t salt = 0) {
  std::vector<uint16_t> t(6000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 13 + salt) % 64);
  return t;
}

std::vector<double> Losses(const std::string& path) {
  std::vector<double> r;
  for (const nlohmann::json& l : ReadJsonLines(path)) r.push_back(l.value("loss", -1.0));
  return r;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The same tokens as a nanoGPT train.bin and as an llm.c shard train the same: the llm.c reader
// skips exactly its header, and both read uint16 tokens (not the bytes a text file would give).
TEST(TrainDataCliTest, NanoGptAndLlmcFilesTrainTheSame) {
  TempDir dir;
  WriteBytes(dir / "train.bin", NanoGptBytes(Corpus()));
  WriteBytes(dir / "shard_000000.bin", LlmcBytes(Corpus()));
  std::vector<std::vector<double>> losses;
  for (const std::string name : {"train.bin", "shard_000000.bin"}) {
    const std::string lpath = dir / (name + ".jsonl"), summary = dir / (name + ".json");
    auto r = RunZinf(Tiny(2) + " --offload none --data " + dir / name + " --losses " + lpath +
                         " --summary-json " + summary,
                     dir.path());
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    EXPECT_EQ(ProgressLines(r.out).size(), 2u) << r.out;
    const std::string format = name == "train.bin" ? "nanogpt" : "llmc";
    EXPECT_TRUE(Has(r.err, dir / name + " (" + format + ", 6000 tokens; 5400 for training"))
        << r.err;
    EXPECT_TRUE(Has(r.err, "validation: its last 600 tokens")) << r.err;
    const nlohmann::json s = ReadJson(summary);
    EXPECT_EQ(s.value("steps", 0u), 2u) << s;
    EXPECT_NEAR(s.value("first_loss", 0.0), std::log(64.0), 0.5) << s;
    losses.push_back(Losses(lpath));
    ASSERT_EQ(losses.back().size(), 2u);
  }
  EXPECT_EQ(losses[0], losses[1]);

  // The same tokens read as text bytes are other tokens: another loss.
  const std::string lpath = dir / "text.jsonl";
  auto r = RunZinf(Tiny(2) + " --offload none --data " + dir / "train.bin" +
                       " --data-format text --losses " + lpath,
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, "(text, 12000 tokens")) << r.err;
  EXPECT_NE(Losses(lpath), losses[0]);
}

// --data-format names the format; auto reads a file without a .bin name or llm.c magic as text.
TEST(TrainDataCliTest, DataFormatOverridesDetection) {
  TempDir dir;
  WriteBytes(dir / "tokens.u16", NanoGptBytes(Corpus()));
  auto r = RunZinf(Tiny(2) + " --offload none --data " + dir / "tokens.u16", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, "(text, 12000 tokens")) << r.err;
  r = RunZinf(Tiny(2) + " --offload none --data-format nanogpt --data " + dir / "tokens.u16",
              dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, "(nanogpt, 6000 tokens")) << r.err;
  // An llm.c file is found by its magic whatever its name; asked for, its layout is checked.
  WriteBytes(dir / "tokens.dat", LlmcBytes(Corpus()));
  r = RunZinf(Tiny(2) + " --offload none --data " + dir / "tokens.dat", dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, "(llmc, 6000 tokens")) << r.err;
  r = RunZinf(Tiny(2) + " --offload none --data-format llmc --data " + dir / "tokens.u16",
              dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Has(r.err, "header[0] (magic)")) << r.err;

  for (const std::string& bad :
       {" --data-format npy --data " + dir / "tokens.u16", std::string(" --data-format nanogpt")}) {
    r = RunZinf(Tiny(2) + " --offload none" + bad, dir.path());
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
    EXPECT_TRUE(Has(r.err, "--data-format")) << r.err;
    EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;
  }
}

// --val-data: the training file trains whole, the validation loss comes from the other file.
TEST(TrainDataCliTest, ValDataValidatesFromItsOwnFile) {
  TempDir dir;
  WriteBytes(dir / "train.bin", NanoGptBytes(Corpus()));
  const std::vector<uint16_t> other = Corpus(5);
  WriteBytes(dir / "val.bin", NanoGptBytes({other.begin(), other.begin() + 2000}));
  auto r = RunZinf(Tiny(2) + " --offload none --eval-every 1 --data " + dir / "train.bin" +
                       " --val-data " + dir / "val.bin" + " --summary-json " + dir / "s.json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, dir / "train.bin (nanogpt, 6000 tokens; 6000 for training")) << r.err;
  EXPECT_TRUE(
      Has(r.err, "validation: " + dir / "val.bin (nanogpt, 2000 tokens; 2000 for validation"))
      << r.err;
  const nlohmann::json with_file = ReadJson(dir / "s.json");
  ASSERT_TRUE(with_file.contains("val_loss")) << with_file;
  for (const std::string& l : ProgressLines(r.out)) EXPECT_TRUE(Has(l, "(val ")) << l;

  // The held-out tail instead gives another validation loss.
  r = RunZinf(Tiny(2) + " --offload none --eval-every 1 --data " + dir / "train.bin" +
                  " --summary-json " + dir / "t.json",
              dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(ReadJson(dir / "t.json").value("val_loss", -1.0), with_file.value("val_loss", -1.0));

  // Checked as the training file is; refused without --data; unused without --eval-every.
  WriteBytes(dir / "bad.bin", NanoGptBytes({1, 2, 3, 99, 4}) + std::string(40, '\0'));
  r = RunZinf(Tiny(2) + " --offload none --eval-every 1 --data " + dir / "train.bin" +
                  " --val-data " + dir / "bad.bin",
              dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(Has(r.err, dir / "bad.bin")) << r.err;
  EXPECT_TRUE(Has(r.err, "token 99 at byte offset 6 ")) << r.err;
  r = RunZinf(Tiny(2) + " --offload none --val-data " + dir / "val.bin", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(Has(r.err, "--val-data")) << r.err;
  r = RunZinf(
      Tiny(2) + " --offload none --data " + dir / "train.bin" + " --val-data " + dir / "val.bin",
      dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Has(r.err, "not used without --eval-every")) << r.err;
}

// What a user sees for a file zinf will not read: the file, the field and the numbers.
TEST(TrainDataCliTest, RefusesTruncatedAndForeignFilesByName) {
  TempDir dir;
  struct Case {
    std::string name, bytes;
    std::vector<std::string> says;
  };
  const std::vector<uint16_t> c = Corpus();
  const std::vector<Case> cases = {
      {"odd.bin", NanoGptBytes(c) + "x", {"12001 bytes is an odd size"}},
      {"count.bin", LlmcBytes(c, 20240520, 1, 6001), {"13024 bytes", "6001 tokens", "13026 bytes"}},
      {"version.bin", LlmcBytes(c, 20240520, 2), {"header[1] (version) is 2", "version 1"}},
      {"llama.bin", LlmcBytes(c, 20240801, 7), {"20240801", "LLaMA 3"}},
      {"short.bin", NanoGptBytes(Iota(16, 0)), {"16 tokens is too small", "17 tokens"}},
      {"vocab.bin",
       NanoGptBytes(Iota(200, 0)),
       {"token 64 at byte offset 128 ", "vocabulary of 64"}},
  };
  for (const Case& k : cases) {
    WriteBytes(dir / k.name, k.bytes);
    auto r = RunZinf(Tiny(2) + " --offload none --data " + dir / k.name, dir.path());
    EXPECT_EQ(r.exit_code, 1) << k.name << ": " << r.err;
    EXPECT_TRUE(Has(r.err, dir / k.name)) << r.err;
    for (const std::string& s : k.says) EXPECT_TRUE(Has(r.err, s)) << k.name << ": " << r.err;
    EXPECT_TRUE(ProgressLines(r.out).empty()) << r.out;
  }
}

}  // namespace
}  // namespace zinf
