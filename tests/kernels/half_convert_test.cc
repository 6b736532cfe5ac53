// Tests of kernels/cpu/half_convert.h (the scalar bf16/fp16 conversions) against an
// independent double-precision reference, and of kernels/cpu/cast.h (every SIMD variant)
// against the scalar conversions, bit for bit.
#include "kernels/cpu/half_convert.h"

#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cast.h"
#include "tests/kernels/kernel_test_util.h"

namespace zinf::kernels {
namespace {

// Reference rounding of a finite float to a format with `mantissa_bits` stored bits and
// smallest normal exponent `min_exp`: scale to an integer count of quanta and round with
// nearbyint (the default rounding mode is to nearest, ties to even). Returns the rounded
// magnitude as a double (exact).
double RoundMagnitude(double a, int mantissa_bits, int min_exp) {
  if (a == 0) return 0;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1): leading bit at 2^(e-1)
  const int exponent = std::max(e - 1, min_exp);
  const double quantum = std::ldexp(1.0, exponent - mantissa_bits);
  return std::nearbyint(a / quantum) * quantum;
}

uint16_t ReferenceBf16(float x) {
  const uint32_t u = FloatBits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(x)) return static_cast<uint16_t>((u >> 16) | 0x40);
  if (std::isinf(x)) return sign | 0x7f80;
  const double r = RoundMagnitude(std::fabs(static_cast<double>(x)), 7, -126);
  if (r >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  return sign | static_cast<uint16_t>(FloatBits(static_cast<float>(r)) >> 16);
}

uint16_t ReferenceF16(float x) {
  const uint32_t u = FloatBits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(x)) return sign | 0x7e00 | ((u >> 13) & 0x3ff);
  if (std::isinf(x)) return sign | 0x7c00;
  const double r = RoundMagnitude(std::fabs(static_cast<double>(x)), 10, -14);
  if (r >= 65536.0) return sign | 0x7c00;
  if (r < std::ldexp(1.0, -14)) return sign | static_cast<uint16_t>(r / std::ldexp(1.0, -24));
  int e;
  const double f = std::frexp(r, &e);  // r = f * 2^e
  const int exponent = e - 1 + 15;
  const uint16_t mantissa = static_cast<uint16_t>((f * 2 - 1) * 1024);
  return sign | static_cast<uint16_t>(exponent << 10) | mantissa;
}

double ReferenceF16Value(uint16_t h) {
  const double sign = (h & 0x8000) ? -1 : 1;
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Inputs: every bf16 pattern with low halves at and around the rounding tie, the fp16 values
// and their neighbours, ties of the fp16 denormal range, specials and random floats.
std::vector<float> ConversionInputs() {
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      v.push_back(BitsToFloat((hi << 16) | lo));
    }
  }
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double value = ReferenceF16Value(static_cast<uint16_t>(h));
    if (std::isnan(value)) continue;
    const uint32_t b = FloatBits(static_cast<float>(value));
    for (int32_t d : {-0x1001, -0x1000, -0xfff, -1, 0, 1, 0xfff, 0x1000, 0x1001}) {
      v.push_back(BitsToFloat(b + static_cast<uint32_t>(d)));
    }
    // The midpoint to the next fp16 value (a tie in every range, denormals included).
    const double next = ReferenceF16Value(static_cast<uint16_t>(h + 1));
    if (!std::isnan(next) && !std::isinf(next) && !std::isinf(value)) {
      v.push_back(static_cast<float>((value + next) / 2));
    }
  }
  for (float x : {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 3.4028235e38f, 1.0e-45f,
                  2.9802322e-08f /* 2^-25 */, 5.9604645e-08f /* 2^-24 */, INFINITY, -INFINITY}) {
    v.push_back(x);
  }
  for (uint32_t nan :
       {0x7fc00000u, 0x7f800001u, 0xffc00001u, 0x7fa5a5a5u, 0xff812345u, 0x7fffffffu}) {
    v.push_back(BitsToFloat(nan));
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) v.push_back(BitsToFloat(rng()));
  return v;
}

