// Tests of kernels/cpu/adam.h: every SIMD variant against a double-precision reference, the
// non-finite skip, input validation and variant selection.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/half_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

using testing::AlignedBytes;
using testing::FillMixed;

// Tolerance. The kernel computes in fp32 (unit roundoff u = 2^-24 ~ 6e-8); the reference
// computes the same formulas in double from the kernel's own inputs, so each comparison sees
// one step's rounding only. The longest chain (scaled gradient -> m -> m / denom -> p) has
// about 8 fp32 roundings plus 3 rounded coefficients (lr / bc1, 1 / sqrt(bc2), 1 - beta2),
// each bounded by u times the magnitude of the terms it combines, so the error is below
// ~11u = 6.6e-7 of the SUM OF ABSOLUTE VALUES of the terms. We check, as llm.c does,
// |got - ref| <= atol + rtol * magnitude with rtol = 1e-6 and magnitude that sum (not |ref|,
// which can be tiny after cancellation, e.g. p ~ update). atol covers results that underflow
// into fp32 denormals, whose absolute precision is 2^-149 ~ 1.4e-45 per operation, and
// propagates m's atol through the division (step_size * atol / denom); v's bound reaches the
// update through sqrt(v) and the division (see denom_err below).
constexpr double kRtol = 1e-6;
constexpr double kTinyAtol = 1e-44;
// bf16 storage of m and v adds one rounding to nearest even (8 significant bits): relative
// 2^-8, or half a bf16
// denormal step (2^-134) near zero.
constexpr double kBf16Rel = 1.0 / 256;
constexpr double kBf16Abs = 1.0 / (1ull << 63) / (1ull << 63) / 8;  // 2^-129, generous

struct Config {
  const char* name;
  bool adamw;
  float weight_decay;
  bool bias_correction;
  float grad_scale;
  int64_t first_step;
};

constexpr Config kConfigs[] = {
    {"adam", false, 0.0f, true, 1.0f, 1},
    {"adam_l2", false, 0.01f, true, 1.0f, 1},
    {"adamw", true, 0.1f, true, 1.0f, 1},
    {"adamw_no_bias_correction", true, 0.01f, false, 1.0f, 1},
    {"adam_l2_scaled_late", false, 0.001f, true, 1.0f / 1024, 1000},
    {"adamw_scaled", true, 0.05f, true, 0.37f, 3},
};

// The buffers of one test problem, with state carried between steps.
struct Problem {
  size_t n;
  DType grad_type, state_type;
  bool has_p16;
  DType p16_type;
  AlignedBytes param, grad, m, v, p16;
  Problem(size_t n_, DType g, DType s, bool has16, DType t16)
      : n(n_),
        grad_type(g),
        state_type(s),
        has_p16(has16),
        p16_type(t16),
        param(n_ * 4),
        grad(n_ * 4),
        m(n_ * 4),
        v(n_ * 4),
        p16(n_ * 2) {}
  AdamBuffers Buffers() {
    AdamBuffers b;
    b.param = param.as<float>();
    b.grad = grad.data();
    b.grad_type = grad_type;
    b.exp_avg = m.data();
    b.exp_avg_sq = v.data();
    b.state_type = state_type;
    b.param16_out = has_p16 ? p16.data() : nullptr;
    b.param16_type = p16_type;
    b.n = n;
    return b;
  }
};

struct Snapshot {
  std::vector<float> p, g, m, v;
};

Snapshot Read(Problem& pr) {
  Snapshot s;
  for (size_t i = 0; i < pr.n; ++i) {
    s.p.push_back(pr.param.as<float>()[i]);
    s.g.push_back(LoadAsFloat(pr.grad.data(), pr.grad_type, i));
    s.m.push_back(LoadAsFloat(pr.m.data(), pr.state_type, i));
    s.v.push_back(LoadAsFloat(pr.v.data(), pr.state_type, i));
  }
  return s;
}

