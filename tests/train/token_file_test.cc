// Token files: nanoGPT and llm.c layouts, format detection, refusals (truncation, header,
// vocabulary), the mapping, and the fingerprint a resume checks.
#include "src/train/token_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/train/data.h"
#include "tests/test_util.h"
#include "tests/train/token_file_util.h"

namespace zinf::train {
namespace {

using zinf::testing::Iota;
using zinf::testing::LlmcBytes;
using zinf::testing::NanoGptBytes;
using zinf::testing::TempDir;
using zinf::testing::WriteBytes;

void ExpectMessageHas(const Status& s, StatusCode code, const std::vector<std::string>& parts) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  for (const auto& part : parts) {
    EXPECT_NE(s.message().find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << s.message();
  }
}

std::vector<int32_t> Tokens(const TokenCorpus& c) {
  std::vector<int32_t> v;
  for (uint64_t i = 0; i < c.size(); ++i) v.push_back(c.token(i));
  return v;
}

std::vector<int32_t> Ints(const std::vector<uint16_t>& v) { return {v.begin(), v.end()}; }

TEST(DataFormatTest, Names) {
  for (DataFormat f :
       {DataFormat::kAuto, DataFormat::kText, DataFormat::kNanoGpt, DataFormat::kLlmc}) {
    auto parsed = ParseDataFormat(DataFormatName(f));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, f);
  }
  ExpectMessageHas(ParseDataFormat("npy").status(), StatusCode::kInvalidArgument,
                   {"\"npy\"", "auto, text, nanogpt or llmc"});
}

TEST(TokenFileTest, NanoGptFileReadsItsUint16Tokens) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 255, 256, 50256, 65535, 7, 513};
  WriteBytes(dir / "train.bin", NanoGptBytes(tokens));
  auto f = TokenFile::Open(dir / "train.bin", DataFormat::kAuto);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->format(), DataFormat::kNanoGpt);
  EXPECT_EQ(f->tokens(), 8u);
  EXPECT_EQ(f->token_bytes(), 2u);
  EXPECT_EQ(f->data_offset(), 0u);
  EXPECT_TRUE(f->buffer()->mapped());
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(LoadToken(f->token_data(), 2, i), tokens[i]);

  auto c = TokenCorpus::FromFile(dir / "train.bin", 65536, 1, 0.25);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(Tokens(*c), Ints(tokens));
  EXPECT_EQ(c->split_size(Split::kTrain), 6u);
  EXPECT_EQ(c->split_size(Split::kValidation), 2u);
}

TEST(TokenFileTest, LlmcFileReadsTheTokensAfterItsHeader) {
  TempDir dir;
  const std::vector<uint16_t> tokens = Iota(300, 40000);
  // Detected by its magic whatever the file's name.
  for (const std::string name : {"shard_000000.bin", "tokens.dat"}) {
    WriteBytes(dir / name, LlmcBytes(tokens));
    auto c = TokenCorpus::FromFile(dir / name, 50257, 16);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->format(), DataFormat::kLlmc) << name;
    EXPECT_EQ(Tokens(*c), Ints(tokens)) << name;
    EXPECT_EQ(c->description().tokens, 300u);
    EXPECT_EQ(c->description().file_bytes, 1024u + 600u);
  }
}

