// Token sources: the synthetic corpus, file corpora, splits and the batch sampler.
#include "src/train/data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/test_util.h"
#include "tests/train/token_file_util.h"

namespace zinf::train {
namespace {

using zinf::testing::Iota;
using zinf::testing::LlmcBytes;
using zinf::testing::NanoGptBytes;
using zinf::testing::TempDir;
using zinf::testing::WriteBytes;

void ExpectMessageHas(const Status& s, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  for (const auto& part : parts) {
    EXPECT_NE(s.message().find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << s.message();
  }
}

TEST(SyntheticTextTest, GeneratorIsTheStandardOne) {
  // The standard fixes mt19937_64's sequence: the 10000th output of the default seed is this.
  std::mt19937_64 rng;
  rng.discard(9999);
  EXPECT_EQ(rng(), 9981545732273789042ull);
}

TEST(SyntheticTextTest, SpelledOutDistribution) {
  // The first lines of seed 1, derived by hand from std::mt19937_64's raw outputs as the
  // header spells out (op = x % 3, operands = x % 1000, or x % 100 for '*').
  std::mt19937_64 rng(1);
  std::string expected;
  for (int line = 0; line < 3; ++line) {
    uint64_t op = rng() % 3;
    uint64_t m = op == 2 ? 100 : 1000;
    uint64_t a = rng() % m, b = rng() % m;
    if (op == 1 && a < b) std::swap(a, b);
    uint64_t c = op == 0 ? a + b : op == 1 ? a - b : a * b;
    expected += std::to_string(a) + "+-*"[op] + std::to_string(b) + "=" + std::to_string(c) + "\n";
  }
  EXPECT_EQ(TokenCorpus::SyntheticText(1, expected.size()), expected);
}

TEST(SyntheticTextTest, DeterministicAndWellFormed) {
  const std::string a = TokenCorpus::SyntheticText(42, 10000);
  EXPECT_EQ(a.size(), 10000u);
  EXPECT_EQ(a, TokenCorpus::SyntheticText(42, 10000));
  EXPECT_NE(a, TokenCorpus::SyntheticText(43, 10000));
  // A prefix of a longer text: generation does not depend on the length asked for.
  EXPECT_EQ(TokenCorpus::SyntheticText(42, 20000).substr(0, 10000), a);
  EXPECT_EQ(TokenCorpus::SyntheticText(42, 0), "");
  // Every complete line is a correct equation.
  size_t begin = 0, lines = 0;
  std::set<char> ops;
  for (size_t nl = a.find('\n'); nl != std::string::npos; nl = a.find('\n', begin)) {
    std::string line = a.substr(begin, nl - begin);
    begin = nl + 1;
    size_t op = line.find_first_of("+-*");
    size_t eq = line.find('=');
    ASSERT_NE(op, std::string::npos) << line;
    ASSERT_NE(eq, std::string::npos) << line;
    int64_t x = std::stoll(line.substr(0, op)), y = std::stoll(line.substr(op + 1, eq - op - 1));
    int64_t z = std::stoll(line.substr(eq + 1));
    ops.insert(line[op]);
    if (line[op] == '+') {
      EXPECT_EQ(x + y, z) << line;
    } else if (line[op] == '-') {
      EXPECT_EQ(x - y, z) << line;
    } else {
      EXPECT_EQ(x * y, z) << line;
      EXPECT_LT(x, 100);
    }
    EXPECT_GE(z, 0) << line;
    ++lines;
  }
  EXPECT_GT(lines, 500u);
  EXPECT_EQ(ops, (std::set<char>{'+', '-', '*'}));
  for (char ch : a) EXPECT_LE(static_cast<unsigned char>(ch), 61u);
}

TEST(TokenCorpusTest, SplitsAndTokens) {
  auto c = TokenCorpus::Synthetic(7, 1000, 256, 16, 0.1);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->size(), 1000u);
  EXPECT_EQ(c->split_begin(Split::kTrain), 0u);
  EXPECT_EQ(c->split_size(Split::kTrain), 900u);
  EXPECT_EQ(c->split_begin(Split::kValidation), 900u);
  EXPECT_EQ(c->split_size(Split::kValidation), 100u);
  EXPECT_EQ(c->source(), "synthetic(seed=7)");
  EXPECT_EQ(c->token(0), static_cast<unsigned char>(TokenCorpus::SyntheticText(7, 1000)[0]));
  EXPECT_EQ(c->format(), DataFormat::kText);
  EXPECT_EQ(c->description().tokens, 1000u);

  auto no_val = TokenCorpus::Synthetic(7, 100, 256, 16, 0.0);
  ASSERT_TRUE(no_val.ok()) << no_val.status().ToString();
  EXPECT_EQ(no_val->split_size(Split::kValidation), 0u);
}

TEST(TokenCorpusTest, FromFileAndRefusals) {
  TempDir dir;
  const std::string path = dir / "corpus.txt";
  std::string text(300, 'a');
  text[250] = '\xc3';
  std::ofstream(path, std::ios::binary) << text;

  auto c = TokenCorpus::FromFile(path, 256, 8);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->source(), path);
  EXPECT_EQ(c->size(), 300u);
  EXPECT_EQ(c->token(250), 0xc3);
  EXPECT_EQ(c->split_size(Split::kValidation), 30u);

