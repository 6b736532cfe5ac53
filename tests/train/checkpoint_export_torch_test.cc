// `zinf ckpt inspect | export` of a zinf.torch checkpoint (src/train/checkpoint_export_torch.cc):
// a checkpoint written here by hand in the layout python/zinf/torch/_checkpoint.py writes (a
// trainable unit's fp32 master and moments, a frozen unit's bf16 working copy), described and
// exported under the parameters' own names, in F32 and BF16. (The Python test exports real
// ones; this one runs under the sanitizers too.)
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/cpu/cast.h"
#include "src/base/hash.h"
#include "src/ckpt/manifest.h"
#include "src/train/checkpoint_export.h"
#include "src/train/safetensors.h"
#include "tests/test_util.h"

namespace zinf::train {
namespace {

using ::testing::HasSubstr;
using zinf::testing::TempDir;

struct Written {
  std::vector<float> master, exp_avg, exp_avg_sq;
  std::vector<uint16_t> frozen;  // bf16
};

// unit 0 (trainable): "a.weight" (2 x 2) at 0, "a.bias" (2) at 4; unit 1 (frozen): "b.weight"
// (3) at 0, stored bf16.
Written WriteCheckpoint(const std::string& dir) {
  Written w;
  for (int i = 0; i < 6; ++i) {
    w.master.push_back(0.25f * static_cast<float>(i) - 0.5f);
    w.exp_avg.push_back(0.01f * static_cast<float>(i));
    w.exp_avg_sq.push_back(0.001f * static_cast<float>(i + 1));
  }
  const std::vector<float> frozen32 = {1.5f, -2.0f, 3.25f};
  w.frozen.resize(3);
  EXPECT_TRUE(kernels::CastFromF32(frozen32.data(), w.frozen.data(), kernels::DType::kBf16, 3)
                  .ok());
  ckpt::Manifest m;
  m.step = 7;
  m.model = {{"kind", "torch"}, {"module", "Tiny"}, {"precision", "bf16"},
             {"units", {"a", "b", "<root>"}},
             {"params", {{{"name", "a.weight"}, {"shape", {2, 2}}, {"dtype", "float32"},
                          {"trainable", true}, {"unit", 0}, {"shard", 0}, {"offset", 0}},
                         {{"name", "a.bias"}, {"shape", {2}}, {"dtype", "float32"},
                          {"trainable", true}, {"unit", 0}, {"shard", 0}, {"offset", 4}},
                         {{"name", "b.weight"}, {"shape", {3}}, {"dtype", "float32"},
                          {"trainable", false}, {"unit", 1}, {"shard", 1}, {"offset", 0}}}}};
  m.training = nlohmann::json::object();
  m.data = nlohmann::json::object();
  m.state = {{"steps", {{"global_steps", 7}, {"skipped", 1}}}};
  std::string bytes;
  auto add = [&](const std::string& role, uint32_t unit, const std::string& dtype, const void* p,
                 uint64_t n, uint64_t elements) {
    ckpt::ShardEntry e{.role = role, .unit = unit, .dtype = dtype, .shape = {elements},
                       .file = "state.bin", .offset = bytes.size(), .length = n,
                       .xxh64 = Xxh64(p, n)};
    bytes.append(static_cast<const char*>(p), n);
    m.shards.push_back(e);
  };
  add("master", 0, "F32", w.master.data(), 24, 6);
  add("exp_avg", 0, "F32", w.exp_avg.data(), 24, 6);
  add("exp_avg_sq", 0, "F32", w.exp_avg_sq.data(), 24, 6);
  add("param", 1, "BF16", w.frozen.data(), 6, 3);
  m.files.push_back({.name = "state.bin", .kind = "data", .bytes = bytes.size()});
  std::ofstream(dir + "/state.bin", std::ios::binary) << bytes;
  EXPECT_TRUE(ckpt::Commit(dir, m).ok());
  return w;
}

TEST(CheckpointExportTorchTest, DescribesAndExportsUnderTheModulesNames) {
  TempDir dir;
  const Written w = WriteCheckpoint(dir.path());
  auto m = ckpt::Read(dir.path());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(IsTorchCheckpoint(*m));
  auto text = Describe(*m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_THAT(*text, HasSubstr("a PyTorch Tiny of 9 parameters (6 trainable) in 3 tensors"));
  EXPECT_THAT(*text, HasSubstr("optimizer steps 7, skipped 1"));

  const std::string out = dir / "w.safetensors";
  auto st = Export(*m, {.out = out, .dtype = Dtype::kF32, .optimizer_state = true});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->tensors, 3u + 2u * 2u);  // three weights, two trainable ones' moments
  auto f = SafetensorsFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<float> got(4);
  ASSERT_TRUE(f->Read("a.weight", got.data(), 16).ok());
  EXPECT_EQ(got, std::vector<float>(w.master.begin(), w.master.begin() + 4));
  got.resize(2);
  ASSERT_TRUE(f->Read("a.bias.exp_avg_sq", got.data(), 8).ok());
  EXPECT_EQ(got, std::vector<float>(w.exp_avg_sq.begin() + 4, w.exp_avg_sq.end()));
  got.resize(3);
  ASSERT_TRUE(f->Read("b.weight", got.data(), 12).ok());  // bf16 stored, widened exactly
  EXPECT_EQ(got, (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(f->Find("b.weight.exp_avg"), nullptr);  // frozen: no moments
  EXPECT_EQ(f->metadata().at("zinf_module"), "Tiny");

  // BF16: the master rounded to nearest even; the frozen copy as stored.
  st = Export(*m, {.out = out, .dtype = Dtype::kBF16});
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  f = SafetensorsFile::Open(out);
  ASSERT_TRUE(f.ok());
  std::vector<uint16_t> b16(2), want(2);
  ASSERT_TRUE(f->Read("a.bias", b16.data(), 4).ok());
  ASSERT_TRUE(kernels::CastFromF32(w.master.data() + 4, want.data(), kernels::DType::kBf16, 2)
                  .ok());
  EXPECT_EQ(b16, want);
  b16.resize(3);
  ASSERT_TRUE(f->Read("b.weight", b16.data(), 6).ok());
  EXPECT_EQ(b16, w.frozen);
}

TEST(CheckpointExportTorchTest, ACorruptShardIsNamedAndNothingIsWritten) {
  TempDir dir;
  WriteCheckpoint(dir.path());
  {
    std::fstream f(dir / "state.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x7f');
  }
  auto m = ckpt::Read(dir.path());
  ASSERT_TRUE(m.ok());
  auto st = Export(*m, {.out = dir / "w.safetensors"});
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.status().message(), HasSubstr("state.bin"));
  EXPECT_FALSE(std::filesystem::exists(dir / "w.safetensors"));
}

}  // namespace
}  // namespace zinf::train