// Checks one step: `before` (inputs the kernel saw) -> the kernel's outputs in `pr`.
void ExpectStepMatchesReference(const AdamHyper& h, const Snapshot& before, Problem& pr,
                                const std::string& where) {
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay;
  const double t = static_cast<double>(h.step);
  const double bc1 = h.bias_correction ? 1 - std::pow(b1, t) : 1;
  const double bc2 = h.bias_correction ? 1 - std::pow(b2, t) : 1;
  const double step_size = lr / bc1;
  const bool bf16_state = pr.state_type == DType::kBf16;
  int failures = 0;
  for (size_t i = 0; i < pr.n && failures < 5; ++i) {
    const double p = before.p[i], m = before.m[i], v = before.v[i];
    const double graw = static_cast<double>(before.g[i]) * h.grad_scale;
    double g = graw, g_mag = std::fabs(graw);
    if (!h.adamw) {
      g += wd * p;
      g_mag += wd * std::fabs(p);
    }
    const double pd = h.adamw ? p * (1 - lr * wd) : p;
    const double m_ref = b1 * m + (1 - b1) * g;
    const double v_ref = b2 * v + (1 - b2) * g * g;
    const double m_mag = b1 * std::fabs(m) + (1 - b1) * g_mag;
    const double v_mag = b2 * v + (1 - b2) * g_mag * g_mag;
    const double denom = std::sqrt(v_ref) / std::sqrt(bc2) + eps;
    const double p_ref = pd - step_size * m_ref / denom;
    const double p_mag = std::fabs(pd) + step_size * m_mag / denom;

    const double p_got = pr.param.as<float>()[i];
    const double m_got = LoadAsFloat(pr.m.data(), pr.state_type, i);
    const double v_got = LoadAsFloat(pr.v.data(), pr.state_type, i);
    double m_tol = kTinyAtol + kRtol * m_mag, v_tol = kTinyAtol + kRtol * v_mag;
    if (bf16_state) {
      m_tol += kBf16Rel * std::fabs(m_ref) + kBf16Abs;
      v_tol += kBf16Rel * std::fabs(v_ref) + kBf16Abs;
    }
    // v's error (which can be large relative to v after cancellation in Adam's g + wd * p)
    // reaches the update through sqrt(v): |sqrt(a) - sqrt(b)| <= min(|a - b| / (2 sqrt(b)),
    // sqrt(|a - b|)).
    const double v_err = kRtol * v_mag + kTinyAtol;
    const double sqrt_err =
        v_ref > 0 ? std::min(v_err / (2 * std::sqrt(v_ref)), std::sqrt(v_err)) : std::sqrt(v_err);
    const double denom_err = sqrt_err / std::sqrt(bc2) + kRtol * denom;
    const double p_tol = kTinyAtol + kRtol * p_mag + step_size * kTinyAtol / denom +
                         step_size * std::fabs(m_ref) * denom_err / (denom * denom);
    const bool ok = std::fabs(p_got - p_ref) <= p_tol && std::fabs(m_got - m_ref) <= m_tol &&
                    std::fabs(v_got - v_ref) <= v_tol;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << where << " element " << i << ": p " << p << " g " << before.g[i] << " m "
                    << m << " v " << v << "\n  param got " << p_got << " want " << p_ref << " (tol "
                    << p_tol << ")\n  m got " << m_got << " want " << m_ref << " (tol " << m_tol
                    << ")\n  v got " << v_got << " want " << v_ref << " (tol " << v_tol << ")";
    }
    if (pr.has_p16) {
      const uint16_t got16 = pr.p16.as<uint16_t>()[i];
      const float p32 = pr.param.as<float>()[i];
      const uint16_t want16 = pr.p16_type == DType::kBf16 ? FloatToBf16(p32) : FloatToF16(p32);
      if (got16 != want16) {
        ++failures;
        ADD_FAILURE() << where << " element " << i << ": param16 0x" << std::hex << got16
                      << " but rounding param " << p32 << " gives 0x" << want16;
      }
    }
  }
}

using VariantCombo = std::tuple<KernelVariant, DType, DType, int>;  // variant, grad, state, out16

