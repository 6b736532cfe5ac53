// The GPT-2 model code (src/train/gpt.h) on the CPU backend: the gradient of every parameter of a
// tiny model against central finite differences in double precision, float against double, the
// init's statistics and determinism, the tensor layout.
#include "src/train/gpt.h"
#include "src/train/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "src/train/cpu_backend.h"

namespace zinf::train {
namespace {

const GptDims kTiny{.L = 2, .C = 8, .NH = 2, .V = 11, .seq = 5};
constexpr int kB = 2, kT = 5;

struct Model {
  std::vector<std::vector<double>> params, grads;
  std::vector<int32_t> tokens, targets;
};

Model MakeModel(const GptDims& d, uint64_t seed) {
  Model m;
  for (uint32_t u = 0; u < d.units(); ++u) {
    std::vector<float> w(d.UnitParams(u));
    InitUnit(d, u, seed, w.data());
    // Perturb LayerNorm weights and biases too, so that their gradients are not special cases.
    std::mt19937_64 rng(seed + u);
    std::normal_distribution<double> n(0.0, 0.05);
    m.params.emplace_back(w.begin(), w.end());
    for (double& x : m.params.back()) x += n(rng);
    m.grads.emplace_back(w.size(), 0.0);
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < kB * kT; ++i) {
    m.tokens.push_back(static_cast<int32_t>(rng() % d.V));
    m.targets.push_back(static_cast<int32_t>(rng() % d.V));
  }
  return m;
}

template <typename T>
double RunModel(Backend<T>& be, const GptDims& d, std::vector<std::vector<T>>& params,
           std::vector<std::vector<T>>& grads, const Model& m) {
  std::vector<const T*> p;
  std::vector<T*> g;
  for (auto& x : params) p.push_back(x.data());
  for (auto& x : grads) {
    std::fill(x.begin(), x.end(), T(0));
    g.push_back(x.data());
  }
  auto loss = ResidentForwardBackward<T>(be, d, p, g, m.tokens.data(), m.targets.data(), kB, kT,
                                         T(1));
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  return loss.ok() ? *loss : NAN;
}

// Every parameter of every unit: analytic gradient vs (L(w+h) - L(w-h)) / 2h in double.
// Bound: the central difference's truncation error is O(h²·|L'''|) ~ 1e-12 with h = 1e-5, and its
// rounding error ~ eps·|L|/h ~ 1e-16·2.4/1e-5 ~ 2.4e-11; we allow 1e-8 absolute plus 1e-6 relative,
// far above both and far below any real mistake (a wrong term is of the order of the gradient).
TEST(GptTest, GradientsMatchFiniteDifferencesInDouble) {
  auto be = MakeCpuBackend<double>({.threads = 1});
  Model m = MakeModel(kTiny, 7);
  const double loss = RunModel(*be, kTiny, m.params, m.grads, m);
  EXPECT_GT(loss, 0.5 * std::log(11.0));
  auto analytic = m.grads;
  std::vector<std::vector<double>> scratch = m.grads;
  const double h = 1e-5;
  int checked = 0;
  for (uint32_t u = 0; u < kTiny.units(); ++u) {
    for (size_t i = 0; i < m.params[u].size(); ++i) {
      const double w = m.params[u][i];
      m.params[u][i] = w + h;
      const double lp = RunModel(*be, kTiny, m.params, scratch, m);
      m.params[u][i] = w - h;
      const double lm = RunModel(*be, kTiny, m.params, scratch, m);
      m.params[u][i] = w;
      const double fd = (lp - lm) / (2 * h);
      const double a = analytic[u][i];
      ASSERT_NEAR(a, fd, 1e-8 + 1e-6 * std::abs(fd))
          << kTiny.UnitName(u) << " parameter " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, static_cast<int>(kTiny.TotalParams()));
}

// The float model agrees with the double one to fp32 accuracy (same code, other precision).
TEST(GptTest, FloatMatchesDouble) {
  auto bd = MakeCpuBackend<double>({.threads = 1});
  auto bf = MakeCpuBackend<float>({.threads = 2});
  Model m = MakeModel(kTiny, 11);
  std::vector<std::vector<float>> pf, gf;
  for (auto& p : m.params) pf.emplace_back(p.begin(), p.end());
  for (auto& g : m.grads) gf.emplace_back(g.size());
  // The double run on the float-rounded weights, so both see the same model.
  for (size_t u = 0; u < pf.size(); ++u) m.params[u].assign(pf[u].begin(), pf[u].end());
  const double ld = RunModel(*bd, kTiny, m.params, m.grads, m);
  const double lf = RunModel(*bf, kTiny, pf, gf, m);
  EXPECT_NEAR(lf, ld, 1e-5 * ld);
  double max_g = 0;
  for (auto& g : m.grads) for (double x : g) max_g = std::max(max_g, std::abs(x));
  for (size_t u = 0; u < gf.size(); ++u) {
    for (size_t i = 0; i < gf[u].size(); ++i) {
      ASSERT_NEAR(gf[u][i], m.grads[u][i], 1e-5 * max_g + 1e-4 * std::abs(m.grads[u][i]))
          << kTiny.UnitName(static_cast<uint32_t>(u)) << " " << i;
    }
  }
}

TEST(GptTest, FloatIsDeterministic) {
  auto be = MakeCpuBackend<float>({.threads = 2});
  Model m = MakeModel(kTiny, 3);
  std::vector<std::vector<float>> p, g1, g2;
  for (auto& x : m.params) p.emplace_back(x.begin(), x.end());
  for (auto& x : m.grads) { g1.emplace_back(x.size()); g2.emplace_back(x.size()); }
  const double l1 = RunModel(*be, kTiny, p, g1, m);
  const double l2 = RunModel(*be, kTiny, p, g2, m);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(g1, g2);
}

TEST(GptTest, UnitLayoutMatchesParameterCounts) {
  ModelConfig mc{.layers = 3, .width = 16, .heads = 4, .seq_len = 9, .vocab = 31};
  GptDims d = GptDims::FromConfig(mc);
  EXPECT_EQ(d.TotalParams(), mc.TotalParams());
  EXPECT_EQ(d.MaxUnitParams(), mc.LargestUnitParams());
  for (uint32_t u = 0; u < d.units(); ++u) {
    auto t = UnitTensors(d, u);
    uint64_t n = 0;
    for (auto& x : t) {
      EXPECT_EQ(x.offset, n) << x.name;
      n += x.elems;
    }
    EXPECT_EQ(n, d.UnitParams(u)) << d.UnitName(u);
  }
  EXPECT_EQ(UnitTensors(d, 2)[2].name, "transformer.h.1.attn.c_attn.weight");
  EXPECT_EQ(UnitTensors(d, 0)[0].shape, (std::vector<int64_t>{31, 16}));
}

// GPT-2 init: N(0, 0.02) weights, residual projections N(0, 0.02/sqrt(2L)), zero biases, unit LN.
TEST(GptTest, InitFollowsGpt2AndIsDeterministic) {
  GptDims d{.L = 4, .C = 64, .NH = 4, .V = 256, .seq = 32};
  std::vector<float> a(d.UnitParams(1)), b(d.UnitParams(1));
  InitUnit(d, 1, 42, a.data());
  InitUnit(d, 1, 42, b.data());
  EXPECT_EQ(a, b);
  InitUnit(d, 2, 42, b.data());
  EXPECT_NE(a, b);
  for (const TensorInfo& t : UnitTensors(d, 1)) {
    double s = 0, s2 = 0;
    for (uint64_t i = 0; i < t.elems; ++i) {
      s += a[t.offset + i];
      s2 += a[t.offset + i] * a[t.offset + i];
    }
    const double mean = s / t.elems, sd = std::sqrt(s2 / t.elems - mean * mean);
    if (t.name.ends_with("bias")) {
      EXPECT_EQ(s2, 0.0) << t.name;
    } else if (t.name.find("ln_") != std::string::npos) {
      EXPECT_EQ(mean, 1.0) << t.name;
    } else {
      const double want = t.name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(8.0) : 0.02;
      EXPECT_NEAR(sd, want, 0.05 * want) << t.name;
      EXPECT_NEAR(mean, 0.0, 0.1 * want) << t.name;
    }
  }
}

}  // namespace
}  // namespace zinf::train
