// safetensors: round trip, the reference writer's exact bytes, every refusal of the reader.
#include "src/train/safetensors.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_util.h"

namespace zinf::train {
namespace {

using zinf::testing::TempDir;

std::string Le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A file with `header` (padded to 8) and `buffer_bytes` bytes of buffer.
void WriteRaw(const std::string& path, std::string header, uint64_t buffer_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  WriteBytes(path, Le64(header.size()) + header + std::string(buffer_bytes, '\x5a'));
}

// The JSON object of the entries given.
std::string Obj(std::initializer_list<std::string> entries) {
  std::string s = "{";
  for (const auto& e : entries) {
    if (s.size() > 1) s += ',';
    s += e;
  }
  s += '}';
  return s;
}

// Expects Open(path) to fail with `code` and a message holding each of `parts`.
void ExpectRefused(const std::string& path, StatusCode code,
                   const std::vector<std::string>& parts) {
  auto f = SafetensorsFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), code) << f.status().ToString();
  for (const auto& part : parts) {
    EXPECT_NE(f.status().message().find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << f.status().message();
  }
}

TEST(SafetensorsTest, RoundTrip) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[i] = 0.5f * i - 1.0f;
  std::vector<uint16_t> bf = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80};  // 5: odd on purpose
  int32_t scalar = -7;
  std::vector<double> d = {3.25, -1e300};
  std::vector<TensorToWrite> tensors = {
      {"h.0.attn.w", Dtype::kBF16, {5}, bf.data()}, {"wte", Dtype::kF32, {2, 3}, w.data()},
      {"step", Dtype::kI32, {}, &scalar},           {"empty", Dtype::kU8, {0, 4}, nullptr},
      {"moments", Dtype::kF64, {2}, d.data()},
  };
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}, {"step", "12"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata(), (SafetensorsMetadata{{"format", "pt"}, {"step", "12"}}));
  // The reference layout: widest dtype first, then by name.
  std::vector<std::string> names;
  for (const auto& t : f->tensors()) {
    names.push_back(t.name);
    EXPECT_EQ((f->data_offset() + t.begin) % DtypeSize(t.dtype), 0u) << t.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"moments", "wte", "step", "h.0.attn.w", "empty"}));
  EXPECT_EQ(f->header_bytes() % 8, 0u);

  const SafetensorsTensor* t = f->Find("wte");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, Dtype::kF32);
  EXPECT_EQ(t->shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(t->elements(), 6u);
  std::vector<float> w2(6);
  ASSERT_TRUE(f->Read("wte", w2.data(), 24).ok());
  EXPECT_EQ(w2, w);
  std::vector<uint16_t> bf2(5);
  ASSERT_TRUE(f->Read("h.0.attn.w", bf2.data(), 10).ok());
  EXPECT_EQ(bf2, bf);
  int32_t scalar2 = 0;
  ASSERT_TRUE(f->Read("step", &scalar2, 4).ok());
  EXPECT_EQ(scalar2, -7);
  std::vector<double> d2(2);
  ASSERT_TRUE(f->Read("moments", d2.data(), 16).ok());
  EXPECT_EQ(d2, d);
  EXPECT_EQ(f->Find("empty")->bytes(), 0u);
  EXPECT_TRUE(f->Read("empty", nullptr, 0).ok());

  // Moving keeps the descriptor usable.
  SafetensorsFile moved = std::move(*f);
  ASSERT_TRUE(moved.Read("wte", w2.data(), 24).ok());
  EXPECT_EQ(w2, w);

  auto missing = moved.Read("nope", w2.data(), 24);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(path), std::string::npos);
  auto wrong = moved.Read("wte", w2.data(), 20);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("24 bytes"), std::string::npos) << wrong.message();
}

TEST(SafetensorsTest, SameBytesWhateverTheOrderGiven) {
  TempDir dir;
  float a = 1.0f;
  uint16_t b = 0x3c00;
  ASSERT_TRUE(
      WriteSafetensors(dir / "1", {{"a", Dtype::kF32, {1}, &a}, {"b", Dtype::kF16, {1}, &b}}).ok());
  ASSERT_TRUE(
      WriteSafetensors(dir / "2", {{"b", Dtype::kF16, {1}, &b}, {"a", Dtype::kF32, {1}, &a}}).ok());
  EXPECT_EQ(ReadAll(dir / "1"), ReadAll(dir / "2"));
}

