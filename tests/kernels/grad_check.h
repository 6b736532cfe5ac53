// tests/kernels/grad_check.h — the finite-difference gradient check the CPU model-op tests
// share (layer_ops_test, llama_ops_test), and their random inputs.
//
// CheckGradients(c, seed) perturbs every input element of c by ±kFdEps, compares c.backward's
// gradients of L = Σ w·out (w random) with the central differences, and checks that backward
// accumulates (from a random start it adds; called twice from zero it doubles).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace zinf::kernels::cpu {
namespace {

using Vec = std::vector<double>;
using Buffers = std::vector<Vec>;

// Uniform values in [lo, hi), rounded to float so float and double runs see the same inputs.
Vec Uniform(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(n);
  for (double& x : v) x = static_cast<float>(dist(rng));
  return v;
}

template <typename T>
std::vector<T> Cast(const Vec& v) {
  return std::vector<T>(v.begin(), v.end());
}

double MaxAbs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// ---------------------------------------------------------------- finite-difference checks

// An op under the gradient check: the input buffers it perturbs, its forward (all outputs as
// one flat vector) and its backward, which must accumulate ∂(Σ dout·out)/∂inputs into grads.
struct GradCase {
  Buffers inputs;
  std::function<Vec(const Buffers&)> forward;
  std::function<void(const Buffers&, const Vec& dout, Buffers& grads)> backward;
};

// Tolerance of the central difference (L(x+ε) - L(x-ε)) / 2ε with ε = 1e-6, L = Σ w·out in
// double (the sum itself in long double). Truncation: ε²/6·|L'''| ~ 2e-13 for the O(1) third
// derivatives of these ops, negligible. Rounding: each out element carries a relative error of
// a few ulps to tens of ulps (u = 1.1e-16) from its dot products, exp and sqrt; divided by 2ε
// that is up to ~50·1.1e-16·|out·w| / 2e-6 ≈ 3e-9 per term the perturbation touches. Hence
// abs 1e-8 (the worst seen is 1.2e-9); rel 1e-7 absorbs the larger (|g| ~ 5) gradients.
constexpr double kFdEps = 1e-6;
constexpr double kFdAbs = 1e-8;
constexpr double kFdRel = 1e-7;
// Accumulation checks compare two double computations of the same sums in different orders.
constexpr double kAccTol = 1e-12;

Buffers ZerosLike(const Buffers& b) {
  Buffers z;
  for (const Vec& v : b) z.emplace_back(v.size(), 0.0);
  return z;
}

void CheckGradients(GradCase& c, uint32_t seed) {
  const Vec w = Uniform(c.forward(c.inputs).size(), seed);
  auto loss = [&] {
    const Vec out = c.forward(c.inputs);
    long double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<long double>(w[i]) * out[i];
    return static_cast<double>(s);
  };
  Buffers grads = ZerosLike(c.inputs);
  c.backward(c.inputs, w, grads);
  double grad_scale = 0;
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    grad_scale = std::max(grad_scale, MaxAbs(grads[k]));
    for (size_t i = 0; i < c.inputs[k].size(); ++i) {
      double& x = c.inputs[k][i];
      const double x0 = x;
      x = x0 + kFdEps;
      const double lp = loss();
      x = x0 - kFdEps;
      const double lm = loss();
      x = x0;
      const double fd = (lp - lm) / (2 * kFdEps);
      ASSERT_NEAR(grads[k][i], fd, kFdAbs + kFdRel * std::abs(fd)) << "input " << k << "[" << i
                                                                   << "]";
    }
  }
  EXPECT_GT(grad_scale, 1e-3) << "vacuous check: every gradient is ~0";

  // Accumulation: starting from g0 the backward adds; called twice from zero it doubles.
  Buffers acc;
  for (size_t k = 0; k < c.inputs.size(); ++k)
    acc.push_back(Uniform(c.inputs[k].size(), seed + 100 + uint32_t(k)));
  const Buffers g0 = acc;
  c.backward(c.inputs, w, acc);
  Buffers twice = ZerosLike(c.inputs);
  c.backward(c.inputs, w, twice);
  c.backward(c.inputs, w, twice);
  for (size_t k = 0; k < c.inputs.size(); ++k)
    for (size_t i = 0; i < c.inputs[k].size(); ++i) {
      ASSERT_NEAR(acc[k][i], g0[k][i] + grads[k][i], kAccTol * (1 + std::abs(acc[k][i])));
      ASSERT_NEAR(twice[k][i], 2 * grads[k][i], kAccTol * (1 + std::abs(twice[k][i])));
    }
}

// Every op's results by name, as a test's RunAll<T> returns them.
template <typename T>
using Results = std::map<std::string, std::vector<T>>;

// float against double on the same (float-representable) inputs: within 1e-5 of the buffer's
// largest magnitude (sums of up to ~100 terms in fp32) plus 1e-6 of the value.
inline void ExpectFloatMatchesDouble(const Results<float>& f, const Results<double>& d,
                                     const char* shape) {
  for (const auto& [name, dv] : d) {
    const std::vector<float>& fv = f.at(name);
    double scale = 0;
    for (double v : dv) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < dv.size(); ++i)
      ASSERT_NEAR(fv[i], dv[i], 1e-5 * scale + 1e-6 * std::abs(dv[i]))
          << name << "[" << i << "] " << shape;
  }
}

// The same bits in every buffer of a and b.
inline void ExpectSameBits(const Results<float>& a, const Results<float>& b, const char* what) {
  for (const auto& [name, v] : a) {
    ASSERT_EQ(std::memcmp(v.data(), b.at(name).data(), v.size() * sizeof(float)), 0)
        << name << " " << what;
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
