// tests/kernels/kernel_test_util.h — helpers shared by the CPU kernel tests: the variants to
// run, 64-byte aligned buffers, and random inputs that cover zeros, denormals, and very small
// and very large magnitudes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dtype.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/variant.h"

namespace zinf::kernels::testing {

inline std::vector<KernelVariant> ConcreteVariants() {
  return {KernelVariant::kScalar, KernelVariant::kAvx2, KernelVariant::kAvx512,
          KernelVariant::kAvx512Bf16};
}

inline bool CpuHas(KernelVariant v) { return VariantSupported(v, DetectCpuFeatures()); }

#define ZINF_SKIP_IF_CPU_LACKS(variant)                                           \
  do {                                                                            \
    if (!::zinf::kernels::testing::CpuHas(variant)) {                             \
      GTEST_SKIP() << "this CPU lacks " << ::zinf::kernels::VariantName(variant); \
    }                                                                             \
  } while (0)

// Owns `bytes` of 64-byte aligned memory (zeroed).
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t bytes) : size_(bytes) {
    const size_t rounded = (bytes + 63) / 64 * 64 + 64;
    data_ = static_cast<unsigned char*>(std::aligned_alloc(64, rounded));
    std::memset(data_, 0, rounded);
  }
  ~AlignedBytes() { std::free(data_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  unsigned char* data() { return data_; }
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as(size_t offset_bytes = 0) {
    return reinterpret_cast<T*>(data_ + offset_bytes);
  }

 private:
  unsigned char* data_;
  size_t size_;
};

// A value of random sign from one of several magnitude classes: exact zero, fp32 denormal,
// tiny (1e-30..1e-20), small (1e-8..1e-3), ordinary (N(0,1)), large (1e3..max_large).
inline float MixedValue(std::mt19937& rng, float max_large) {
  std::uniform_int_distribution<int> pick(0, 9);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  auto log_uniform = [&](double lo, double hi) {
    return std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo)));
  };
  const float sign = unit(rng) < 0.5 ? -1.0f : 1.0f;
  switch (pick(rng)) {
    case 0:
      return sign * 0.0f;
    case 1:
      return sign * BitsToFloat(1 + static_cast<uint32_t>(unit(rng) * 0x7ffffe));
    case 2:
      return sign * static_cast<float>(log_uniform(1e-30, 1e-20));
    case 3:
      return sign * static_cast<float>(log_uniform(1e-8, 1e-3));
    case 4:
      return sign * static_cast<float>(log_uniform(1e3, max_large));
    default: {
      std::normal_distribution<float> normal(0.0f, 1.0f);
      return normal(rng);
    }
  }
}

// Fills a buffer of `type` with MixedValue()s (rounded to the type) and returns them as floats.
inline std::vector<float> FillMixed(void* dst, DType type, size_t n, std::mt19937& rng,
                                    float max_large, bool non_negative = false) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    float x = MixedValue(rng, max_large);
    if (non_negative) x = std::fabs(x);
    StoreFromFloat(dst, type, i, x);
    values[i] = LoadAsFloat(dst, type, i);
  }
  return values;
}

}  // namespace zinf::kernels::testing