// The bytes are built here by hand from the format's definition; the first case is also the
// reference implementation's own test vector (huggingface/safetensors test_serialization).
TEST(SafetensorsTest, ByteExact) {
  TempDir dir;
  const float values[6] = {0, 1, 2, 3, 4, 5};
  ASSERT_TRUE(WriteSafetensors(dir / "a", {{"attn.0", Dtype::kF32, {1, 2, 3}, values}}).ok());
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);  // already a multiple of 8: no padding
  std::string expected = Le64(64) + header;
  for (float v : values) expected.append(reinterpret_cast<const char*>(&v), 4);
  EXPECT_EQ(ReadAll(dir / "a"), expected);
  const unsigned char reference[] = {
      64, 0,  0,   0,   0,   0,   0,   0,   123, 34,  97,  116, 116, 110, 46,  48,
      34, 58, 123, 34,  100, 116, 121, 112, 101, 34,  58,  34,  70,  51,  50,  34,
      44, 34, 115, 104, 97,  112, 101, 34,  58,  91,  49,  44,  50,  44,  51,  93,
      44, 34, 100, 97,  116, 97,  95,  111, 102, 102, 115, 101, 116, 115, 34,  58,
      91, 48, 44,  50,  52,  93,  125, 125, 0,   0,   0,   0,   0,   0,   128, 63,
      0,  0,  0,   64,  0,   0,   64,  64,  0,   0,   128, 64,  0,   0,   160, 64};
  EXPECT_EQ(ReadAll(dir / "a"),
            std::string(reinterpret_cast<const char*>(reference), sizeof(reference)));

  // Metadata first, padding with spaces, two dtypes (the wider one's data first).
  float one = 1.0f;
  uint16_t half = 0x3c00;
  ASSERT_TRUE(WriteSafetensors(dir / "b",
                               {{"b", Dtype::kBF16, {1}, &half}, {"a", Dtype::kF32, {1}, &one}},
                               {{"framework", "pt"}})
                  .ok());
  std::string h2 =
      R"({"__metadata__":{"framework":"pt"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}})";
  const size_t pad = (8 - h2.size() % 8) % 8;
  h2.append(pad, ' ');
  std::string expected2 = Le64(h2.size()) + h2 + std::string("\x00\x00\x80\x3f\x00\x3c", 6);
  EXPECT_EQ(ReadAll(dir / "b"), expected2);

  // No tensors, metadata only: the reference's test_empty vector (40 bytes).
  ASSERT_TRUE(WriteSafetensors(dir / "c", {}, {{"framework", "pt"}}).ok());
  EXPECT_EQ(ReadAll(dir / "c"), Le64(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
  ASSERT_TRUE(WriteSafetensors(dir / "d", {}).ok());
  EXPECT_EQ(ReadAll(dir / "d"), Le64(8) + "{}      ");
  EXPECT_TRUE(SafetensorsFile::Open(dir / "d").ok());
}

TEST(SafetensorsTest, ReaderAcceptsAnyHeaderOrder) {
  TempDir dir;
  const std::string path = dir / "x.safetensors";
  // Entries out of offset order, an unknown key in an entry, metadata last, trailing spaces.
  std::string header =
      R"({"second":{"shape":[2],"dtype":"I16","data_offsets":[4,8],"extra":1},)"
      R"("first":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  WriteBytes(path, Le64(header.size()) + header + "ABCD" + std::string("\x01\x00\x02\x00", 4));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "first");
  EXPECT_EQ(f->tensors()[1].name, "second");
  EXPECT_EQ(f->metadata().at("k"), "v");
  char first[4];
  ASSERT_TRUE(f->Read("first", first, 4).ok());
  EXPECT_EQ(std::string(first, 4), "ABCD");
  int16_t second[2];
  ASSERT_TRUE(f->Read("second", second, 4).ok());
  EXPECT_EQ(second[0], 1);
  EXPECT_EQ(second[1], 2);
}

TEST(SafetensorsTest, RefusesBadFiles) {
  TempDir dir;
  const std::string p = dir / "bad.safetensors";
  auto entry = [](std::string name, std::string dtype, std::string shape, uint64_t b, uint64_t e) {
    return fmt::format(R"("{}":{{"dtype":"{}","shape":{},"data_offsets":[{},{}]}})", name, dtype,
                       shape, b, e);
  };

  EXPECT_EQ(SafetensorsFile::Open(dir / "missing").status().code(), StatusCode::kNotFound);

  WriteBytes(p, "abc");
  ExpectRefused(p, StatusCode::kDataLoss, {p, "3 bytes"});

  WriteBytes(p, Le64(1000) + "{}      ");
  ExpectRefused(p, StatusCode::kDataLoss, {p, "header length 1000", "16 bytes"});

  WriteBytes(p, Le64(100'000'001) + "{}      ");
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "100000001", "100000000"});

  WriteRaw(p, R"({"w":{"dtype":"F32",)", 0);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "not valid JSON"});

  WriteRaw(p, "[1,2]", 0);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "expected a JSON object"});

  WriteRaw(p, Obj({entry("w", "F33", "[2]", 0, 8)}), 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "\"F33\"", "unknown"});

  WriteRaw(p, Obj({entry("w", "F32", "[2,3]", 0, 20)}), 20);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "[2, 3]", "24 bytes", "[0, 20]"});

  WriteRaw(p, Obj({entry("w", "F32", "[4294967296,4294967296,4294967296]", 0, 8)}), 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "overflows"});

  WriteRaw(p, R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "-2"});

  WriteRaw(p, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "data_offsets"});

  WriteRaw(p, R"({"w":{"dtype":"F32","shape":[2]}})", 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "data_offsets is missing"});

  WriteRaw(p, Obj({entry("w", "F32", "[0]", 8, 4)}), 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "end before begin"});

  WriteRaw(p, Obj({entry("w", "F32", "[4]", 0, 16)}), 12);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"w\"", "[0, 16]", "12 bytes"});

  WriteRaw(p, Obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12)}), 12);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"b\"", "overlap", "\"a\""});

  WriteRaw(p, Obj({entry("a", "F32", "[1]", 0, 4), entry("b", "F32", "[1]", 8, 12)}), 12);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"b\"", "[4, 8)"});

  WriteRaw(p, Obj({entry("a", "F32", "[1]", 0, 4)}), 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "[4, 8)", "no tensor"});

  WriteRaw(p, Obj({entry("a", "F32", "[1]", 0, 4), entry("a", "F32", "[1]", 4, 8)}), 8);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"a\"", "twice"});

  WriteRaw(p, R"({"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})", 4);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "\"dtype\"", "\"a\"", "twice"});

  WriteRaw(p, R"({"__metadata__":{"step":12}})", 0);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "__metadata__", "\"step\"", "12", "string"});

  WriteRaw(p, R"({"__metadata__":["x"]})", 0);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "__metadata__"});

  WriteRaw(p, "{\"w\xff\":1}", 0);
  ExpectRefused(p, StatusCode::kInvalidArgument, {p, "not valid JSON"});
}