class AdamVsReference : public ::testing::TestWithParam<VariantCombo> {};

TEST_P(AdamVsReference, ConsecutiveStepsMatchDoublePrecision) {
  const auto [variant, grad_type, state_type, out16] = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  // 3 chunks of 1024 plus a ragged tail, on 2 threads.
  constexpr size_t kN = 3 * 1024 + 37;
  const float max_grad = grad_type == DType::kF16 ? 6.0e4f : 1.0e15f;
  for (const Config& cfg : kConfigs) {
    std::mt19937 rng(1234);
    Problem pr(kN, grad_type, state_type, out16 != 0, out16 == 2 ? DType::kF16 : DType::kBf16);
    FillMixed(pr.param.data(), DType::kF32, kN, rng, 1e10f);
    FillMixed(pr.m.data(), state_type, kN, rng, 1e10f);
    FillMixed(pr.v.data(), state_type, kN, rng, 1e20f, /*non_negative=*/true);
    AdamOptions options;
    options.variant = variant;
    options.threads = 2;
    options.chunk_elems = 1024;
    for (int k = 0; k < 3; ++k) {
      FillMixed(pr.grad.data(), grad_type, kN, rng, max_grad);
      AdamHyper h;
      h.lr = 1e-3f;
      h.adamw = cfg.adamw;
      h.weight_decay = cfg.weight_decay;
      h.bias_correction = cfg.bias_correction;
      h.grad_scale = cfg.grad_scale;
      h.step = cfg.first_step + k;
      const Snapshot before = Read(pr);
      Result<AdamStepInfo> info = AdamStep(h, pr.Buffers(), options);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_FALSE(info->found_nonfinite);
      EXPECT_EQ(info->variant, variant);
      ExpectStepMatchesReference(h, before, pr,
                                 std::string(cfg.name) + " step " + std::to_string(h.step));
    }
  }
}

std::string ComboName(const ::testing::TestParamInfo<VariantCombo>& info) {
  const auto [variant, grad, state, out16] = info.param;
  return std::string(VariantName(variant)) + "_grad_" + std::string(DTypeName(grad)) + "_state_" +
         std::string(DTypeName(state)) +
         (out16 == 0   ? "_no16"
          : out16 == 1 ? "_out_bf16"
                       : "_out_fp16");
}

INSTANTIATE_TEST_SUITE_P(
    AllCombos, AdamVsReference,
    ::testing::Combine(::testing::ValuesIn(testing::ConcreteVariants()),
                       ::testing::Values(DType::kF32, DType::kBf16, DType::kF16),
                       ::testing::Values(DType::kF32, DType::kBf16), ::testing::Values(0, 1, 2)),
    ComboName);

// ---- determinism across threads, chunking, alignment and store kind -----------------------

class AdamPerVariant : public ::testing::TestWithParam<KernelVariant> {};

// Runs one bf16-output step on fresh copies of the same inputs; returns param and param16.
std::pair<std::vector<float>, std::vector<uint16_t>> RunOnce(KernelVariant variant, size_t n,
                                                             size_t offset_elems, int threads,
                                                             size_t chunk, bool stream) {
  std::mt19937 rng(99);
  AlignedBytes param((n + offset_elems) * 4), grad((n + offset_elems) * 4),
      m((n + offset_elems) * 4), v((n + offset_elems) * 4), p16((n + offset_elems) * 2);
  const size_t o4 = offset_elems * 4, o2 = offset_elems * 2;
  FillMixed(param.data() + o4, DType::kF32, n, rng, 1e6f);
  FillMixed(grad.data() + o4, DType::kF32, n, rng, 1e6f);
  FillMixed(m.data() + o4, DType::kF32, n, rng, 1e3f);
  FillMixed(v.data() + o4, DType::kF32, n, rng, 1e3f, true);
  AdamBuffers b;
  b.param = param.as<float>(o4);
  b.grad = grad.data() + o4;
  b.exp_avg = m.data() + o4;
  b.exp_avg_sq = v.data() + o4;
  b.param16_out = p16.data() + o2;
  b.n = n;
  AdamHyper h;
  h.adamw = true;
  h.weight_decay = 0.01f;
  h.step = 5;
  AdamOptions o;
  o.variant = variant;
  o.threads = threads;
  o.chunk_elems = chunk;
  o.stream_param16 = stream;
  Result<AdamStepInfo> info = AdamStep(h, b, o);
  EXPECT_TRUE(info.ok()) << info.status().ToString();
  std::vector<float> p_out(b.param, b.param + n);
  std::vector<uint16_t> p16_out(p16.as<uint16_t>(o2), p16.as<uint16_t>(o2) + n);
  return {p_out, p16_out};
}

