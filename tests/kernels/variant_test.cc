// Tests of kernels/cpu/variant.h and cpu_features.h: names, the choice of the best variant,
// the environment override and the errors for variants a CPU lacks (with fake CPUs).
#include "kernels/cpu/variant.h"

#include <gtest/gtest.h>

#include <string>

namespace zinf::kernels {
namespace {

CpuFeatures Avx2Only() {
  CpuFeatures f;
  f.avx2 = f.fma = f.f16c = true;
  return f;
}

CpuFeatures Avx512NoBf16() {
  CpuFeatures f = Avx2Only();
  f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = true;
  return f;
}

TEST(Variant, NamesRoundTrip) {
  for (KernelVariant v : {KernelVariant::kAuto, KernelVariant::kScalar, KernelVariant::kAvx2,
                          KernelVariant::kAvx512, KernelVariant::kAvx512Bf16}) {
    Result<KernelVariant> parsed = ParseVariant(VariantName(v));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, v);
  }
  Result<KernelVariant> bad = ParseVariant("avx1024");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("avx1024"), std::string::npos);
}

TEST(Variant, BestFollowsTheFeatures) {
  EXPECT_EQ(BestVariant(CpuFeatures{}), KernelVariant::kScalar);
  EXPECT_EQ(BestVariant(Avx2Only()), KernelVariant::kAvx2);
  EXPECT_EQ(BestVariant(Avx512NoBf16()), KernelVariant::kAvx512);
  CpuFeatures all = Avx512NoBf16();
  all.avx512_bf16 = true;
  EXPECT_EQ(BestVariant(all), KernelVariant::kAvx512Bf16);
  CpuFeatures no_f16c = Avx2Only();
  no_f16c.f16c = false;  // AVX2 without F16C is not enough for the avx2 variant
  EXPECT_EQ(BestVariant(no_f16c), KernelVariant::kScalar);
}

TEST(Variant, ForcingAVariantTheCpuLacksIsAClearError) {
  Result<KernelVariant> r = ResolveVariant(KernelVariant::kAvx512, Avx2Only(), nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("'avx512'"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("best available is 'avx2'"), std::string::npos);
  r = ResolveVariant(KernelVariant::kAuto, Avx512NoBf16(), "avx512_bf16");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ZINF_ADAM_VARIANT"), std::string::npos);
}

TEST(Variant, EnvironmentAppliesOnlyToAuto) {
  EXPECT_EQ(*ResolveVariant(KernelVariant::kAuto, Avx512NoBf16(), "avx2"), KernelVariant::kAvx2);
  EXPECT_EQ(*ResolveVariant(KernelVariant::kAuto, Avx512NoBf16(), ""), KernelVariant::kAvx512);
  EXPECT_EQ(*ResolveVariant(KernelVariant::kAuto, Avx512NoBf16(), "auto"), KernelVariant::kAvx512);
  EXPECT_EQ(*ResolveVariant(KernelVariant::kScalar, Avx512NoBf16(), "avx2"),
            KernelVariant::kScalar);
  EXPECT_FALSE(ResolveVariant(KernelVariant::kAuto, Avx512NoBf16(), "fast").ok());
}

TEST(CpuFeatures, DetectionIsConsistent) {
  const CpuFeatures& f = DetectCpuFeatures();
  EXPECT_TRUE(!f.avx512f || f.avx2);
  EXPECT_TRUE(!f.avx512_bf16 || f.avx512f);
  EXPECT_FALSE(DescribeCpuFeatures(f).empty());
  EXPECT_EQ(DescribeCpuFeatures(CpuFeatures{}), "none");
}

}  // namespace
}  // namespace zinf::kernels