TEST(TokenFileTest, AutoDetection) {
  TempDir dir;
  // An even-sized text file named .txt: text. The same bytes named .bin: nanoGPT tokens.
  const std::string text = "hello, world\n";
  WriteBytes(dir / "a.txt", text + "!");
  WriteBytes(dir / "a.bin", text + "!");
  WriteBytes(dir / "a", text + "!");
  auto t = TokenFile::Open(dir / "a.txt", DataFormat::kAuto);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->format(), DataFormat::kText);
  EXPECT_EQ(t->tokens(), 14u);
  auto n = TokenFile::Open(dir / "a.bin", DataFormat::kAuto);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->format(), DataFormat::kNanoGpt);
  EXPECT_EQ(n->tokens(), 7u);
  auto none = TokenFile::Open(dir / "a", DataFormat::kAuto);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->format(), DataFormat::kText);
  // An explicit format wins over the name and over the magic.
  auto asked = TokenFile::Open(dir / "a.txt", DataFormat::kNanoGpt);
  ASSERT_TRUE(asked.ok());
  EXPECT_EQ(asked->format(), DataFormat::kNanoGpt);
  auto as_text = TokenFile::Open(dir / "a.bin", DataFormat::kText);
  ASSERT_TRUE(as_text.ok());
  EXPECT_EQ(as_text->format(), DataFormat::kText);
  WriteBytes(dir / "l.bin", LlmcBytes(Iota(8, 1)));
  auto raw = TokenFile::Open(dir / "l.bin", DataFormat::kNanoGpt);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->format(), DataFormat::kNanoGpt);
  EXPECT_EQ(raw->tokens(), (1024u + 16u) / 2);
  // Another llm.c magic is not guessed at: refused by name, the explicit choices named.
  WriteBytes(dir / "llama.bin", LlmcBytes(Iota(8, 1), 20240801, 7));
  ExpectMessageHas(TokenFile::Open(dir / "llama.bin", DataFormat::kAuto).status(),
                   StatusCode::kInvalidArgument,
                   {dir / "llama.bin", "20240801", "LLaMA 3", "--data-format nanogpt or text"});
  WriteBytes(dir / "hellaswag.bin", LlmcBytes(Iota(8, 1), 20240522));
  ExpectMessageHas(TokenFile::Open(dir / "hellaswag.bin", DataFormat::kAuto).status(),
                   StatusCode::kInvalidArgument, {"20240522", "eval"});
  EXPECT_TRUE(TokenFile::Open(dir / "llama.bin", DataFormat::kNanoGpt).ok());
}

TEST(TokenFileTest, TruncatedFilesAreRefused) {
  TempDir dir;
  // nanoGPT: an odd byte count, named, whether detected or asked for.
  WriteBytes(dir / "odd.bin", NanoGptBytes(Iota(100, 0)) + "x");
  for (DataFormat f : {DataFormat::kAuto, DataFormat::kNanoGpt}) {
    ExpectMessageHas(TokenFile::Open(dir / "odd.bin", f).status(), StatusCode::kDataLoss,
                     {dir / "odd.bin", "nanogpt", "201 bytes", "odd size"});
  }
  // llm.c: a size that disagrees with header[2], both ways; the header cut short.
  WriteBytes(dir / "short.llmc", LlmcBytes(Iota(100, 0), 20240520, 1, 101));
  ExpectMessageHas(TokenFile::Open(dir / "short.llmc", DataFormat::kAuto).status(),
                   StatusCode::kDataLoss,
                   {dir / "short.llmc", "1224 bytes", "header[2] says 101 tokens", "1226 bytes",
                    "truncated (2 bytes missing)"});
  WriteBytes(dir / "long.llmc", LlmcBytes(Iota(100, 0), 20240520, 1, 99));
  ExpectMessageHas(TokenFile::Open(dir / "long.llmc", DataFormat::kLlmc).status(),
                   StatusCode::kDataLoss,
                   {"1224 bytes", "header[2] says 99 tokens", "1222 bytes", "2 bytes follow"});
  WriteBytes(dir / "header.llmc", LlmcBytes({}).substr(0, 1000));
  ExpectMessageHas(TokenFile::Open(dir / "header.llmc", DataFormat::kAuto).status(),
                   StatusCode::kDataLoss, {dir / "header.llmc", "1000 bytes", "1024 bytes"});
  WriteBytes(dir / "zero.llmc", LlmcBytes({}, 20240520, 1, 0));
  ExpectMessageHas(TokenFile::Open(dir / "zero.llmc", DataFormat::kAuto).status(),
                   StatusCode::kInvalidArgument, {"header[2] (token count) is 0"});
  // Shorter than one sequence and its targets: refused in tokens.
  WriteBytes(dir / "few.bin", NanoGptBytes(Iota(16, 0)));
  ExpectMessageHas(TokenCorpus::FromFile(dir / "few.bin", 64, 16, 0.0).status(),
                   StatusCode::kInvalidArgument, {dir / "few.bin", "16 tokens", "17 tokens"});
  EXPECT_TRUE(TokenCorpus::FromFile(dir / "few.bin", 64, 15, 0.0).ok());
}

