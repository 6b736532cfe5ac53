// kernels::AdamStep with bf16 moments rounded stochastically (AdamBuffers::stochastic_state):
// the rounding is unbiased, deterministic (the same seed gives the same bits in every variant,
// for any thread count and chunking, and for a tensor stepped in pieces given their offsets;
// another seed other bits), and lets the second moment decay where rounding to nearest
// freezes it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/half_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

// beta1 = beta2 = 0: m = g and v = g * g exactly (one fp32 rounding of g * g, the same in every
// variant), so the stored moments are the roundings of known values.
struct Case {
  size_t n;
  std::vector<float> param, grad;
  std::vector<uint16_t> m, v;
  explicit Case(size_t n_, float g) : n(n_), param(n_, 1.0f), grad(n_, g), m(n_, 0), v(n_, 0) {}
  Status Run(KernelVariant variant, uint64_t seed, bool stochastic, int threads = 2,
             size_t chunk = kDefaultChunkElems) {
    AdamBuffers b{param.data(), grad.data(), DType::kF32, m.data(), v.data(),
                  DType::kBf16, nullptr,     DType::kBf16, n};
    b.stochastic_state = stochastic;
    b.state_seed = seed;
    AdamHyper h;
    h.beta1 = 0.0f;
    h.beta2 = 0.0f;
    AdamOptions o;
    o.variant = variant;
    o.threads = threads;
    o.chunk_elems = chunk;
    return AdamStep(h, b, o).status();
  }
};

// g sits a quarter of the way from one bf16 value to the next: rounded to nearest it always
// goes down; stochastically, a quarter of the elements go up.
constexpr float kQuarter = 1.0f + 0.25f / 128;  // bf16 keeps 7 fraction bits: ulp(1) = 2^-7

TEST(AdamStochasticTest, UnbiasedWhereNearestAlwaysRoundsDown) {
  constexpr size_t kN = 100000;
  Case sr(kN, kQuarter), nearest(kN, kQuarter);
  ASSERT_TRUE(sr.Run(KernelVariant::kAuto, 7, true).ok());
  ASSERT_TRUE(nearest.Run(KernelVariant::kAuto, 7, false).ok());
  const uint16_t down = FloatToBf16(1.0f), up = static_cast<uint16_t>(down + 1);
  size_t ups = 0;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_TRUE(sr.m[i] == down || sr.m[i] == up) << i;
    ups += sr.m[i] == up;
    ASSERT_EQ(nearest.m[i], down) << i;
  }
  // Binomial(1e5, 0.25): standard deviation 0.0014.
  EXPECT_NEAR(static_cast<double>(ups) / kN, 0.25, 0.01);
}

TEST(AdamStochasticTest, SameSeedSameBitsInEveryVariantThreadCountAndChunking) {
  constexpr size_t kN = 5000 + 17;  // a ragged tail in every variant
  // Gradients of many magnitudes and both signs, plus the specials.
  Case ref(kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) {
    ref.grad[i] = std::ldexp(1.0f + static_cast<float>(i % 97) / 97.0f, static_cast<int>(i % 40) - 20) *
                  (i % 3 == 0 ? -1.0f : 1.0f);
  }
  ref.grad[5] = INFINITY;
  ref.grad[6] = -INFINITY;
  ref.grad[7] = NAN;
  const std::vector<float> grads = ref.grad;
  ASSERT_TRUE(ref.Run(KernelVariant::kScalar, 42, true, 1).ok());
  // The scalar variant is the statement of the rounding: its moments are those of
  // FloatToBf16Stochastic for some stream; infinities and NaN round as FloatToBf16 does.
  EXPECT_EQ(ref.m[5], FloatToBf16(INFINITY));
  EXPECT_EQ(ref.v[6], FloatToBf16(INFINITY));
  EXPECT_EQ(ref.m[7], FloatToBf16(NAN));
  for (KernelVariant variant : testing::ConcreteVariants()) {
    if (!testing::CpuHas(variant)) continue;
    for (auto [threads, chunk] : {std::pair{1, size_t{64}}, std::pair{2, size_t{1024}},
                                  std::pair{2, kDefaultChunkElems}}) {
      Case c(kN, 0.0f);
      c.grad = grads;
      ASSERT_TRUE(c.Run(variant, 42, true, threads, chunk).ok());
      EXPECT_EQ(c.m, ref.m) << VariantName(variant) << " threads " << threads << " chunk " << chunk;
      EXPECT_EQ(c.v, ref.v) << VariantName(variant) << " threads " << threads << " chunk " << chunk;
    }
  }
  Case other(kN, 0.0f);
  other.grad = grads;
  ASSERT_TRUE(other.Run(KernelVariant::kAuto, 43, true).ok());
  EXPECT_NE(other.m, ref.m) << "another seed draws other bits";
}