  // A byte outside a small vocabulary: offset and value named.
  ExpectMessageHas(TokenCorpus::FromFile(path, 128, 8).status(), {path, "offset 250", "195", "128"});
  // Too small for one sequence in each split: path, size and the bytes needed named.
  ExpectMessageHas(TokenCorpus::FromFile(path, 256, 40).status(),
                   {path, "300 bytes", "41 bytes", "at least 410 bytes"});
  ExpectMessageHas(TokenCorpus::FromFile(path, 256, 300, 0.0).status(),
                   {path, "300 bytes", "301 bytes", "at least 301 bytes"});
  EXPECT_TRUE(TokenCorpus::FromFile(path, 256, 299, 0.0).ok());
  ExpectMessageHas(TokenCorpus::FromFile(path, 256, 8, 1.5).status(), {"val_fraction 1.5"});
  // val_fraction 1: the whole file validates (a --val-data file).
  auto all_val = TokenCorpus::FromFile(path, 256, 8, 1.0);
  ASSERT_TRUE(all_val.ok()) << all_val.status().ToString();
  EXPECT_EQ(all_val->split_size(Split::kTrain), 0u);
  EXPECT_EQ(all_val->split_begin(Split::kValidation), 0u);
  EXPECT_EQ(all_val->split_size(Split::kValidation), 300u);
  ExpectMessageHas(TokenCorpus::FromFile(path, 256, 300, 1.0).status(),
                   {path, "300 bytes", "whole file", "301 bytes"});
  ExpectMessageHas(TokenCorpus::FromFile(path, 1, 8).status(), {"vocab 1"});
  ExpectMessageHas(TokenCorpus::FromFile(path, 256, 0).status(), {"seq_len 0"});
  auto missing = TokenCorpus::FromFile(dir / "nope.txt", 256, 8);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.txt"), std::string::npos);