TEST(TokenFileTest, LlmcWrongMagicOrVersionIsRefused) {
  TempDir dir;
  WriteBytes(dir / "magic.llmc", LlmcBytes(Iota(10, 0), 12345));
  ExpectMessageHas(TokenFile::Open(dir / "magic.llmc", DataFormat::kLlmc).status(),
                   StatusCode::kInvalidArgument,
                   {dir / "magic.llmc", "header[0] (magic) is 12345", "expected 20240520"});
  WriteBytes(dir / "llama.llmc", LlmcBytes(Iota(10, 0), 20240801, 7));
  ExpectMessageHas(TokenFile::Open(dir / "llama.llmc", DataFormat::kLlmc).status(),
                   StatusCode::kInvalidArgument, {"is 20240801", "LLaMA 3"});
  for (int32_t version : {0, 2, 7}) {
    WriteBytes(dir / "v.bin", LlmcBytes(Iota(10, 0), 20240520, version));
    ExpectMessageHas(TokenFile::Open(dir / "v.bin", DataFormat::kAuto).status(),
                     StatusCode::kInvalidArgument,
                     {dir / "v.bin", "header[1] (version) is " + std::to_string(version),
                      "version 1 (uint16 tokens)"});
  }
}

TEST(TokenFileTest, ATokenOutsideTheVocabularyIsNamedByOffsetAndValue) {
  TempDir dir;
  std::vector<uint16_t> tokens(100, 3);
  tokens[37] = 64;
  tokens[90] = 65;  // only the first is named
  WriteBytes(dir / "t.bin", NanoGptBytes(tokens));
  WriteBytes(dir / "t.llmc", LlmcBytes(tokens));
  ExpectMessageHas(TokenCorpus::FromFile(dir / "t.bin", 64, 8).status(),
                   StatusCode::kInvalidArgument,
                   {dir / "t.bin", "token 64 at byte offset 74 ", "vocabulary of 64"});
  ExpectMessageHas(TokenCorpus::FromFile(dir / "t.llmc", 64, 8).status(),
                   StatusCode::kInvalidArgument,
                   {dir / "t.llmc", "token 64 at byte offset 1098 ", "vocabulary of 64"});
  EXPECT_TRUE(TokenCorpus::FromFile(dir / "t.bin", 66, 8).ok());
  // Past the first read of the scan (4 MiB): the offset counts the chunks before it.
  std::vector<uint16_t> big(3'000'000, 1);
  big[2'500'001] = 50257;
  WriteBytes(dir / "big.llmc", LlmcBytes(big));
  ExpectMessageHas(TokenCorpus::FromFile(dir / "big.llmc", 50257, 8).status(),
                   StatusCode::kInvalidArgument,
                   {"token 50257 at byte offset 5001026 ", "token index 2500001"});
  EXPECT_TRUE(TokenCorpus::FromFile(dir / "big.llmc", 50258, 8).ok());
}

