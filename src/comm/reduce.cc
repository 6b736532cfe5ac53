#include "src/comm/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/half_convert.h"

namespace zinf::comm {
namespace {

// dst[i] = ((0 + s_0[i]) + s_1[i]) + ... for i in [from, n), kBlock elements at a time: each
// block's sums are kept aside until every source of the block is read, then stored, in
// ascending order. So a source may overlap dst as reduce.h allows: one that starts
// (out_b - in_b) * n bytes into dst has its unread bytes at dst + (n - i - m) * (out_b - in_b) +
// (i + m) * out_b or later when block [i, i+m) stores up to dst + (i + m) * out_b.
template <typename D, typename S, typename Widen>
void SumBlocks(const void* const* srcs, size_t count, void* dst, size_t from, size_t n,
               Widen widen) {
  constexpr size_t kBlock = 64 / sizeof(D);  // a cache line of results
  D* d = static_cast<D*>(dst);
  for (size_t i = from; i < n; i += kBlock) {
    const size_t m = n - i < kBlock ? n - i : kBlock;
    D acc[kBlock];
    const S* s0 = static_cast<const S*>(srcs[0]) + i;
    for (size_t k = 0; k < m; ++k) acc[k] = D(0) + widen(s0[k]);
    for (size_t p = 1; p < count; ++p) {
      const S* sp = static_cast<const S*>(srcs[p]) + i;
      for (size_t k = 0; k < m; ++k) acc[k] = acc[k] + widen(sp[k]);
    }
    std::memcpy(d + i, acc, m * sizeof(D));
  }
}

// The common case, fp32 sums of fp32 or bf16 sources, in 16-element blocks as SumBlocks' and
// with the same bits (`0 + x` is kept: it turns -0 into +0), written in GCC's 4-lane vector
// extensions so that the block's sums stay in registers (SSE2 on any x86-64;
// __builtin_shufflevector needs GCC 12 or Clang, as Debian 12 has).
using F32x4 = float __attribute__((vector_size(16)));
using U16x8 = uint16_t __attribute__((vector_size(16)));

// Elements i..i+7 of a source as two fp32 vectors (bf16: each value's bits under 16 zero bits).
template <bool kBf16>
inline void Load8(const void* src, size_t i, F32x4* lo, F32x4* hi) {
  if constexpr (kBf16) {
    U16x8 h;
    std::memcpy(&h, static_cast<const uint16_t*>(src) + i, sizeof(h));
    const U16x8 z = {};
    const U16x8 l = __builtin_shufflevector(z, h, 0, 8, 1, 9, 2, 10, 3, 11);
    const U16x8 u = __builtin_shufflevector(z, h, 4, 12, 5, 13, 6, 14, 7, 15);
    std::memcpy(lo, &l, sizeof(l));
    std::memcpy(hi, &u, sizeof(u));
  } else {
    std::memcpy(lo, static_cast<const float*>(src) + i, sizeof(*lo));
    std::memcpy(hi, static_cast<const float*>(src) + i + 4, sizeof(*hi));
  }
}

template <bool kBf16>
void SumF32(const void* const* srcs, size_t count, void* dst, size_t n) {
  float* d = static_cast<float*>(dst);
  const F32x4 zero = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    F32x4 a0, a1, a2, a3, b0, b1, b2, b3;
    Load8<kBf16>(srcs[0], i, &a0, &a1);
    Load8<kBf16>(srcs[0], i + 8, &a2, &a3);
    a0 = zero + a0;
    a1 = zero + a1;
    a2 = zero + a2;
    a3 = zero + a3;
    for (size_t p = 1; p < count; ++p) {
      Load8<kBf16>(srcs[p], i, &b0, &b1);
      Load8<kBf16>(srcs[p], i + 8, &b2, &b3);
      a0 = a0 + b0;
      a1 = a1 + b1;
      a2 = a2 + b2;
      a3 = a3 + b3;
    }
    std::memcpy(d + i, &a0, 16);
    std::memcpy(d + i + 4, &a1, 16);
    std::memcpy(d + i + 8, &a2, 16);
    std::memcpy(d + i + 12, &a3, 16);
  }
  using S = std::conditional_t<kBf16, uint16_t, float>;
  SumBlocks<float, S>(srcs, count, dst, i, n, [](S v) {
    if constexpr (kBf16) {
      return kernels::Bf16ToFloat(v);
    } else {
      return v;
    }
  });
}

}  // namespace

bool ReducePair(DType send, DType recv) {
  switch (recv) {
    case DType::kF32:
      return send == DType::kF32 || send == DType::kBf16 || send == DType::kF16;
    case DType::kF64:
    case DType::kI32:
    case DType::kI64:
      return send == recv;
    default:
      return false;
  }
}

void SumInOrder(DType src_type, const void* const* srcs, size_t count, DType dst_type, void* dst,
                size_t n) {
  if (count == 0 || n == 0) return;
  const auto same = [](auto v) { return v; };
  switch (dst_type) {
    case DType::kF32:
      if (src_type == DType::kF32) return SumF32<false>(srcs, count, dst, n);
      if (src_type == DType::kBf16) return SumF32<true>(srcs, count, dst, n);
      return SumBlocks<float, uint16_t>(srcs, count, dst, 0, n,
                                        [](uint16_t h) { return kernels::F16ToFloat(h); });
    case DType::kF64:
      return SumBlocks<double, double>(srcs, count, dst, 0, n, same);
    case DType::kI32:
      return SumBlocks<int32_t, int32_t>(srcs, count, dst, 0, n, same);
    case DType::kI64:
      return SumBlocks<int64_t, int64_t>(srcs, count, dst, 0, n, same);
    default:
      return;  // refused by ReducePair before any call
  }
}

}  // namespace zinf::comm
