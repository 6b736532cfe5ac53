// kernels/cpu/half_convert.h — scalar fp32 <-> bf16 / fp16 conversions, the reference that
// every SIMD variant must match bit for bit.
//
// Contract:
// - FloatToBf16 / FloatToF16 round to nearest, ties to even. A NaN stays a NaN: it keeps its
//   sign and the top bits of its payload and gets the quiet bit set (what vcvtne2ps2bf16 and
//   vcvtps2ph do). Infinities stay infinite; finite values too large for the target round to
//   infinity as IEEE rounding says (fp16: |x| >= 65520; bf16: above 0x1.fffp127 rounded);
//   fp32 denormals round like any other value (bf16 keeps them, fp16 flushes what is below
//   half of its smallest denormal, 2^-25, to a signed zero).
// - Bf16ToFloat / F16ToFloat are exact, except that F16ToFloat quiets a signalling NaN (sets
//   the quiet bit, as vcvtph2ps does); Bf16ToFloat keeps every bit.
// - Integer arithmetic only: the result does not depend on MXCSR (FTZ/DAZ) or the compiler's
//   floating-point flags.
//
// Only baseline-ISA translation units include this (the SIMD variants have their own vector
// versions): inline functions compiled with AVX flags could be picked by the linker for code
// that runs on any x86-64.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/dtype.h"

namespace zinf::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 and inf
  if (a >= 0x38800000u) {  // a normal fp16: |f| >= 2^-14
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));  // rebias 127 -> 15
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: ties to even zero
  // A denormal fp16: count units of 2^-24, rounding the shifted-out bits to nearest even.
  const uint32_t exponent = a >> 23;  // 102..112
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (units & 1u))) ++units;
  return static_cast<uint16_t>(sign | units);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {  // inf, or NaN made quiet as vcvtph2ps does
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13) | (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent != 0) return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return BitsToFloat(sign);
  // Denormal fp16: normalise into an fp32 normal.
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return BitsToFloat(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

// Stochastic rounding to bf16 (the Adam moments with zinf.optimizer_state_dtype bf16): element
// `index` of the stream `seed` gets 16 random bits r (a hash of both, StochasticBits), and a
// finite f becomes the top 16 bits of bits(f) + r: rounded away from zero with probability
// equal to the dropped fraction, so the rounding is unbiased. Inf and NaN round as FloatToBf16.
// (A finite value within one bf16 ulp of the largest can round to infinity.) The same
// (seed, index, f) give the same bits in every variant.
inline uint32_t Fmix32(uint32_t x) {  // MurmurHash3's finalizer
  x ^= x >> 16;
  x *= 0x85ebca6bu;
  x ^= x >> 13;
  x *= 0xc2b2ae35u;
  return x ^ (x >> 16);
}
inline uint32_t StochasticBits(uint32_t index, uint32_t seed) {
  return Fmix32((index * 0x9e3779b1u) ^ seed) >> 16;
}
inline uint16_t FloatToBf16Stochastic(float f, uint32_t random16) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return FloatToBf16(f);
  return static_cast<uint16_t>((u + random16) >> 16);
}

// Reads element i of a buffer of `type` as a float.
inline float LoadAsFloat(const void* base, DType type, size_t i) {
  if (type == DType::kF32) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return type == DType::kBf16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

// Writes `value` as element i of a buffer of `type`, rounding to nearest even.
inline void StoreFromFloat(void* base, DType type, size_t i, float value) {
  if (type == DType::kF32) {
    static_cast<float*>(base)[i] = value;
  } else {
    static_cast<uint16_t*>(base)[i] = type == DType::kBf16 ? FloatToBf16(value) : FloatToF16(value);
  }
}

}  // namespace zinf::kernels
