// `zinf ckpt inspect|verify|export` end to end on the tiny model's checkpoints (state on NVMe
// and in memory): what inspect reports, verify naming a flipped byte, an F32 export being the
// run's own --save byte for byte, a BF16 export rounding as PyTorch does (through Debian's
// /usr/bin/python3 and a safetensors reader written in the test; skipped without torch), the
// Adam moments exported as the checkpoint holds them, and --init of an export reproducing it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "src/train/gpt.h"
#include "src/train/safetensors.h"
#include "tests/cli/cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::RunZinf;
using testing::TempDir;
namespace fs = std::filesystem;

// A 3-step run with a checkpoint at its end and --save of its final weights.
struct TrainedRun {
  TempDir dir;
  std::string ckpt;  // the checkpoint directory
  explicit TrainedRun(const std::string& placement) {
    auto r = RunZinf(Tiny(3) + " " + placement + " --swap-dir " + dir / "swap" +
                         " --checkpoint-dir " + dir / "ckpt" + " --save " + dir / "w.safetensors",
                     dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    ckpt = dir / "ckpt/step-0000000003";
  }
};

class CkptCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CkptCliTest, InspectVerifyAndExportAsTheRunSavedIt) {
  TrainedRun run(GetParam());
  const bool nvme = GetParam().find("nvme") != std::string::npos;
  // zinf.optimizer_state_dtype bf16: the moments are stored, and exported, as BF16.
  const bool bf16_moments = GetParam().find("bf16") != std::string::npos;
  const uint64_t me = bf16_moments ? 2 : 4;  // bytes of a moment element
  auto inspect = RunZinf("ckpt inspect " + run.dir / "ckpt", run.dir.path());
  ASSERT_EQ(inspect.exit_code, 0) << inspect.err;
  EXPECT_NE(inspect.out.find("step 3 (of 3 asked for)"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find(std::to_string(kParams) + " parameters"), std::string::npos);
  for (const char* role : {"master", "exp_avg", "exp_avg_sq"}) {
    EXPECT_NE(inspect.out.find(role), std::string::npos) << inspect.out;
  }
  EXPECT_NE(inspect.out.find(nvme ? "nvme (swap file)" : "checkpoint dir"), std::string::npos)
      << inspect.out;

  auto verify = RunZinf("ckpt verify " + run.ckpt, run.dir.path());
  EXPECT_EQ(verify.exit_code, 0) << verify.err;
  EXPECT_NE(verify.out.find("ok: "), std::string::npos) << verify.out;

  // F32: the very bytes --save wrote (same names, layout and metadata).
  auto f32 = RunZinf("ckpt export " + run.dir / "ckpt" + " --out " + run.dir / "e.safetensors",
                     run.dir.path());
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_TRUE(ReadFile(run.dir / "e.safetensors") == ReadFile(run.dir / "w.safetensors"));

  // --init of the export, trained one step at lr 0, saves the same weights again.
  auto init = RunZinf("train --init " + run.dir / "e.safetensors" + " --steps 1 --lr 0 " +
                          "--schedule constant --offload cpu --save " + run.dir / "i.safetensors",
                      run.dir.path());
  ASSERT_EQ(init.exit_code, 0) << init.err;
  EXPECT_TRUE(ReadFile(run.dir / "i.safetensors") == ReadFile(run.dir / "e.safetensors"));

  // BF16 with the moments: each weight rounded to nearest even, each moment as stored.
  auto bf16 = RunZinf("ckpt export " + run.ckpt + " --dtype bf16 --optimizer-state --out " +
                          run.dir / "m.safetensors",
                      run.dir.path());
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  auto exported = train::SafetensorsFile::Open(run.dir / "m.safetensors");
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  auto saved = train::SafetensorsFile::Open(run.dir / "w.safetensors");
  ASSERT_TRUE(saved.ok());
  EXPECT_EQ(exported->tensors().size(), 3 * saved->tensors().size());
  const nlohmann::json m = ReadJson(run.ckpt + "/manifest.json");
  train::GptDims d{.L = 2, .C = 32, .NH = 4, .V = 64, .seq = 16};
  for (uint32_t u = 0; u < d.units(); ++u) {
    for (const train::TensorInfo& t : train::UnitTensors(d, u)) {
      const auto* w = exported->Find(t.name);
      ASSERT_NE(w, nullptr) << t.name;
      EXPECT_EQ(w->dtype, train::Dtype::kBF16);
      std::vector<float> f(t.elems);
      ASSERT_TRUE(saved->Read(t.name, f.data(), 4 * t.elems).ok());
      std::vector<uint16_t> h(t.elems);
      ASSERT_TRUE(exported->Read(t.name, h.data(), 2 * t.elems).ok());
      for (uint64_t i = 0; i < t.elems; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &f[i], 4);
        const uint16_t rounded =
            static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // finite values
        ASSERT_EQ(h[i], rounded) << t.name << "[" << i << "]";
      }
      // The moments: the bytes of the checkpoint's exp_avg / exp_avg_sq shards at the tensor.
      for (const char* role : {"exp_avg", "exp_avg_sq"}) {
        const auto* mt = exported->Find(t.name + "." + role);
        ASSERT_NE(mt, nullptr) << t.name << "." << role;
        EXPECT_EQ(mt->dtype, bf16_moments ? train::Dtype::kBF16 : train::Dtype::kF32);
        std::string got(me * t.elems, '\0');
        ASSERT_TRUE(exported->Read(mt->name, got.data(), got.size()).ok());
        for (const auto& s : m["shards"]) {
          if (s["role"] != role || s["unit"] != u) continue;
          EXPECT_EQ(s["dtype"], bf16_moments ? "BF16" : "F32");
          std::string file = s["file"].get<std::string>();
          if (file.front() != '/') file = run.ckpt + "/" + file;
          std::ifstream in(file, std::ios::binary);
          in.seekg(static_cast<std::streamoff>(s["offset"].get<uint64_t>() + me * t.offset));
          std::string want(got.size(), '\0');
          in.read(want.data(), static_cast<std::streamsize>(want.size()));
          EXPECT_TRUE(got == want) << t.name << "." << role;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(StateOnNvmeAndInMemory, CkptCliTest,
                         ::testing::Values("--offload nvme", "--offload cpu",
                                           "--offload nvme --optimizer-state-dtype bf16",
                                           "--offload cpu --optimizer-state-dtype bf16"),
                         [](const auto& info) {
                           std::string n = info.param.find("nvme") != std::string::npos ? "Nvme"
                                                                                        : "Cpu";
                           if (info.param.find("bf16") != std::string::npos) n += "Bf16Moments";
                           return n;
                         });

TEST(CkptVerifyTest, AFlippedByteIsNamedAndExportRefuses) {
  TrainedRun run("--offload cpu");
  const nlohmann::json m = ReadJson(run.ckpt + "/manifest.json");
  const auto& shard = m["shards"][4];
  const std::string file = run.ckpt + "/" + shard["file"].get<std::string>();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(shard["offset"].get<uint64_t>() + 9));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 1);
    f.seekp(static_cast<std::streamoff>(shard["offset"].get<uint64_t>() + 9));
    f.write(&c, 1);
  }
  auto verify = RunZinf("ckpt verify " + run.ckpt, run.dir.path());
  EXPECT_EQ(verify.exit_code, 1);
  EXPECT_NE(verify.err.find(shard["role"].get<std::string>()), std::string::npos) << verify.err;
  EXPECT_NE(verify.err.find(file), std::string::npos) << verify.err;
  EXPECT_NE(verify.err.find(std::to_string(shard["offset"].get<uint64_t>())), std::string::npos)
      << verify.err;
  auto exp = RunZinf("ckpt export " + run.ckpt + " --out " + run.dir / "x.safetensors",
                     run.dir.path());
  EXPECT_EQ(exp.exit_code, 1);
  EXPECT_FALSE(fs::exists(run.dir / "x.safetensors"));
  auto missing = RunZinf("ckpt inspect " + run.dir / "nope", run.dir.path());
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find(run.dir / "nope"), std::string::npos) << missing.err;
}

// PyTorch reads the BF16 export (through a reader written here) and rounds the F32 weights to
// bfloat16 itself: the same values; every exp_avg_sq is >= 0.
TEST(CkptTorchTest, PyTorchReadsTheExport) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch is not installed";
  }
  TrainedRun run("--offload nvme");
  ASSERT_EQ(RunZinf("ckpt export " + run.ckpt + " --dtype bf16 --optimizer-state --out " +
                        run.dir / "m.safetensors",
                    run.dir.path())
                .exit_code,
            0);
  const std::string script = run.dir / "read.py";
  std::ofstream(script) << R"(import json, struct, sys, torch
def read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    types = {'F32': torch.float32, 'BF16': torch.bfloat16}
    out = {}
    for k, v in h.items():
        if k == '__metadata__': continue
        s, e = v['data_offsets']
        out[k] = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=types[v['dtype']]).reshape(v['shape'])
    return out
m, w = read(sys.argv[1]), read(sys.argv[2])
for k, t in w.items():
    assert torch.equal(m[k], t.to(torch.bfloat16)), k
    assert m[k + '.exp_avg'].shape == t.shape, k
    assert bool((m[k + '.exp_avg_sq'] >= 0).all()), k
print('torch ok', len(w))
)";
  const std::string cmd = "/usr/bin/python3 " + script + " " + run.dir / "m.safetensors" + " " +
                          run.dir / "w.safetensors" + " > " + run.dir / "py.txt" + " 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << ReadFile(run.dir / "py.txt");
  EXPECT_NE(ReadFile(run.dir / "py.txt").find("torch ok"), std::string::npos)
      << ReadFile(run.dir / "py.txt");
}

}  // namespace
}  // namespace zinf
