// The Llama model code (src/train/llama.h) on the CPU backend: every parameter's gradient of
// tiny models (grouped-query attention, tied and untied heads, every bias, Llama 3.1's rope
// scaling) against central finite differences in double, float against double, bit-identical
// results for 1 and 2 threads, the unit layout under HF's names, the init, the refusals.
#include "src/train/llama.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "src/train/cpu_backend.h"
#include "src/train/model.h"

namespace zinf::train::llama {
namespace {

constexpr int kB = 2, kT = 5;

model::ModelShape TinyShape(bool tied, bool biases) {
  model::ModelShape s{.arch = model::Arch::kLlama, .layers = 2, .hidden = 8, .heads = 4,
                      .kv_heads = 2, .head_dim = 4, .intermediate = 12, .vocab = 11,
                      .max_positions = 16, .norm_eps = 1e-5, .rope_theta = 10000.0,
                      .tie_word_embeddings = tied, .qkv_bias = biases, .o_bias = biases,
                      .mlp_bias = biases};
  if (biases) {  // every band of the llama3 rescaling: wavelengths 6.3 and 628
    s.rope_scaling = {.kind = "llama3", .factor = 8.0, .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0, .original_max_position_embeddings = 64.0};
  }
  return s;
}

Dims MakeDims(const model::ModelShape& s) {
  auto d = Dims::Make(s, kT);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return *d;
}

struct Params {
  std::vector<std::vector<double>> params, grads;
  std::vector<int32_t> tokens, targets;
};

Params MakeParams(const Dims& d, uint64_t seed) {
  Params m;
  for (uint32_t u = 0; u < d.units(); ++u) {
    std::vector<float> w(d.UnitParams(u));
    InitUnit(d, u, seed, w.data());
    // Weights far larger than the init, and norms and biases off their 1 and 0, so that no
    // gradient is a special case and the attention is far from uniform.
    std::mt19937_64 rng(seed + u);
    std::normal_distribution<double> n(0.0, 0.3);
    m.params.emplace_back(w.begin(), w.end());
    for (double& x : m.params.back()) x = static_cast<float>(x + n(rng));
    m.grads.emplace_back(w.size(), 0.0);
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < kB * kT; ++i) {
    m.tokens.push_back(static_cast<int32_t>(rng() % d.V()));
    m.targets.push_back(static_cast<int32_t>(rng() % d.V()));
  }
  return m;
}

template <typename T>
double RunModel(Backend<T>& be, const Dims& d, std::vector<std::vector<T>>& params,
           std::vector<std::vector<T>>& grads, const Params& m) {
  std::vector<const T*> p;
  std::vector<T*> g;
  for (auto& x : params) p.push_back(x.data());
  for (auto& x : grads) {
    std::fill(x.begin(), x.end(), T(0));
    g.push_back(x.data());
  }
  auto loss = ResidentForwardBackward<T>(be, Model(d), p, g, m.tokens.data(), m.targets.data(),
                                         kB, kT, T(1));
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  return loss.ok() ? *loss : NAN;
}

class LlamaModelTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

// Every parameter of every unit: analytic gradient vs (L(w+h) - L(w-h)) / 2h in double, with
// gpt_test's bound (1e-8 absolute plus 1e-6 relative: far above the difference's truncation and
// rounding error, far below any wrong term).
TEST_P(LlamaModelTest, GradientsMatchFiniteDifferencesInDouble) {
  const Dims d = MakeDims(TinyShape(GetParam().first, GetParam().second));
  auto be = MakeCpuBackend<double>({.threads = 1});
  Params m = MakeParams(d, 7);
  RunModel(*be, d, m.params, m.grads, m);
  const auto analytic = m.grads;
  auto scratch = m.grads;
  const double h = 1e-5;
  uint64_t checked = 0;
  double largest = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    for (size_t i = 0; i < m.params[u].size(); ++i) {
      const double w = m.params[u][i];
      m.params[u][i] = w + h;
      const double lp = RunModel(*be, d, m.params, scratch, m);
      m.params[u][i] = w - h;
      const double lm = RunModel(*be, d, m.params, scratch, m);
      m.params[u][i] = w;
      const double fd = (lp - lm) / (2 * h);
      ASSERT_NEAR(analytic[u][i], fd, 1e-8 + 1e-6 * std::abs(fd))
          << d.UnitName(u) << " parameter " << i;
      largest = std::max(largest, std::abs(fd));
      ++checked;
    }
  }
  EXPECT_EQ(checked, d.shape.Params());
  EXPECT_GT(largest, 1e-2);  // not vacuous
}

// The float model agrees with the double one to fp32 accuracy, and is bit-identical whether its
// ops run on one thread or two.
TEST_P(LlamaModelTest, FloatMatchesDoubleAndIgnoresThreadCount) {
  const Dims d = MakeDims(TinyShape(GetParam().first, GetParam().second));
  auto bd = MakeCpuBackend<double>({.threads = 1});
  auto b1 = MakeCpuBackend<float>({.threads = 1});
  auto b2 = MakeCpuBackend<float>({.threads = 2});
  Params m = MakeParams(d, 11);
  std::vector<std::vector<float>> pf, g1, g2;
  for (auto& p : m.params) pf.emplace_back(p.begin(), p.end());
  for (auto& g : m.grads) {
    g1.emplace_back(g.size());
    g2.emplace_back(g.size());
  }
  const double ld = RunModel(*bd, d, m.params, m.grads, m);
  const double l1 = RunModel(*b1, d, pf, g1, m);
  const double l2 = RunModel(*b2, d, pf, g2, m);
  EXPECT_NEAR(l1, ld, 1e-5 * ld);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
  double max_g = 0;
  for (auto& g : m.grads) for (double x : g) max_g = std::max(max_g, std::abs(x));
  for (size_t u = 0; u < g1.size(); ++u) {
    for (size_t i = 0; i < g1[u].size(); ++i) {
      ASSERT_NEAR(g1[u][i], m.grads[u][i], 1e-5 * max_g + 1e-4 * std::abs(m.grads[u][i]))
          << d.UnitName(static_cast<uint32_t>(u)) << " " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, LlamaModelTest,
                         ::testing::Values(std::pair{true, false}, std::pair{false, true}),
                         [](const auto& info) {
                           return std::string(info.param.first ? "Tied" : "UntiedWithBiases");
                         });

// The layout: offsets contiguous, sizes those ModelShape counts, HF's names in the order the
// fused GEMMs need (q, k, v adjacent; gate, up adjacent); the head in the final unit when untied.
TEST(LlamaLayoutTest, UnitsHoldHfTensorsInFusedOrder) {
  for (bool tied : {true, false}) {
    const Dims d = MakeDims(TinyShape(tied, tied));
    uint64_t total = 0;
    for (uint32_t u = 0; u < d.units(); ++u) {
      uint64_t n = 0;
      for (const TensorInfo& t : UnitTensors(d, u)) {
        EXPECT_EQ(t.offset, n) << t.name;
        n += t.elems;
      }
      EXPECT_EQ(n, d.UnitParams(u)) << d.UnitName(u);
      total += n;
    }
    EXPECT_EQ(total, d.shape.Params());
    const auto fin = UnitTensors(d, d.final_unit());
    ASSERT_EQ(fin.size(), tied ? 1u : 2u);
    if (!tied) EXPECT_EQ(fin[1].name, "lm_head.weight");
  }
  const Dims d = MakeDims(TinyShape(false, true));
  std::vector<std::string> names;
  for (const TensorInfo& t : UnitTensors(d, 2)) names.push_back(t.name);
  const std::string p = "model.layers.1.";
  const std::vector<std::string> want = {
      p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
      p + "self_attn.v_proj.weight", p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias",
      p + "self_attn.v_proj.bias", p + "self_attn.o_proj.weight", p + "self_attn.o_proj.bias",
      p + "post_attention_layernorm.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
      p + "mlp.gate_proj.bias", p + "mlp.up_proj.bias", p + "mlp.down_proj.weight",
      p + "mlp.down_proj.bias"};
  EXPECT_EQ(names, want);
  EXPECT_EQ(UnitTensors(d, 2)[2].shape, (std::vector<int64_t>{8, 8}));  // k: KV·d = 8 rows
  EXPECT_EQ(d.UnitName(2), "layer1");
  // The view takes the same offsets as the names.
  std::vector<float> w(d.UnitParams(2));
  const LayerView<float> v = ViewLayer(w.data(), d);
  EXPECT_EQ(v.ow - w.data(), static_cast<ptrdiff_t>(UnitTensors(d, 2)[7].offset));
  EXPECT_EQ(v.downb - w.data(), static_cast<ptrdiff_t>(UnitTensors(d, 2)[15].offset));
}

// HF's init: Linear and embedding weights N(0, 0.02²), biases 0, norms 1; deterministic.
TEST(LlamaLayoutTest, InitFollowsHfAndIsDeterministic) {
  model::ModelShape s = TinyShape(false, true);
  s.hidden = 64;
  s.intermediate = 96;
  s.head_dim = 16;
  const Dims d = MakeDims(s);
  std::vector<float> a(d.UnitParams(1)), b(d.UnitParams(1));
  InitUnit(d, 1, 42, a.data());
  InitUnit(d, 1, 42, b.data());
  EXPECT_EQ(a, b);
  InitUnit(d, 2, 42, b.data());
  EXPECT_NE(a, b);
  for (const TensorInfo& t : UnitTensors(d, 1)) {
    double sum = 0, sum2 = 0;
    for (uint64_t i = 0; i < t.elems; ++i) {
      sum += a[t.offset + i];
      sum2 += double(a[t.offset + i]) * a[t.offset + i];
    }
    const double mean = sum / t.elems, sd = std::sqrt(sum2 / t.elems - mean * mean);
    if (t.name.ends_with("bias")) {
      EXPECT_EQ(sum2, 0.0) << t.name;
    } else if (t.name.ends_with("norm.weight")) {
      EXPECT_EQ(mean, 1.0) << t.name;
      EXPECT_EQ(sd, 0.0) << t.name;
    } else {
      EXPECT_NEAR(sd, 0.02, 0.1 * 0.02) << t.name;
      EXPECT_NEAR(mean, 0.0, 0.1 * 0.02) << t.name;
    }
  }
}

TEST(LlamaLayoutTest, MakeRefusesWhatItCannotCompute) {
  model::ModelShape s = TinyShape(true, false);
  s.arch = model::Arch::kGpt2;
  auto r = Dims::Make(s, kT);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpt2"), std::string::npos) << r.status().message();
  s = TinyShape(true, false);
  s.sliding_window = 4;
  r = Dims::Make(s, kT);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("sliding"), std::string::npos) << r.status().message();
  s = TinyShape(true, false);
  s.rope_scaling.kind = "yarn";
  r = Dims::Make(s, kT);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("yarn"), std::string::npos) << r.status().message();
  EXPECT_FALSE(Dims::Make(TinyShape(true, false), 0).ok());
}

}  // namespace
}  // namespace zinf::train::llama
