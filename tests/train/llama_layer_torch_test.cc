// One decoder layer of the Llama model code (src/train/llama.h: LayerForward and LayerBackward on
// the CPU backend, its unit layout filled from HF-named tensors) against an independent PyTorch
// implementation of Hugging Face's Llama decoder layer (tests/train/torch_llama_layer_ref.py, run
// with Debian's /usr/bin/python3; the test skips without torch), forward and backward in float32:
// the output within 1e-5 of its largest magnitude, the input's and every weight's gradient within
// 1e-4 of theirs (float32 noise; a wrong layout, head mapping, rotation or scale is off by far
// more).
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

#include "src/train/cpu_backend.h"
#include "src/train/llama.h"

namespace zinf::train {
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

struct Layer {
  const LayerCase& c;
  std::map<std::string, Vec> t;  // HF names, as the script reads them
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

kernels::cpu::RopeScaling ScalingOf(const LayerCase& c) {
  kernels::cpu::RopeScaling s;
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

// The script's name of a unit tensor: "model.layers.0.self_attn.q_proj.weight" is "q_proj",
// its bias "q_bias"; "model.layers.0.input_layernorm.weight" is "input_layernorm".
std::string ScriptName(const std::string& hf) {
  std::string rest = hf.substr(std::string("model.layers.0.").size());
  for (const char* part : {"self_attn.", "mlp."}) {
    if (rest.starts_with(part)) rest = rest.substr(std::string(part).size());
  }
  if (rest.ends_with(".weight")) return rest.substr(0, rest.size() - 7);
  return rest.substr(0, rest.find("_proj")) + "_bias";
}

// The layer from zinf's model code: y and every gradient, named as the script names them.
std::map<std::string, Vec> RunZinf(const Layer& l) {
  const LayerCase& c = l.c;
  const model::ModelShape shape{
      .arch = model::Arch::kLlama, .layers = 1, .hidden = c.C, .heads = c.H, .kv_heads = c.KV,
      .head_dim = c.d, .intermediate = c.I, .vocab = 2, .max_positions = c.seq,
      .norm_eps = c.eps, .rope_theta = c.theta, .rope_scaling = ScalingOf(c),
      .tie_word_embeddings = true, .qkv_bias = c.qkv_bias, .o_bias = c.o_bias};
  auto d = llama::Dims::Make(shape, c.seq);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  if (!d.ok()) return {};
  auto be = MakeCpuBackend<float>({.threads = 2});
  const std::vector<TensorInfo> tensors = llama::UnitTensors(*d, 1);
  Vec w(d->UnitParams(1)), dw(w.size());
  for (const TensorInfo& t : tensors) {
    const Vec& v = l.t.at(ScriptName(t.name));
    EXPECT_EQ(v.size(), t.elems) << t.name;
    std::copy(v.begin(), v.end(), w.begin() + t.offset);
  }
  const Vec& x = l.t.at("x");
  Vec acts(llama::LayerActsElems(*d, c.B, c.seq)), y(x.size());
  Vec scratch(llama::LayerScratchElems(
      *d, c.B, c.seq, be->CausalAttentionScratchElems(c.B, c.seq, c.H, c.KV, c.d)));
  const auto a = llama::ViewLayerActs(acts.data(), *d, c.B, c.seq);
  const auto view = llama::ViewLayer<const float>(w.data(), *d);
  Status s = llama::LayerForward<float>(*be, *d, view, x.data(), y.data(), a, scratch.data(),
                                        c.B, c.seq);
  EXPECT_TRUE(s.ok()) << s.ToString();
  Vec dres = l.t.at("dy");
  s = llama::LayerBackward<float>(*be, *d, view, llama::ViewLayer(dw.data(), *d), x.data(), a,
                                  dres.data(), scratch.data(), c.B, c.seq);
  EXPECT_TRUE(s.ok()) << s.ToString();

  std::map<std::string, Vec> r;
  r["y.out"] = y;
  r["d_x.out"] = dres;
  for (const TensorInfo& t : tensors) {
    r["d_" + ScriptName(t.name) + ".out"] =
        Vec(dw.begin() + t.offset, dw.begin() + t.offset + t.elems);
  }
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
}  // namespace zinf::train