  // The synthetic corpus needs '=' (61) in the vocabulary.
  ExpectMessageHas(TokenCorpus::Synthetic(1, 1000, 61, 8).status(), {"synthetic(seed=1)", "61"});
  EXPECT_TRUE(TokenCorpus::Synthetic(1, 1000, 62, 8).ok());
}

TEST(BatchSamplerTest, TargetsAreInputsShiftedByOne) {
  auto c = TokenCorpus::Synthetic(3, 5000, 256, 32);
  ASSERT_TRUE(c.ok());
  auto s = BatchSampler::Create(*c, Split::kTrain, 4, 32, 99);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<int32_t> in(4 * 32), out(4 * 32);
  for (int step = 0; step < 10; ++step) {
    s->Next(in.data(), out.data());
    for (uint32_t r = 0; r < 4; ++r) {
      uint64_t start = s->Start(step, r);
      for (uint32_t t = 0; t < 32; ++t) {
        EXPECT_EQ(in[r * 32 + t], c->token(start + t));
        EXPECT_EQ(out[r * 32 + t], c->token(start + t + 1));
        if (t + 1 < 32) {
          EXPECT_EQ(out[r * 32 + t], in[r * 32 + t + 1]);
        }
      }
    }
  }
  EXPECT_EQ(s->position(), 10u);
}

TEST(BatchSamplerTest, Deterministic) {
  auto c = TokenCorpus::Synthetic(3, 5000, 256, 16);
  ASSERT_TRUE(c.ok());
  auto a = BatchSampler::Create(*c, Split::kTrain, 3, 16, 5);
  auto b = BatchSampler::Create(*c, Split::kTrain, 3, 16, 5);
  auto other = BatchSampler::Create(*c, Split::kTrain, 3, 16, 6);
  ASSERT_TRUE(a.ok() && b.ok() && other.ok());
  std::vector<int32_t> ia(48), ta(48), ib(48), tb(48), io(48), to(48);
  bool any_differs = false;
  for (int i = 0; i < 20; ++i) {
    a->Next(ia.data(), ta.data());
    b->Next(ib.data(), tb.data());
    other->Next(io.data(), to.data());
    EXPECT_EQ(ia, ib);
    EXPECT_EQ(ta, tb);
    any_differs |= ia != io;
  }
  EXPECT_TRUE(any_differs);
  // Random access and Seek give the same batches as Next did.
  std::vector<int32_t> i7(48), t7(48);
  b->Fill(7, i7.data(), t7.data());
  a->Seek(7);
  a->Next(ia.data(), ta.data());
  EXPECT_EQ(ia, i7);
  EXPECT_EQ(ta, t7);
  // Golden start offsets: the sampler's formula is part of its contract.
  auto g = BatchSampler::Create(*c, Split::kTrain, 2, 16, 0);
  ASSERT_TRUE(g.ok());
  const uint64_t starts = c->split_size(Split::kTrain) - 16;
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (uint64_t i = 0; i < 3; ++i) {
    for (uint32_t r = 0; r < 2; ++r) {
      uint64_t x = mix((i * 2 + r + 1) * 0x9E3779B97F4A7C15ull);
      EXPECT_EQ(g->Start(i, r),
                static_cast<uint64_t>((static_cast<unsigned __int128>(x) * starts) >> 64));
    }
  }
}

// 20 uint16 tokens 1000..1019 (not bytes: a byte reader cannot produce them), all training;
// seq_len 4 leaves 16 starts, so row k of the draw starts at the top 4 bits of SplitMix64's k-th
// output from seed 0, the reference sequence 0xe220a8397b1dcdaf (14), 0x6e789e6aa1b965f4 (6),
// 0x06c45d188009454f (0), 0xf88bb8a8724c81ec (15). The same batches from a nanoGPT file and
// from an llm.c file holding the same tokens behind its header.
TEST(BatchSamplerTest, Uint16TokensGiveTheHandComputedBatches) {
  TempDir dir;
  const std::vector<uint16_t> tokens = Iota(20, 1000);
  WriteBytes(dir / "tokens.bin", NanoGptBytes(tokens));
  WriteBytes(dir / "tokens.llmc", LlmcBytes(tokens));
  for (const std::string name : {"tokens.bin", "tokens.llmc"}) {
    SCOPED_TRACE(name);
    auto c = TokenCorpus::FromFile(dir / name, 50257, 4, 0.0);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->format(), name == "tokens.bin" ? DataFormat::kNanoGpt : DataFormat::kLlmc);
    EXPECT_EQ(c->size(), 20u);
    EXPECT_EQ(c->token(0), 1000);
    EXPECT_EQ(c->token(19), 1019);
    auto s = BatchSampler::Create(*c, Split::kTrain, 2, 4, 0);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::vector<int32_t> in(8), out(8);
    s->Next(in.data(), out.data());
    EXPECT_EQ(in, (std::vector<int32_t>{1014, 1015, 1016, 1017, 1006, 1007, 1008, 1009}));
    EXPECT_EQ(out, (std::vector<int32_t>{1015, 1016, 1017, 1018, 1007, 1008, 1009, 1010}));
    s->Next(in.data(), out.data());
    EXPECT_EQ(in, (std::vector<int32_t>{1000, 1001, 1002, 1003, 1015, 1016, 1017, 1018}));
    EXPECT_EQ(out, (std::vector<int32_t>{1001, 1002, 1003, 1004, 1016, 1017, 1018, 1019}));
    EXPECT_EQ(s->position(), 2u);
    // Resume at batch 1: the same batch again.
    s->Seek(1);
    std::vector<int32_t> in1(8), out1(8);
    s->Next(in1.data(), out1.data());
    EXPECT_EQ(in1, in);
    EXPECT_EQ(out1, out);
    // What a checkpoint records: the data and the next batch.
    EXPECT_EQ(s->position(), 2u);
    EXPECT_EQ(s->source().path, dir / name);
    EXPECT_EQ(s->source().format, c->format());
    EXPECT_EQ(s->source().tokens, 20u);
    EXPECT_EQ(s->split_begin(), 0u);
    EXPECT_EQ(s->split_size(), 20u);
  }
}