TEST(HalfConvert, Bf16MatchesReference) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  int failures = 0;
  for (float x : ConversionInputs()) {
    const uint16_t got = FloatToBf16(x), want = ReferenceBf16(x);
    if (got != want && ++failures < 10) {
      ADD_FAILURE() << std::hex << "bits 0x" << FloatBits(x) << ": got 0x" << got << " want 0x"
                    << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(HalfConvert, F16MatchesReference) {
  int failures = 0;
  for (float x : ConversionInputs()) {
    const uint16_t got = FloatToF16(x), want = ReferenceF16(x);
    if (got != want && ++failures < 10) {
      ADD_FAILURE() << std::hex << "bits 0x" << FloatBits(x) << " (" << x << "): got 0x" << got
                    << " want 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST(HalfConvert, NamedCases) {
  // Ties go to even.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808000)), 0x3f80);  // tie, even below
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f818000)), 0x3f82);  // tie, odd below: up
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(FloatToF16(1.0f + 1.0f / 2048), 0x3c00);        // tie, even below
  EXPECT_EQ(FloatToF16(1.0f + 3.0f / 2048), 0x3c02);        // tie, odd below: up
  // NaN stays NaN (quiet, sign kept); inf stays inf.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7f800001)), 0x7fc0);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0xff800001)), 0xffc0);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(NAN))));
  EXPECT_TRUE(std::isnan(F16ToFloat(FloatToF16(NAN))));
  EXPECT_EQ(FloatToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToF16(-INFINITY), 0xfc00);
  // Overflow rounds to infinity.
  EXPECT_EQ(FloatToBf16(3.4028235e38f), 0x7f80);  // FLT_MAX rounds up past bf16's max
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToF16(65519.996f), 0x7bff);
  EXPECT_EQ(FloatToF16(1e6f), 0x7c00);
  // Denormals.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00000001)), 0x0000);  // below half a bf16 denormal step
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00010000)), 0x0001);  // the smallest bf16 denormal
  EXPECT_EQ(FloatToF16(5.9604645e-08f), 0x0001);            // 2^-24, smallest fp16 denormal
  EXPECT_EQ(FloatToF16(2.9802322e-08f), 0x0000);            // 2^-25: tie to even zero
  EXPECT_EQ(FloatToF16(-2.9802326e-08f), 0x8001);           // just above the tie
  EXPECT_EQ(FloatToF16(6.097555e-05f), 0x03ff);             // largest fp16 denormal
}

TEST(HalfConvert, WideningIsExactForEveryPattern) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t h16 = static_cast<uint16_t>(h);
    const double ref = ReferenceF16Value(h16);
    const float got = F16ToFloat(h16);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      EXPECT_EQ(FloatToF16(got), h16 | 0x200) << h;  // round trip keeps the payload, quieted
    } else {
      ASSERT_EQ(static_cast<double>(got), ref) << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << h;
      ASSERT_EQ(FloatToF16(got), h16) << h;
    }
    ASSERT_EQ(FloatBits(Bf16ToFloat(h16)), h << 16);
    ASSERT_EQ(FloatToBf16(Bf16ToFloat(h16)), std::isnan(Bf16ToFloat(h16)) ? (h16 | 0x40) : h16);
  }
}

// ---- SIMD casts equal the scalar conversions ------------------------------------------------

class CastPerVariant : public ::testing::TestWithParam<KernelVariant> {};

TEST_P(CastPerVariant, FromF32EqualsScalarBitForBit) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  const std::vector<float> in = ConversionInputs();
  KernelOptions o;
  o.variant = variant;
  o.threads = 2;
  o.chunk_elems = 4096;
  for (DType type : {DType::kBf16, DType::kF16}) {
    // Odd offset and length: unaligned starts and ragged tails.
    for (size_t offset : {size_t{0}, size_t{3}}) {
      const size_t n = in.size() - offset - 5;
      std::vector<uint16_t> out(n + 1, 0xeeee);
      ASSERT_TRUE(CastFromF32(in.data() + offset, out.data(), type, n, o).ok());
      EXPECT_EQ(out[n], 0xeeee) << "wrote past the end";
      int failures = 0;
      for (size_t i = 0; i < n; ++i) {
        const float x = in[offset + i];
        const uint16_t want = type == DType::kBf16 ? FloatToBf16(x) : FloatToF16(x);
        if (out[i] != want && ++failures < 10) {
          ADD_FAILURE() << DTypeName(type) << std::hex << " bits 0x" << FloatBits(x) << ": got 0x"
                        << out[i] << " want 0x" << want;
        }
      }
      EXPECT_EQ(failures, 0);
    }
  }
}

TEST_P(CastPerVariant, ToF32IsExactForEveryPattern) {
  const KernelVariant variant = GetParam();
  ZINF_SKIP_IF_CPU_LACKS(variant);
  std::vector<uint16_t> in(0x10000 + 7);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i * 40503u);
  KernelOptions o;
  o.variant = variant;
  for (DType type : {DType::kBf16, DType::kF16}) {
    std::vector<float> out(in.size());
    ASSERT_TRUE(CastToF32(in.data(), type, out.data(), in.size(), o).ok());
    for (size_t i = 0; i < in.size(); ++i) {
      const float want = type == DType::kBf16 ? Bf16ToFloat(in[i]) : F16ToFloat(in[i]);
      ASSERT_EQ(FloatBits(out[i]), FloatBits(want)) << DTypeName(type) << " " << in[i];
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, CastPerVariant, ::testing::ValuesIn(testing::ConcreteVariants()),
                         [](const ::testing::TestParamInfo<KernelVariant>& info) {
                           return std::string(VariantName(info.param));
                         });

TEST(Cast, RejectsBadArguments) {
  float x = 1;
  uint16_t h = 0;
  EXPECT_EQ(CastFromF32(&x, &h, DType::kF32, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CastFromF32(nullptr, &h, DType::kBf16, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CastToF32(&h, DType::kF16, nullptr, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CastToF32(nullptr, DType::kF16, nullptr, 0).ok());
}

}  // namespace
}  // namespace zinf::kernels
