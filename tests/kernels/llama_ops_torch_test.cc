// Tests of kernels/cpu/llama_ops.h against an independent PyTorch implementation of Hugging
// Face's Llama decoder layer (tests/kernels/torch_llama_ref.py, run with Debian's
// /usr/bin/python3; the test skips without torch). One layer is composed here from zinf's ops
// (RMSNorm, the fused q/k/v GEMM, RoPE, grouped-query attention, o_proj, RMSNorm, the fused
// gate/up GEMM, SwiGLU, down_proj, the two residuals), forward and backward in float32, and
// compared with torch.autograd's output and every gradient: the output within 1e-5 of its
// largest magnitude, gradients within 1e-4 of theirs (float32 noise; a wrong layout, head
// mapping, rotation or scale is off by far more).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/layer_ops.h"
#include "kernels/cpu/llama_ops.h"

namespace zinf::kernels::cpu {
namespace {

namespace fs = std::filesystem;
using Vec = std::vector<float>;

constexpr const char* kPython = "/usr/bin/python3";

struct LayerCase {
  const char* name;
  int B, seq, C, H, KV, d, I;
  double eps, theta;
  bool llama3;    // rope_scaling {"rope_type": "llama3", ...} with every wavelength branch taken
  bool qkv_bias;  // q/k/v biases: Qwen2's, and Llama's attention_bias
  bool o_bias;    // an o_proj bias: Llama's attention_bias
};

// GQA with d = C/H, theta 10000; multi-query attention (one key/value head) with a head_dim
// that is not C/H, Llama's attention_bias (q, k, v and o) and Llama 3.1's rope scaling: with
// d = 8 and theta 10000 the wavelengths are 6.3, 63, 628 and 6283, and
// original_max_position_embeddings 64 with low/high factors 1 and 4 puts them in the high,
// medium, low and low bands; Qwen2's biases (q, k, v only) with its theta of 1e6.
constexpr LayerCase kCases[] = {
    {"gqa", 2, 7, 32, 4, 2, 8, 48, 1e-5, 10000.0, false, false, false},
    {"mqa_llama_bias_llama3", 2, 9, 24, 4, 1, 8, 40, 1e-6, 10000.0, true, true, true},
    {"qwen2_bias", 2, 6, 32, 4, 2, 8, 40, 1e-6, 1e6, false, true, false},
};

void WriteF32(const fs::path& path, const Vec& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
  ASSERT_TRUE(out.good()) << path;
}

Vec ReadF32(const fs::path& path, size_t n) {
  Vec v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), std::streamsize(n * 4));
  EXPECT_EQ(in.gcount(), std::streamsize(n * 4)) << path;
  return v;
}

Vec Random(size_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  Vec v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Rows [begin, begin + rows) of a [*, cols] matrix.
Vec Rows(const Vec& m, size_t begin, size_t rows, size_t cols) {
  return Vec(m.begin() + begin * cols, m.begin() + (begin + rows) * cols);
}

struct Layer {
  const LayerCase& c;
  std::map<std::string, Vec> t;  // HF names, as the script reads them
  int N() const { return c.B * c.seq; }
  int Q() const { return c.H * c.d; }
  int W() const { return (c.H + 2 * c.KV) * c.d; }
};

Layer MakeLayer(const LayerCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Layer l{c, {}};
  const size_t C = c.C, Q = size_t(c.H) * c.d, K = size_t(c.KV) * c.d, I = c.I;
  const size_t NC = size_t(c.B) * c.seq * C;
  const float wq = 1.0f / std::sqrt(float(C));
  l.t["x"] = Random(NC, rng, 1.0f);
  l.t["input_layernorm"] = Random(C, rng, 0.2f);
  for (float& w : l.t["input_layernorm"]) w += 1.0f;
  l.t["q_proj"] = Random(Q * C, rng, 2 * wq);  // larger: a softmax far from uniform
  l.t["k_proj"] = Random(K * C, rng, 2 * wq);
  l.t["v_proj"] = Random(K * C, rng, wq);
  l.t["o_proj"] = Random(C * Q, rng, 1.0f / std::sqrt(float(Q)));
  l.t["post_attention_layernorm"] = Random(C, rng, 0.2f);
  for (float& w : l.t["post_attention_layernorm"]) w += 1.0f;
  l.t["gate_proj"] = Random(I * C, rng, 2 * wq);
  l.t["up_proj"] = Random(I * C, rng, wq);
  l.t["down_proj"] = Random(C * I, rng, 1.0f / std::sqrt(float(I)));
  if (c.qkv_bias) {
    l.t["q_bias"] = Random(Q, rng, 0.5f);
    l.t["k_bias"] = Random(K, rng, 0.5f);
    l.t["v_bias"] = Random(K, rng, 0.5f);
  }
  if (c.o_bias) l.t["o_bias"] = Random(C, rng, 0.5f);
  l.t["dy"] = Random(NC, rng, 1.0f);
  return l;
}

RopeScaling ScalingOf(const LayerCase& c) {
  RopeScaling s;
  if (c.llama3) s = {.kind = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                     .high_freq_factor = 4.0, .original_max_position_embeddings = 64.0};
  return s;
}

void WriteCase(const Layer& l, const fs::path& dir) {
  const LayerCase& c = l.c;
  fs::create_directories(dir);
  std::ofstream json(dir / "case.json");
  json << fmt::format(
      R"({{"B": {}, "seq": {}, "hidden": {}, "heads": {}, "kv_heads": {}, "head_dim": {},
"intermediate": {}, "rms_norm_eps": {}, "rope_theta": {}, "qkv_bias": {}, "o_bias": {},
"rope_scaling": {}}})",
      c.B, c.seq, c.C, c.H, c.KV, c.d, c.I, c.eps, c.theta, c.qkv_bias, c.o_bias,
      c.llama3 ? R"({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