TEST_P(AdamPerVariant, ResultDoesNotDependOnThreadsChunksAlignmentOrStreaming) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  constexpr size_t kN = 10000 + 13;
  const auto base = RunOnce(variant, kN, 0, 1, 1 << 20, false);
  EXPECT_EQ(base, RunOnce(variant, kN, 0, 2, 64, false));
  EXPECT_EQ(base, RunOnce(variant, kN, 0, 2, 1000, true));  // rounded up to 1024
  EXPECT_EQ(base, RunOnce(variant, kN, 0, 2, 4096, true));
  EXPECT_EQ(base, RunOnce(variant, kN, 1, 2, 4096, true));  // misaligned: streaming falls back
  EXPECT_EQ(base, RunOnce(variant, kN, 3, 1, 512, false));
}

TEST_P(AdamPerVariant, TinySizesUseOnlyTheirElements) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  for (size_t n : {1, 2, 7, 15, 16, 17, 31, 33, 63, 65}) {
    // Guard elements after n must stay untouched.
    std::vector<float> param(n + 8, 1.0f), grad(n + 8, 0.5f), m(n + 8, 0.0f), v(n + 8, 0.0f);
    std::vector<uint16_t> p16(n + 8, 0xabcd);
    AdamBuffers b{param.data(), grad.data(), DType::kF32,  m.data(), v.data(),
                  DType::kF32,  p16.data(),  DType::kBf16, n};
    AdamOptions o;
    o.variant = variant;
    ASSERT_TRUE(AdamStep(AdamHyper{}, b, o).ok());
    for (size_t i = 0; i < n; ++i) {
      // First step with bias correction: the update is lr * sign(g) (up to eps).
      EXPECT_NEAR(param[i], 1.0f - 1e-3f, 1e-6f) << "n " << n << " i " << i;
      EXPECT_EQ(p16[i], FloatToBf16(param[i]));
    }
    for (size_t i = n; i < n + 8; ++i) {
      EXPECT_EQ(param[i], 1.0f);
      EXPECT_EQ(m[i], 0.0f);
      EXPECT_EQ(v[i], 0.0f);
      EXPECT_EQ(p16[i], 0xabcd);
    }
  }
}

// ---- non-finite gradients ------------------------------------------------------------------

