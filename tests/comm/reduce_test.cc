// SumInOrder (src/comm/reduce.h): every type pair the communicator sums, 1 to 5 sources, every
// length around the 16-element blocks, bit for bit against the element loop
// ((0 + s_0) + s_1) + ...; special values (signed zeros, subnormals, infinities, NaN); and the
// overlaps reduce.h allows: dst equal to a source, and a 16-bit source in the back of an fp32 dst.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/half_convert.h"
#include "src/comm/reduce.h"

namespace zinf::comm {
namespace {

float Bf16(uint16_t h) {
  const uint32_t b = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Bits that cover the interesting cases: random magnitudes, and now and then a special value.
uint32_t F32Bits(std::mt19937& g) {
  static const float special[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::numeric_limits<float>::quiet_NaN(),
                                  std::numeric_limits<float>::denorm_min(), -1e-40f, 65504.0f};
  float f = (g() % 16 == 0)
                ? special[g() % 8]
                : std::ldexp(std::uniform_real_distribution<float>(-1, 1)(g), int(g() % 40) - 20);
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// memcmp of n bytes, and true when there are none (an empty vector's data() may be null, which
// memcmp may not be given).
bool SameBits(const void* a, const void* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

// Bitwise equal, except that a NaN matches any NaN: which of two NaN operands an addition
// returns (so the payload) follows the order the compiler gave the operands (reduce.h).
bool SameFloats(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (std::memcmp(&a[i], &b[i], 4) != 0) return false;
  }
  return true;
}

template <typename D, typename S, typename Widen>
std::vector<D> Reference(const std::vector<std::vector<S>>& srcs, size_t n, Widen widen) {
  std::vector<D> out(n);
  for (size_t i = 0; i < n; ++i) {
    D acc = D(0) + widen(srcs[0][i]);
    for (size_t p = 1; p < srcs.size(); ++p) acc = acc + widen(srcs[p][i]);
    out[i] = acc;
  }
  return out;
}

template <typename S>
std::vector<const void*> Ptrs(const std::vector<std::vector<S>>& srcs) {
  std::vector<const void*> p;
  for (const auto& s : srcs) p.push_back(s.data());
  return p;
}

const size_t kLengths[] = {0, 1, 3, 15, 16, 17, 31, 32, 33, 100, 1000, 4099};

TEST(SumInOrderTest, Fp32AndBf16AndFp16IntoFp32BitForBit) {
  std::mt19937 g(7);
  for (size_t count = 1; count <= 5; ++count) {
    for (size_t n : kLengths) {
      std::vector<std::vector<float>> f32(count, std::vector<float>(n));
      std::vector<std::vector<uint16_t>> b16(count, std::vector<uint16_t>(n));
      std::vector<std::vector<uint16_t>> h16(count, std::vector<uint16_t>(n));
      for (size_t p = 0; p < count; ++p)
        for (size_t i = 0; i < n; ++i) {
          const uint32_t bits = F32Bits(g);
          std::memcpy(&f32[p][i], &bits, 4);
          b16[p][i] = uint16_t(bits >> 16);
          h16[p][i] = uint16_t(g());
        }
      std::vector<float> out(n + 1, 7.0f);  // one sentinel past the end
      SumInOrder(DType::kF32, Ptrs(f32).data(), count, DType::kF32, out.data(), n);
      auto want = Reference<float>(f32, n, [](float v) { return v; });
      ASSERT_TRUE(SameBits(out.data(), want.data(), 4 * n)) << "fp32, " << count << " x " << n;
      SumInOrder(DType::kBf16, Ptrs(b16).data(), count, DType::kF32, out.data(), n);
      want = Reference<float>(b16, n, Bf16);
      ASSERT_TRUE(SameBits(out.data(), want.data(), 4 * n)) << "bf16, " << count << " x " << n;
      SumInOrder(DType::kF16, Ptrs(h16).data(), count, DType::kF32, out.data(), n);
      want = Reference<float>(h16, n, kernels::F16ToFloat);  // random bits: NaNs of many payloads
      ASSERT_TRUE(SameFloats(out.data(), want.data(), n)) << "fp16, " << count << " x " << n;
      ASSERT_EQ(out[n], 7.0f) << "wrote past the end";
    }
  }
}

TEST(SumInOrderTest, IntegersAndDoubles) {
  std::mt19937 g(11);
  for (size_t count = 1; count <= 4; ++count) {
    for (size_t n : kLengths) {
      std::vector<std::vector<int32_t>> i32(count, std::vector<int32_t>(n));
      std::vector<std::vector<int64_t>> i64(count, std::vector<int64_t>(n));
      std::vector<std::vector<double>> f64(count, std::vector<double>(n));
      for (size_t p = 0; p < count; ++p)
        for (size_t i = 0; i < n; ++i) {
          i32[p][i] = int32_t(g() % 100000) - 50000;
          i64[p][i] = (int64_t(g()) << 20) - (int64_t(1) << 40);
          f64[p][i] = std::ldexp(double(g()) / 4294967296.0 - 0.5, int(g() % 60) - 30);
        }
      std::vector<int32_t> o32(n);
      std::vector<int64_t> o64(n);
      std::vector<double> od(n);
      SumInOrder(DType::kI32, Ptrs(i32).data(), count, DType::kI32, o32.data(), n);
      SumInOrder(DType::kI64, Ptrs(i64).data(), count, DType::kI64, o64.data(), n);
      SumInOrder(DType::kF64, Ptrs(f64).data(), count, DType::kF64, od.data(), n);
      const auto same = [](auto v) { return v; };
      ASSERT_EQ(o32, Reference<int32_t>(i32, n, same));
      ASSERT_EQ(o64, Reference<int64_t>(i64, n, same));
      const auto wd = Reference<double>(f64, n, same);
      ASSERT_TRUE(SameBits(od.data(), wd.data(), 8 * n));
    }
  }
}

// dst is one of the sources (an in-place reduction), whichever position it holds.
TEST(SumInOrderTest, DstMayBeASource) {
  std::mt19937 g(3);
  for (size_t n : kLengths) {
    for (size_t at = 0; at < 3; ++at) {
      std::vector<std::vector<float>> srcs(3, std::vector<float>(n));
      for (auto& s : srcs)
        for (float& v : s) {
          const uint32_t bits = F32Bits(g);
          std::memcpy(&v, &bits, 4);
        }
      const auto want = Reference<float>(srcs, n, [](float v) { return v; });
      auto ptrs = Ptrs(srcs);
      SumInOrder(DType::kF32, ptrs.data(), 3, DType::kF32, srcs[at].data(), n);
      ASSERT_TRUE(SameBits(srcs[at].data(), want.data(), 4 * n)) << n << " at " << at;
    }
  }
}

// A bf16 source in the last 2n bytes of the fp32 dst (where the communicator lands a peer's
// piece), as the first, middle or last source.
TEST(SumInOrderTest, ABf16SourceInTheBackOfTheDst) {
  std::mt19937 g(5);
  for (size_t n : kLengths) {
    for (size_t at = 0; at < 3; ++at) {
      std::vector<std::vector<uint16_t>> srcs(3, std::vector<uint16_t>(n));
      for (auto& s : srcs)
        for (uint16_t& v : s) v = uint16_t(F32Bits(g) >> 16);
      const auto want = Reference<float>(srcs, n, Bf16);
      std::vector<float> dst(n);
      auto* back = reinterpret_cast<uint8_t*>(dst.data()) + 2 * n;
      if (n > 0) std::memcpy(back, srcs[at].data(), 2 * n);
      auto ptrs = Ptrs(srcs);
      ptrs[at] = back;
      SumInOrder(DType::kBf16, ptrs.data(), 3, DType::kF32, dst.data(), n);
      ASSERT_TRUE(SameBits(dst.data(), want.data(), 4 * n)) << n << " at " << at;
    }
  }
}

}  // namespace
}  // namespace zinf::comm
