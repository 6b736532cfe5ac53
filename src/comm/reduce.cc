#include "src/comm/reduce.h"

#include <cstdint>
#include <cstring>

namespace zinf::comm {
namespace {

template <typename D, typename S, typename Widen>
void Sum(const void* src, void* dst, size_t n, bool first, Widen widen) {
  const S* s = static_cast<const S*>(src);
  D* d = static_cast<D*>(dst);
  if (first) {
    for (size_t i = 0; i < n; ++i) d[i] = D(0) + widen(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = d[i] + widen(s[i]);
  }
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf or NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // ±0
  } else {
    // Subnormal: normalize (exponent of the leading bit), exact in fp32.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

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

void Accumulate(DType src_type, const void* src, DType dst_type, void* dst, size_t n,
                bool first) {
  const auto same = [](auto v) { return v; };
  switch (dst_type) {
    case DType::kF32:
      if (src_type == DType::kF32) return Sum<float, float>(src, dst, n, first, same);
      if (src_type == DType::kBf16) return Sum<float, uint16_t>(src, dst, n, first, Bf16ToFloat);
      return Sum<float, uint16_t>(src, dst, n, first, HalfToFloat);
    case DType::kF64:
      return Sum<double, double>(src, dst, n, first, same);
    case DType::kI32:
      return Sum<int32_t, int32_t>(src, dst, n, first, same);
    case DType::kI64:
      return Sum<int64_t, int64_t>(src, dst, n, first, same);
    default:
      return;  // refused by ReducePair before any call
  }
}

void SumInOrder(DType src_type, const void* const* srcs, size_t count, DType dst_type, void* dst,
                size_t n) {
  const size_t in_b = DTypeBytes(src_type), out_b = DTypeBytes(dst_type);
  // Each block of dst is summed in a buffer that stays in L1 and then stored, in ascending order:
  // a source that starts (out_b - in_b) * n bytes or more into dst is read before any store
  // reaches it (block [a, a+m) stores up to dst + (a+m) * out_b, and that source's unread bytes
  // start at dst + (n - a - m) * (out_b - in_b) + (a+m) * out_b or later).
  constexpr size_t kBlock = 1024;  // elements
  alignas(64) uint8_t block[kBlock * 8];
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t m = n - at < kBlock ? n - at : kBlock;
    for (size_t p = 0; p < count; ++p)
      Accumulate(src_type, static_cast<const uint8_t*>(srcs[p]) + at * in_b, dst_type, block, m,
                 p == 0);
    std::memcpy(static_cast<uint8_t*>(dst) + at * out_b, block, m * out_b);
  }
}

}  // namespace zinf::comm