TEST_P(AdamPerVariant, NonFiniteGradientIsDetectedAndNothingIsModified) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  constexpr size_t kN = 5000 + 3;
  for (DType grad_type : {DType::kF32, DType::kBf16, DType::kF16}) {
    for (size_t pos : {size_t{0}, kN / 2, kN - 1}) {
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        std::mt19937 rng(7);
        Problem pr(kN, grad_type, DType::kF32, true, DType::kBf16);
        FillMixed(pr.param.data(), DType::kF32, kN, rng, 1e6f);
        FillMixed(pr.grad.data(), grad_type, kN, rng, 1e4f);
        FillMixed(pr.m.data(), DType::kF32, kN, rng, 1e3f);
        FillMixed(pr.v.data(), DType::kF32, kN, rng, 1e3f, true);
        std::memset(pr.p16.data(), 0x5a, kN * 2);
        StoreFromFloat(pr.grad.data(), grad_type, pos, bad);
        const std::vector<unsigned char> param0(pr.param.data(), pr.param.data() + kN * 4),
            m0(pr.m.data(), pr.m.data() + kN * 4), v0(pr.v.data(), pr.v.data() + kN * 4),
            p16_0(pr.p16.data(), pr.p16.data() + kN * 2);
        AdamOptions o;
        o.variant = variant;
        o.threads = 2;
        o.chunk_elems = 1024;
        o.check_finite = true;
        Result<AdamStepInfo> info = AdamStep(AdamHyper{}, pr.Buffers(), o);
        ASSERT_TRUE(info.ok()) << info.status().ToString();
        const std::string where = std::string(DTypeName(grad_type)) + " grad, " +
                                  std::to_string(bad) + " at " + std::to_string(pos);
        EXPECT_TRUE(info->found_nonfinite) << where;
        EXPECT_EQ(0, std::memcmp(param0.data(), pr.param.data(), kN * 4)) << where;
        EXPECT_EQ(0, std::memcmp(m0.data(), pr.m.data(), kN * 4)) << where;
        EXPECT_EQ(0, std::memcmp(v0.data(), pr.v.data(), kN * 4)) << where;
        EXPECT_EQ(0, std::memcmp(p16_0.data(), pr.p16.data(), kN * 2)) << where;
      }
    }
  }
}

TEST_P(AdamPerVariant, CheckFiniteWithFiniteGradientsRunsTheStep) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  // The largest finite values of each type must not count as non-finite.
  std::vector<float> param(100, 1.0f), m(100, 0.0f), v(100, 0.0f);
  std::vector<float> grad(100, 3.4028235e38f);
  AdamBuffers b{param.data(), grad.data(), DType::kF32,  m.data(), v.data(),
                DType::kF32,  nullptr,     DType::kBf16, 100};
  AdamOptions o;
  o.variant = variant;
  o.check_finite = true;
  Result<AdamStepInfo> info = AdamStep(AdamHyper{}, b, o);
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->found_nonfinite);
  EXPECT_NE(m[0], 0.0f);  // the step ran (v overflows to inf, so param itself barely moves)
  std::vector<uint16_t> g16(100, 0x7f7f);  // bf16 max
  b.grad = g16.data();
  b.grad_type = DType::kBf16;
  EXPECT_FALSE(AdamStep(AdamHyper{}, b, o)->found_nonfinite);
  std::fill(g16.begin(), g16.end(), 0xfbff);  // fp16 -65504
  b.grad_type = DType::kF16;
  EXPECT_FALSE(AdamStep(AdamHyper{}, b, o)->found_nonfinite);
}

INSTANTIATE_TEST_SUITE_P(Variants, AdamPerVariant, ::testing::ValuesIn(testing::ConcreteVariants()),
                         [](const ::testing::TestParamInfo<KernelVariant>& info) {
                           return std::string(VariantName(info.param));
                         });

// ---- validation ----------------------------------------------------------------------------

class AdamValidation : public ::testing::Test {
 protected:
  std::vector<float> param_ = std::vector<float>(8, 1.0f), grad_ = std::vector<float>(8, 1.0f),
                     m_ = std::vector<float>(8, 0.0f), v_ = std::vector<float>(8, 0.0f);
  AdamBuffers Good() {
    return {param_.data(), grad_.data(), DType::kF32,  m_.data(), v_.data(),
            DType::kF32,   nullptr,      DType::kBf16, 8};
  }
  void ExpectInvalid(const AdamHyper& h, const AdamBuffers& b, const std::string& needle,
                     AdamOptions o = {}) {
    const std::vector<float> param0 = param_;
    Result<AdamStepInfo> r = AdamStep(h, b, o);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
    EXPECT_EQ(param0, param_);
  }
};

TEST_F(AdamValidation, RejectsNullBuffers) {
  AdamBuffers b = Good();
  b.param = nullptr;
  ExpectInvalid({}, b, "param is null");
  b = Good();
  b.grad = nullptr;
  ExpectInvalid({}, b, "grad is null");
  b = Good();
  b.exp_avg = nullptr;
  ExpectInvalid({}, b, "exp_avg is null");
  b = Good();
  b.exp_avg_sq = nullptr;
  ExpectInvalid({}, b, "exp_avg_sq is null");
}