"high_freq_factor": 4.0, "original_max_position_embeddings": 64})"
               : "null");
  ASSERT_TRUE(json.good());
  for (const auto& [name, v] : l.t) WriteF32(dir / name, v);
}

// The layer from zinf's ops: y and every gradient, named as torch_llama_ref.py names them.
std::map<std::string, Vec> RunZinf(const Layer& l) {
  const LayerCase& c = l.c;
  const int N = l.N(), C = c.C, Q = l.Q(), W = l.W(), I = c.I;
  const size_t NC = size_t(N) * C;
  const auto& t = l.t;
  auto cat = [](std::initializer_list<const Vec*> parts) {
    Vec v;
    for (const Vec* p : parts) v.insert(v.end(), p->begin(), p->end());
    return v;
  };
  const Vec wqkv = cat({&t.at("q_proj"), &t.at("k_proj"), &t.at("v_proj")});
  const Vec bqkv =
      c.qkv_bias ? cat({&t.at("q_bias"), &t.at("k_bias"), &t.at("v_bias")}) : Vec{};
  const float* bo = c.o_bias ? t.at("o_bias").data() : nullptr;
  const Vec wgu = cat({&t.at("gate_proj"), &t.at("up_proj")});
  auto inv = RopeInvFreq(c.d, c.theta, ScalingOf(c));
  EXPECT_TRUE(inv.ok()) << inv.status().message();
  Vec cos(size_t(c.seq) * c.d / 2), sin(cos.size());
  RopeTables(cos.data(), sin.data(), *inv, c.seq);

  const float* const no_bias = nullptr;
  float* const no_grad = nullptr;

  // Forward.
  const Vec& x = t.at("x");
  Vec n1(NC), rstd1(N), qkv(size_t(N) * W), att(size_t(c.B) * c.H * c.seq * c.seq),
      a(size_t(N) * Q), h(NC), n2(NC), rstd2(N), gu(size_t(N) * 2 * I), m(size_t(N) * I),
      y(NC);
  RmsNormForward(n1.data(), rstd1.data(), x.data(), t.at("input_layernorm").data(), N, C, c.eps);
  MatmulForward(qkv.data(), n1.data(), wqkv.data(), c.qkv_bias ? bqkv.data() : no_bias, N, C,
                W);
  RopeForward(qkv.data(), cos.data(), sin.data(), c.B, c.seq, c.H, c.KV, c.d);
  CausalAttentionForward(a.data(), att.data(), qkv.data(), c.B, c.seq, c.H, c.KV, c.d);
  MatmulForward(h.data(), a.data(), t.at("o_proj").data(), bo, N, Q, C);
  for (size_t i = 0; i < NC; ++i) h[i] += x[i];
  RmsNormForward(n2.data(), rstd2.data(), h.data(), t.at("post_attention_layernorm").data(), N,
                 C, c.eps);
  MatmulForward(gu.data(), n2.data(), wgu.data(), no_bias, N, C, 2 * I);
  SwiGluForward(m.data(), gu.data(), N, I);
  MatmulForward(y.data(), m.data(), t.at("down_proj").data(), no_bias, N, I, C);
  for (size_t i = 0; i < NC; ++i) y[i] += h[i];

  // Backward of Σ y·dy.
  std::map<std::string, Vec> r;
  r["y.out"] = y;
  const Vec& dy = t.at("dy");
  Vec dh = dy, dm(m.size()), dgu(gu.size()), dn2(NC), da(a.size()), dqkv(qkv.size()), dn1(NC);
  Vec dwd(t.at("down_proj").size()), dwgu(wgu.size()), dwpost(C), dwo(t.at("o_proj").size()),
      dwqkv(wqkv.size()), dbqkv(bqkv.size()), dbo(C), dwin(C);
  MatmulBackward(dm.data(), dwd.data(), no_grad, dy.data(), m.data(), t.at("down_proj").data(),
                 N, I, C);
  SwiGluBackward(dgu.data(), dm.data(), gu.data(), N, I);
  MatmulBackward(dn2.data(), dwgu.data(), no_grad, dgu.data(), n2.data(), wgu.data(), N, C,
                 2 * I);
  RmsNormBackward(dh.data(), dwpost.data(), dn2.data(), h.data(),
                  t.at("post_attention_layernorm").data(), rstd2.data(), N, C);
  Vec dx = dh;
  MatmulBackward(da.data(), dwo.data(), c.o_bias ? dbo.data() : no_grad, dh.data(), a.data(),
                 t.at("o_proj").data(), N, Q, C);
  Vec scratch(CausalAttentionScratchElems(c.B, c.seq, c.KV));
  CausalAttentionBackward(dqkv.data(), scratch.data(), da.data(), qkv.data(), att.data(), c.B,
                          c.seq, c.H, c.KV, c.d);
  RopeBackward(dqkv.data(), cos.data(), sin.data(), c.B, c.seq, c.H, c.KV, c.d);
  MatmulBackward(dn1.data(), dwqkv.data(), c.qkv_bias ? dbqkv.data() : no_grad, dqkv.data(),
                 n1.data(), wqkv.data(), N, C, W);
  RmsNormBackward(dx.data(), dwin.data(), dn1.data(), x.data(), t.at("input_layernorm").data(),
                  rstd1.data(), N, C);

  const size_t K = size_t(c.KV) * c.d;
  r["d_x.out"] = dx;
  r["d_input_layernorm.out"] = dwin;
  r["d_q_proj.out"] = Rows(dwqkv, 0, Q, C);
  r["d_k_proj.out"] = Rows(dwqkv, Q, K, C);
  r["d_v_proj.out"] = Rows(dwqkv, Q + K, K, C);
  if (c.o_bias) r["d_o_bias.out"] = dbo;
  if (c.qkv_bias) {
    r["d_q_bias.out"] = Rows(dbqkv, 0, Q, 1);
    r["d_k_bias.out"] = Rows(dbqkv, Q, K, 1);
    r["d_v_bias.out"] = Rows(dbqkv, Q + K, K, 1);
  }
  r["d_o_proj.out"] = dwo;
  r["d_post_attention_layernorm.out"] = dwpost;
  r["d_gate_proj.out"] = Rows(dwgu, 0, I, C);
  r["d_up_proj.out"] = Rows(dwgu, I, I, C);
  r["d_down_proj.out"] = dwd;
  return r;
}