TEST(SafetensorsTest, WriterRefusesAndLeavesNothing) {
  TempDir dir;
  const std::string p = dir / "w.safetensors";
  float x = 0;
  auto s = WriteSafetensors(p, {{"a", Dtype::kF32, {1}, &x}, {"a", Dtype::kF32, {1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("\"a\" given twice"), std::string::npos) << s.message();
  s = WriteSafetensors(p, {{"__metadata__", Dtype::kF32, {1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  s = WriteSafetensors(p, {{"a", Dtype::kF32, {3}, nullptr}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("12 bytes"), std::string::npos) << s.message();
  s = WriteSafetensors(p, {{"", Dtype::kF32, {1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(p));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));

  s = WriteSafetensors(dir / "no/such/dir/w.safetensors", {{"a", Dtype::kF32, {1}, &x}});
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

TEST(SafetensorsTest, RewriteReplacesWholeFile) {
  TempDir dir;
  const std::string p = dir / "ckpt.safetensors";
  std::vector<float> big(1000, 1.0f), small(2, 2.0f);
  ASSERT_TRUE(WriteSafetensors(p, {{"w", Dtype::kF32, {1000}, big.data()}}).ok());
  ASSERT_TRUE(WriteSafetensors(p, {{"w", Dtype::kF32, {2}, small.data()}}).ok());
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->Find("w")->shape, (std::vector<uint64_t>{2}));
  // A stale temporary at the old fixed name is neither read nor touched.
  WriteBytes(p + ".tmp", "garbage");
  ASSERT_TRUE(WriteSafetensors(p, {{"w", Dtype::kF32, {2}, small.data()}}).ok());
  EXPECT_EQ(ReadAll(p + ".tmp"), "garbage");
  EXPECT_TRUE(SafetensorsFile::Open(p).ok());
}

TEST(SafetensorsTest, DtypeNames) {
  for (Dtype d : {Dtype::kBool, Dtype::kU8, Dtype::kI8, Dtype::kF8E5M2, Dtype::kF8E4M3, Dtype::kI16,
                  Dtype::kU16, Dtype::kF16, Dtype::kBF16, Dtype::kI32, Dtype::kU32, Dtype::kF32,
                  Dtype::kF64, Dtype::kI64, Dtype::kU64}) {
    auto parsed = ParseDtype(DtypeName(d));
    ASSERT_TRUE(parsed.ok()) << DtypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DtypeSize(Dtype::kBF16), 2u);
  EXPECT_EQ(DtypeSize(Dtype::kF64), 8u);
  EXPECT_FALSE(ParseDtype("f32").ok());
}

// Interoperability with the reference implementation, when /usr/bin/python3 has it.
TEST(SafetensorsTest, ReferenceImplementationReadsAndWrites) {
  if (std::system("/usr/bin/python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no safetensors module";
  }
  TempDir dir;
  std::vector<float> w = {1.5f, -2.0f, 3.25f, 0.0f};
  std::vector<int32_t> ids = {7, 8, 9};
  ASSERT_TRUE(WriteSafetensors(
                  dir / "ours.safetensors",
                  {{"w", Dtype::kF32, {2, 2}, w.data()}, {"ids", Dtype::kI32, {3}, ids.data()}},
                  {{"who", "zinf"}})
                  .ok());
  const std::string script = dir / "check.py";
  std::ofstream(script) << fmt::format(R"(
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file
with safe_open("{0}/ours.safetensors", framework="np") as f:
    assert f.metadata() == {{"who": "zinf"}}, f.metadata()
    assert f.get_tensor("w").tolist() == [[1.5, -2.0], [3.25, 0.0]]
    assert f.get_tensor("ids").dtype == np.int32
    assert f.get_tensor("ids").tolist() == [7, 8, 9]
save_file({{"z": np.arange(5, dtype=np.float64), "b": np.ones((2, 3), dtype=np.float16)}},
          "{0}/theirs.safetensors", metadata={{"format": "np"}})
)",
                                       dir.path());
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script).c_str()), 0);
  auto f = SafetensorsFile::Open(dir / "theirs.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->metadata().at("format"), "np");
  std::vector<double> z(5);
  ASSERT_TRUE(f->Read("z", z.data(), 40).ok());
  EXPECT_EQ(z, (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(f->Find("b")->dtype, Dtype::kF16);
  EXPECT_EQ(f->Find("b")->shape, (std::vector<uint64_t>{2, 3}));
}

}  // namespace
}  // namespace zinf::train

namespace zinf::train {
namespace {

using zinf::testing::TempDir;

// The names in `dir`, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Regression: the writer opened the fixed name "<path>.tmp" with O_CREAT|O_TRUNC and followed a
// symlink planted there, truncating and overwriting whatever it pointed at.
TEST(SafetensorsTempFileTest, ASymlinkAtTheOldTempNameIsNotFollowed) {
  TempDir dir, elsewhere;
  const std::string p = dir / "w.safetensors";
  const std::string victim = elsewhere / "victim";
  WriteBytes(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), (p + ".tmp").c_str()), 0);
  std::vector<float> w(64, 1.5f);
  ASSERT_TRUE(WriteSafetensors(p, {{"w", Dtype::kF32, {64}, w.data()}}).ok());
  EXPECT_EQ(ReadAll(victim), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(p + ".tmp"));
  EXPECT_FALSE(std::filesystem::is_symlink(p));
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->Find("w")->shape, (std::vector<uint64_t>{64}));
}

// Regression: two writers of one path shared "<path>.tmp": their bytes interleaved in one file
// and the second rename failed (ENOENT) or published the mix.
TEST(SafetensorsTempFileTest, ConcurrentSavesToOnePathDoNotCollide) {
  TempDir dir;
  const std::string p = dir / "ckpt.safetensors";
  std::vector<float> a(100000, 1.0f);
  std::vector<double> b(70000, 2.0);
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex mu;
  auto writer = [&](bool is_a) {
    for (int i = 0; i < 20; ++i) {
      Status s = is_a ? WriteSafetensors(p, {{"a", Dtype::kF32, {100000}, a.data()}})
                      : WriteSafetensors(p, {{"b", Dtype::kF64, {70000}, b.data()}});
      if (!s.ok()) {
        errors++;
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = s.ToString();
      }
    }
  };
  std::thread ta(writer, true), tb(writer, false);
  ta.join();
  tb.join();
  EXPECT_EQ(errors.load(), 0) << first_error;
  // Whole, one of the two.
  auto f = SafetensorsFile::Open(p);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->tensors().size(), 1u);
  const std::string name = f->tensors()[0].name;
  if (name == "a") {
    std::vector<float> back(100000);
    ASSERT_TRUE(f->Read("a", back.data(), back.size() * 4).ok());
    EXPECT_EQ(back, a);
  } else {
    std::vector<double> back(70000);
    ASSERT_TRUE(f->Read("b", back.data(), back.size() * 8).ok());
    EXPECT_EQ(back, b);
  }
  EXPECT_EQ(Names(dir.path()), (std::vector<std::string>{"ckpt.safetensors"}));
}

TEST(SafetensorsTempFileTest, TheTempFileNeverSurvivesAFailedSave) {
  TempDir dir;
  // A write that fails half way: the second tensor's memory is not readable (EFAULT).
  const std::string p = dir / "w.safetensors";
  std::vector<float> ok(1024, 1.0f);
  const void* unreadable = reinterpret_cast<const void*>(uintptr_t{16});
  Status s = WriteSafetensors(p, {{"a", Dtype::kF32, {1024}, ok.data()},
                                  {"b", Dtype::kF32, {1024}, unreadable}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(p + ".tmp."), std::string::npos) << s.message();
  EXPECT_TRUE(Names(dir.path()).empty());
  // A rename that fails: a non-empty directory holds the destination's name.
  std::filesystem::create_directories(dir / "d.safetensors/inside");
  s = WriteSafetensors(dir / "d.safetensors", {{"a", Dtype::kF32, {1024}, ok.data()}});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rename"), std::string::npos) << s.message();
  EXPECT_EQ(Names(dir.path()), (std::vector<std::string>{"d.safetensors"}));
}

TEST(SafetensorsTempFileTest, TheFileGetsTheUsualModeForThisUmask) {
  TempDir dir;
  float x = 1;
  for (mode_t mask : {mode_t{022}, mode_t{077}, mode_t{002}}) {
    const mode_t old = ::umask(mask);
    const std::string p = dir / fmt::format("m{:o}.safetensors", mask);
    Status s = WriteSafetensors(p, {{"x", Dtype::kF32, {1}, &x}});
    ::umask(old);
    ASSERT_TRUE(s.ok()) << s.ToString();
    struct stat st{};
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0666 & ~mask) << "umask " << std::oct << mask;
  }
}

}  // namespace
}  // namespace zinf::train