// The file is mapped, not read: building a corpus over 64 MiB of tokens (vocabulary scan
// included) leaves the resident set nearly where it was.
TEST(TokenFileTest, ALargeFileIsMappedNotRead) {
  TempDir dir;
  const uint64_t tokens = 32ull << 20;  // 64 MiB
  {
    std::vector<uint16_t> chunk(1 << 20);
    for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = static_cast<uint16_t>(i % 50257);
    std::ofstream out(dir / "big.bin", std::ios::binary);
    for (uint64_t i = 0; i < tokens / chunk.size(); ++i) {
      out.write(reinterpret_cast<const char*>(chunk.data()), chunk.size() * 2);
    }
  }
  auto rss = [] {
    std::ifstream statm("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    statm >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  };
  const uint64_t before = rss();
  auto c = TokenCorpus::FromFile(dir / "big.bin", 50257, 1024);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GT(c->scan_seconds(), 0.0);
  const uint64_t after = rss();
  EXPECT_LT(after, before + (16u << 20)) << "resident set grew by " << (after - before);
  EXPECT_EQ(c->token(tokens - 1), static_cast<int32_t>((tokens - 1) % (1 << 20) % 50257));
}

TEST(DataSourceTest, FingerprintIsTheSizeAndTheHashesOfBothEnds) {
  TempDir dir;
  // 3 MiB of random tokens: the first and last MiB are distinct ranges.
  std::vector<uint16_t> tokens(3 << 19);
  std::mt19937 rng(5);
  for (uint16_t& t : tokens) t = static_cast<uint16_t>(rng());
  std::string bytes = NanoGptBytes(tokens);
  WriteBytes(dir / "a.bin", bytes);
  auto f = TokenFile::Open(dir / "a.bin", DataFormat::kAuto);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const DataSource& d = f->source();
  EXPECT_EQ(d.format, DataFormat::kNanoGpt);
  EXPECT_EQ(d.path, dir / "a.bin");
  EXPECT_EQ(d.tokens, 3u << 19);
  EXPECT_EQ(d.file_bytes, 3u << 20);
  EXPECT_EQ(d.head_xxh64, XXH64(bytes.data(), 1 << 20, 0));
  EXPECT_EQ(d.tail_xxh64, XXH64(bytes.data() + (2 << 20), 1 << 20, 0));
  EXPECT_NE(d.head_xxh64, d.tail_xxh64);
  EXPECT_NE(d.ToString().find("nanogpt"), std::string::npos) << d.ToString();

  // The same bytes elsewhere are the same data; a changed last MiB is not.
  WriteBytes(dir / "b.bin", bytes);
  auto same = TokenFile::Open(dir / "b.bin", DataFormat::kAuto);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->source().CheckSameAs(d).ok()) << same->source().CheckSameAs(d).ToString();
  bytes[bytes.size() - 10] ^= 1;
  WriteBytes(dir / "c.bin", bytes);
  auto changed = TokenFile::Open(dir / "c.bin", DataFormat::kAuto);
  ASSERT_TRUE(changed.ok());
  ExpectMessageHas(changed->source().CheckSameAs(d), StatusCode::kFailedPrecondition,
                   {dir / "c.bin", dir / "a.bin", "last MiB"});
  WriteBytes(dir / "d.bin", bytes.substr(0, bytes.size() - 2));
  auto shorter = TokenFile::Open(dir / "d.bin", DataFormat::kAuto);
  ASSERT_TRUE(shorter.ok());
  ExpectMessageHas(shorter->source().CheckSameAs(d), StatusCode::kFailedPrecondition,
                   {"tokens 1572863 (recorded 1572864)", "size 3145726 bytes"});

  // A file under 1 MiB: both hashes cover all of it; in memory as on disk.
  const std::string small = "0123456789";
  WriteBytes(dir / "s.txt", small);
  auto s = TokenFile::Open(dir / "s.txt", DataFormat::kAuto);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->source().head_xxh64, XXH64(small.data(), small.size(), 0));
  EXPECT_EQ(s->source().tail_xxh64, s->source().head_xxh64);
  const TokenFile m = TokenFile::FromBytes("mem", small);
  EXPECT_EQ(m.source().head_xxh64, s->source().head_xxh64);
  EXPECT_FALSE(m.buffer()->mapped());
}

TEST(TokenFileTest, MissingOrNotARegularFile) {
  TempDir dir;
  auto missing = TokenFile::Open(dir / "nope.bin", DataFormat::kAuto);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope.bin"), std::string::npos);
  ExpectMessageHas(TokenFile::Open(dir.path(), DataFormat::kAuto).status(),
                   StatusCode::kInvalidArgument, {dir.path(), "not a regular file"});
}

}  // namespace
}  // namespace zinf::train
