// Tests of kernels/cpu/grad_ops.h: AccumulateGrad's arithmetic and finiteness flag, and the
// AllFinite scan, for every SIMD variant and source dtype; SumSquares's fixed order.
#include "kernels/cpu/grad_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half_convert.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

using testing::AlignedBytes;

class GradOpsPerVariant : public ::testing::TestWithParam<KernelVariant> {
 protected:
  KernelOptions Options() const {
    KernelOptions o;
    o.variant = GetParam();
    o.threads = 2;
    o.chunk_elems = 1024;
    return o;
  }
};

TEST_P(GradOpsPerVariant, AccumulateMatchesFusedMultiplyAdd) {
  ZINF_SKIP_IF_CPU_LACKS(GetParam());
  constexpr size_t kN = 4 * 1024 + 21;
  for (DType type : {DType::kF32, DType::kBf16, DType::kF16}) {
    std::mt19937 rng(11);
    AlignedBytes acc(kN * 4), src(kN * 4);
    const std::vector<float> acc0 = testing::FillMixed(acc.data(), DType::kF32, kN, rng, 1e6f);
    const std::vector<float> s = testing::FillMixed(src.data(), type, kN, rng, 6e4f);
    const float scale = 0.375f;
    Result<bool> finite = AccumulateGrad(acc.as<float>(), src.data(), type, kN, scale, Options());
    ASSERT_TRUE(finite.ok()) << finite.status().ToString();
    EXPECT_TRUE(*finite);
    for (size_t i = 0; i < kN; ++i) {
      // The scalar variant may round the product and the sum separately; SIMD ones fuse them.
      const float fused = std::fma(scale, s[i], acc0[i]);
      const float unfused = acc0[i] + scale * s[i];
      const float got = acc.as<float>()[i];
      ASSERT_TRUE(got == fused || got == unfused)
          << DTypeName(type) << " " << i << ": " << got << " vs " << fused;
    }
  }
}

TEST_P(GradOpsPerVariant, AccumulateReportsNonFiniteResults) {
  ZINF_SKIP_IF_CPU_LACKS(GetParam());
  constexpr size_t kN = 3000 + 5;
  for (DType type : {DType::kF32, DType::kBf16, DType::kF16}) {
    for (size_t pos : {size_t{0}, kN / 2, kN - 1}) {
      for (float bad : {INFINITY, -INFINITY, NAN}) {
        std::vector<float> acc(kN, 1.0f);
        AlignedBytes src(kN * 4);
        for (size_t i = 0; i < kN; ++i) StoreFromFloat(src.data(), type, i, 0.5f);
        StoreFromFloat(src.data(), type, pos, bad);
        Result<bool> finite = AccumulateGrad(acc.data(), src.data(), type, kN, 1.0f, Options());
        ASSERT_TRUE(finite.ok());
        EXPECT_FALSE(*finite) << DTypeName(type) << " " << bad << " at " << pos;
        EXPECT_EQ(acc[(pos + 1) % kN], 1.5f);  // the other elements still accumulate
      }
    }
    // A finite source that overflows the accumulator counts too.
    std::vector<float> acc(100, 3.0e38f);
    std::vector<float> src32(100, 3.0e38f);
    Result<bool> finite =
        AccumulateGrad(acc.data(), src32.data(), DType::kF32, 100, 1.0f, Options());
    ASSERT_TRUE(finite.ok());
    EXPECT_FALSE(*finite);
    // And an inf already in the accumulator.
    std::vector<float> acc2(100, 0.0f);
    acc2[99] = INFINITY;
    std::vector<float> zeros(100, 0.0f);
    EXPECT_FALSE(*AccumulateGrad(acc2.data(), zeros.data(), DType::kF32, 100, 1.0f, Options()));
  }
}