TEST_F(AdamValidation, RejectsBadDtypes) {
  AdamBuffers b = Good();
  b.state_type = DType::kF16;
  ExpectInvalid({}, b, "state_type fp16");
  b = Good();
  std::vector<float> out(8);
  b.param16_out = out.data();
  b.param16_type = DType::kF32;
  ExpectInvalid({}, b, "param16_type");
  b = Good();
  b.grad_type = static_cast<DType>(9);
  ExpectInvalid({}, b, "grad_type");
}

TEST_F(AdamValidation, RejectsBadHyperParameters) {
  AdamHyper h;
  h.step = 0;
  ExpectInvalid(h, Good(), "1-based");
  h = {};
  h.beta1 = 1.0f;
  ExpectInvalid(h, Good(), "beta1");
  h = {};
  h.beta2 = -0.1f;
  ExpectInvalid(h, Good(), "beta2");
  h = {};
  h.lr = NAN;
  ExpectInvalid(h, Good(), "lr");
  h = {};
  h.eps = -1e-8f;
  ExpectInvalid(h, Good(), "eps");
  h = {};
  h.weight_decay = -1;
  ExpectInvalid(h, Good(), "weight_decay");
  h = {};
  h.grad_scale = INFINITY;
  ExpectInvalid(h, Good(), "grad_scale");
}

TEST_F(AdamValidation, RejectsBadOptions) {
  AdamOptions o;
  o.threads = -1;
  ExpectInvalid({}, Good(), "threads", o);
  o = {};
  o.chunk_elems = 0;
  ExpectInvalid({}, Good(), "chunk_elems", o);
}

TEST_F(AdamValidation, EmptySpanIsANoOpEvenWithNullPointers) {
  AdamBuffers b;
  b.n = 0;
  Result<AdamStepInfo> r = AdamStep(AdamHyper{}, b);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->found_nonfinite);
}

// ---- variant selection ---------------------------------------------------------------------

TEST(AdamVariantSelection, AutoRunsTheBestVariantAndEnvironmentCanForceOne) {
  std::vector<float> p(4, 1.0f), g(4, 1.0f), m(4, 0.0f), v(4, 0.0f);
  AdamBuffers b{p.data(),    g.data(), DType::kF32,  m.data(), v.data(),
                DType::kF32, nullptr,  DType::kBf16, 4};
  unsetenv(kVariantEnvVar);
  Result<AdamStepInfo> r = AdamStep(AdamHyper{}, b);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->variant, BestVariant(DetectCpuFeatures()));
  setenv(kVariantEnvVar, "scalar", 1);
  r = AdamStep(AdamHyper{}, b);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->variant, KernelVariant::kScalar);
  if (testing::CpuHas(KernelVariant::kAvx2)) {
    AdamOptions o;
    o.variant = KernelVariant::kAvx2;  // an explicit choice wins over the environment
    r = AdamStep(AdamHyper{}, b, o);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->variant, KernelVariant::kAvx2);
  }
  setenv(kVariantEnvVar, "sse9", 1);
  r = AdamStep(AdamHyper{}, b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ZINF_ADAM_VARIANT"), std::string::npos);
  unsetenv(kVariantEnvVar);
}

TEST(AdamBytes, CountsEveryStream) {
  EXPECT_EQ(AdamBytesPerElement(DType::kF32, DType::kF32, false), 28u);
  EXPECT_EQ(AdamBytesPerElement(DType::kBf16, DType::kF32, false), 26u);
  EXPECT_EQ(AdamBytesPerElement(DType::kF32, DType::kF32, true), 30u);
  EXPECT_EQ(AdamBytesPerElement(DType::kF32, DType::kBf16, false), 20u);
}

}  // namespace
}  // namespace zinf::kernels