class LlamaLayerVsTorch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found";
    dir_ = fs::temp_directory_path() / ("zinf_llama_torch_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

// One Python run (importing torch takes seconds) computes every case.
TEST_F(LlamaLayerVsTorch, ForwardAndEveryGradientMatch) {
  std::vector<Layer> layers;
  std::string cmd = kPython;
  cmd.append(" ").append(ZINF_TORCH_LLAMA_SCRIPT);
  for (const LayerCase& c : kCases) {
    layers.push_back(MakeLayer(c, 7 + uint32_t(layers.size())));
    WriteCase(layers.back(), dir_ / c.name);
    cmd.append(" ").append((dir_ / c.name).string());
  }
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << cmd;
  if (WEXITSTATUS(status) == 77) GTEST_SKIP() << "torch is not importable by " << kPython;
  ASSERT_EQ(WEXITSTATUS(status), 0) << cmd;

  for (const Layer& l : layers) {
    for (const auto& [name, ours] : RunZinf(l)) {
      const Vec ref = ReadF32(dir_ / l.c.name / name, ours.size());
      float scale = 0;
      for (float v : ref) scale = std::max(scale, std::abs(v));
      ASSERT_GT(scale, 1e-3f) << l.c.name << " " << name << ": vacuous (all ~0)";
      const float tol = (name == "y.out" ? 1e-5f : 1e-4f) * scale;
      for (size_t i = 0; i < ours.size(); ++i) {
        ASSERT_NEAR(ours[i], ref[i], tol) << l.c.name << " " << name << "[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