TEST_P(GradOpsPerVariant, AllFiniteFindsEveryKindOfNonFinite) {
  ZINF_SKIP_IF_CPU_LACKS(GetParam());
  constexpr size_t kN = 5000 + 9;
  for (DType type : {DType::kF32, DType::kBf16, DType::kF16}) {
    AlignedBytes buf(kN * 4);
    std::mt19937 rng(3);
    testing::FillMixed(buf.data(), type, kN, rng, type == DType::kF16 ? 6e4f : 3e38f);
    Result<bool> all = AllFinite(buf.data(), type, kN, Options());
    ASSERT_TRUE(all.ok());
    EXPECT_TRUE(*all) << DTypeName(type);
    for (size_t pos : {size_t{0}, size_t{1023}, size_t{1024}, kN / 2, kN - 1}) {
      for (float bad : {INFINITY, -INFINITY, NAN, -NAN}) {
        const float keep = LoadAsFloat(buf.data(), type, pos);
        StoreFromFloat(buf.data(), type, pos, bad);
        EXPECT_FALSE(*AllFinite(buf.data(), type, kN, Options()))
            << DTypeName(type) << " " << bad << " at " << pos;
        StoreFromFloat(buf.data(), type, pos, keep);
      }
    }
    EXPECT_TRUE(*AllFinite(buf.data(), type, kN, Options()));
    EXPECT_TRUE(*AllFinite(buf.data(), type, 0, Options()));
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GradOpsPerVariant,
                         ::testing::ValuesIn(testing::ConcreteVariants()),
                         [](const ::testing::TestParamInfo<KernelVariant>& info) {
                           return std::string(VariantName(info.param));
                         });

TEST(GradOps, RejectsBadArguments) {
  float x = 0;
  EXPECT_FALSE(AccumulateGrad(nullptr, &x, DType::kF32, 1).ok());
  EXPECT_FALSE(AccumulateGrad(&x, nullptr, DType::kF32, 1).ok());
  EXPECT_FALSE(AccumulateGrad(&x, &x, DType::kF32, 1, NAN).ok());
  EXPECT_FALSE(AllFinite(nullptr, DType::kF32, 1).ok());
  EXPECT_TRUE(AccumulateGrad(nullptr, nullptr, DType::kF32, 0).ok());
}

}  // namespace
}  // namespace zinf::kernels

namespace zinf::kernels::cpu {
namespace {

TEST(SumSquaresTest, ExactWideningsGiveTheSameBitsForEveryThreadCount) {
  const size_t n = 100003;  // several chunks and a ragged tail
  std::mt19937 rng(30);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  std::vector<double> x(n);
  for (double& v : x) v = u(rng);
  long double ref = 0;
  for (double v : x) ref += (long double)v * v;
  EXPECT_NEAR(SumSquares(x.data(), n), double(ref), 1e-12 * double(ref));
  EXPECT_EQ(SumSquares(x.data(), n, {.threads = 1}), SumSquares(x.data(), n, {.threads = 2}));
  // float widens exactly, so float and double agree bit for bit.
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(x[i]);
  const std::vector<double> widened(f.begin(), f.end());
  EXPECT_EQ(SumSquares(f.data(), n), SumSquares(widened.data(), n));
  EXPECT_EQ(SumSquares<float>(nullptr, 0), 0.0);
  // 16-bit values: the same bits as SumSquares over their exact widening to float.
  for (DType type : {DType::kBf16, DType::kF16}) {
    std::vector<uint16_t> h(n);
    std::vector<float> w(n);
    for (size_t i = 0; i < n; ++i) {
      h[i] = type == DType::kBf16 ? FloatToBf16(f[i]) : FloatToF16(f[i]);
      w[i] = type == DType::kBf16 ? Bf16ToFloat(h[i]) : F16ToFloat(h[i]);
    }
    EXPECT_EQ(SumSquares16(h.data(), type, n), SumSquares(w.data(), n)) << DTypeName(type);
    EXPECT_EQ(SumSquares16(h.data(), type, n, {.threads = 1}), SumSquares(w.data(), n));
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