// A tensor stepped in pieces, each given its offset (AdamBuffers::state_index_base, as ZeRO
// chunks of a unit are), draws the bits the whole tensor's step draws: N ranks round as one.
// Without the offsets the pieces draw other bits.
TEST(AdamStochasticTest, PiecesGivenTheirOffsetDrawWhatTheWholeDraws) {
  constexpr size_t kN = 3001;
  Case whole(kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) whole.grad[i] = kQuarter * (1.0f + static_cast<float>(i % 13));
  const std::vector<float> grads = whole.grad;
  ASSERT_TRUE(whole.Run(KernelVariant::kAuto, 9, true).ok());
  for (bool with_offsets : {true, false}) {
    std::vector<uint16_t> m(kN), v(kN);
    std::vector<float> param(kN, 1.0f);
    for (size_t lo : {size_t{0}, size_t{1000}, size_t{2000}}) {  // 3 ranks' chunks, the last short
      const size_t len = lo == 2000 ? kN - lo : 1000;
      AdamBuffers b{param.data() + lo, grads.data() + lo, DType::kF32, m.data() + lo,
                    v.data() + lo, DType::kBf16, nullptr, DType::kBf16, len};
      b.stochastic_state = true;
      b.state_seed = 9;
      b.state_index_base = with_offsets ? lo : 0;
      AdamHyper h;
      h.beta1 = 0.0f;
      h.beta2 = 0.0f;
      ASSERT_TRUE(AdamStep(h, b, AdamOptions{}).ok());
    }
    if (with_offsets) {
      EXPECT_EQ(m, whole.m);
      EXPECT_EQ(v, whole.v);
    } else {
      EXPECT_NE(m, whole.m) << "without offsets each piece draws from index 0";
    }
  }
}

// v = 1 and zero gradients, beta2 = 0.999: fp32 Adam decays v by 0.1% a step. Rounded to
// nearest, bf16 v never moves (0.1% is below half its ulp); rounded stochastically it decays
// as fp32's does, on average.
TEST(AdamStochasticTest, TheSecondMomentDecaysWhereNearestFreezesIt) {
  constexpr size_t kN = 20000;
  constexpr int kSteps = 200;
  for (bool stochastic : {false, true}) {
    std::vector<float> param(kN, 1.0f), grad(kN, 0.0f);
    std::vector<uint16_t> m(kN, 0), v(kN, FloatToBf16(1.0f));
    for (int step = 1; step <= kSteps; ++step) {
      AdamBuffers b{param.data(), grad.data(), DType::kF32, m.data(), v.data(),
                    DType::kBf16, nullptr,     DType::kBf16, kN};
      b.stochastic_state = stochastic;
      b.state_seed = StateRoundingSeed(1337, step, 0);
      AdamHyper h;
      h.step = step;
      ASSERT_TRUE(AdamStep(h, b, {}).ok());
    }
    double mean = 0;
    for (uint16_t x : v) mean += Bf16ToFloat(x);
    mean /= kN;
    if (stochastic) {
      EXPECT_NEAR(mean, std::pow(0.999, kSteps), 0.005);
    } else {
      EXPECT_EQ(mean, 1.0);
    }
  }
}

TEST(AdamStochasticTest, SeedsDifferByStepAndTensor) {
  EXPECT_EQ(StateRoundingSeed(1, 2, 3), StateRoundingSeed(1, 2, 3));
  EXPECT_NE(StateRoundingSeed(1, 2, 3), StateRoundingSeed(1, 3, 3));
  EXPECT_NE(StateRoundingSeed(1, 2, 3), StateRoundingSeed(1, 2, 4));
  EXPECT_NE(StateRoundingSeed(1, 2, 3), StateRoundingSeed(2, 2, 3));
}

}  // namespace
}  // namespace zinf::kernels