// --val-data: the training file trains whole and the validation batches come from the other
// file; without it the training file's tail validates.
TEST(LoadTrainingDataTest, AValidationFileLeavesTheTrainingFileWhole) {
  TempDir dir;
  const std::string train = dir / "train.bin", val = dir / "val.bin";
  WriteBytes(train, NanoGptBytes(Iota(400, 0)));
  WriteBytes(val, NanoGptBytes(Iota(100, 2000)));
  auto d = LoadTrainingData({.path = train, .val_path = val}, 4096, 8);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->train.source(), train);
  EXPECT_EQ(d->train.split_size(Split::kTrain), 400u);
  EXPECT_EQ(d->train.split_size(Split::kValidation), 0u);
  EXPECT_EQ(d->validation.source(), val);
  EXPECT_EQ(d->validation.split_begin(Split::kValidation), 0u);
  EXPECT_EQ(d->validation.split_size(Split::kValidation), 100u);
  auto s = BatchSampler::Create(d->validation, Split::kValidation, 4, 8, 1);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  std::vector<int32_t> in(32), out(32);
  for (uint64_t i = 0; i < 50; ++i) {
    s->Fill(i, in.data(), out.data());
    for (int32_t t : in) ASSERT_GE(t, 2000);  // from val.bin only
    for (int32_t t : out) ASSERT_GE(t, 2000);
  }

  auto tail = LoadTrainingData({.path = train}, 4096, 8);
  ASSERT_TRUE(tail.ok()) << tail.status().ToString();
  EXPECT_EQ(tail->train.split_size(Split::kTrain), 360u);
  EXPECT_EQ(tail->validation.source(), train);
  EXPECT_EQ(tail->validation.split_begin(Split::kValidation), 360u);
  EXPECT_EQ(tail->validation.split_size(Split::kValidation), 40u);

  // The validation file is checked as the training file is: its size and its tokens.
  ExpectMessageHas(LoadTrainingData({.path = train, .val_path = val}, 4096, 100).status(),
                   {val, "100 tokens", "whole file", "101 tokens"});
  ExpectMessageHas(LoadTrainingData({.path = train, .val_path = val}, 2050, 8).status(),
                   {val, "token 2050", "byte offset 100"});
}

TEST(BatchSamplerTest, ValidationIsRepeatableAndDisjointFromTraining) {
  auto c = TokenCorpus::Synthetic(11, 4000, 256, 24, 0.25);
  ASSERT_TRUE(c.ok());
  const uint64_t boundary = c->split_begin(Split::kValidation);
  ASSERT_EQ(boundary, 3000u);
  auto train = BatchSampler::Create(*c, Split::kTrain, 8, 24, 1);
  auto val = BatchSampler::Create(*c, Split::kValidation, 8, 24, 1);
  ASSERT_TRUE(train.ok() && val.ok());
  uint64_t lowest_val = UINT64_MAX, highest_train_end = 0;
  for (uint64_t i = 0; i < 500; ++i) {
    for (uint32_t r = 0; r < 8; ++r) {
      // The last byte read (the last target) is start + 24.
      highest_train_end = std::max(highest_train_end, train->Start(i, r) + 24);
      lowest_val = std::min(lowest_val, val->Start(i, r));
      EXPECT_LE(val->Start(i, r) + 24, c->size() - 1);
    }
  }
  EXPECT_LT(highest_train_end, boundary);
  EXPECT_GE(lowest_val, boundary);
  // Both ends of each split are reachable over enough draws.
  EXPECT_GT(highest_train_end, boundary - 20);
  EXPECT_LT(lowest_val, boundary + 20);

  // Two evaluations see the same batches.
  std::vector<int32_t> in1(8 * 24), t1(8 * 24), in2(8 * 24), t2(8 * 24);
  std::vector<std::vector<int32_t>> first;
  for (int i = 0; i < 3; ++i) {
    val->Next(in1.data(), t1.data());
    first.push_back(in1);
  }
  val->Seek(0);
  for (int i = 0; i < 3; ++i) {
    val->Next(in2.data(), t2.data());
    EXPECT_EQ(in2, first[i]);
  }
}

TEST(BatchSamplerTest, Refusals) {
  auto c = TokenCorpus::Synthetic(1, 1000, 256, 8, 0.05);  // validation: 50 bytes
  ASSERT_TRUE(c.ok());
  ExpectMessageHas(BatchSampler::Create(*c, Split::kValidation, 2, 50, 0).status(),
                   {"synthetic(seed=1)", "validation", "50 bytes", "needs 51"});
  EXPECT_TRUE(BatchSampler::Create(*c, Split::kValidation, 2, 49, 0).ok());
  ExpectMessageHas(BatchSampler::Create(*c, Split::kTrain, 0, 8, 0).status(), {"batch size 0"});
  ExpectMessageHas(BatchSampler::Create(*c, Split::kTrain, 2, 0, 0).status(), {"seq_len 0"});
  auto none = TokenCorpus::Synthetic(1, 100, 256, 8, 0.0);
  ASSERT_TRUE(none.ok());
  ExpectMessageHas(BatchSampler::Create(*none, Split::kValidation, 1, 8, 0).status(),
                   {"validation", "0 bytes"});
}

TEST(BatchSamplerTest, OutlivesItsCorpus) {
  std::vector<int32_t> in(16), out(16);
  auto s = [] {
    auto c = TokenCorpus::Synthetic(2, 500, 256, 16);
    return BatchSampler::Create(*c, Split::kTrain, 1, 16, 3);
  }();
  ASSERT_TRUE(s.ok());
  s->Next(in.data(), out.data());
  const std::string text = TokenCorpus::SyntheticText(2, 500);
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(in[t], static_cast<unsigned char>(text[s->Start(0, 0) + t]));
  }
}

}  // namespace
}  // namespace zinf::train
