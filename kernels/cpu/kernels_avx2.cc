// The avx2 variant: AVX2 + FMA + F16C, bf16 rounding with integer ops. Compiled with
// -mavx2 -mfma -mf16c (kernels/CMakeLists.txt); everything but the table accessor has internal
// linkage (see variant_kernels.h). 16 elements per iteration (two ymm registers per stream);
// a chunk's tail is copied into zero-padded stack blocks, run through the same code and copied
// back, so there is one code path for the arithmetic.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/variant_kernels.h"

namespace zinf::kernels::internal {
namespace {

constexpr size_t kBlock = 16;

// ---- conversions -------------------------------------------------------------------------

inline __m256 Bf16ToF32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// Rounds 8 lanes to bf16 (nearest even, NaN quieted), result in the low 16 bits of each lane.
inline __m256i RoundToBf16Low(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

// Stochastic rounding (half_convert.h): 8 lanes, elements idx..idx+7 of stream `seed`; the
// result in the low 16 bits of each lane.
inline __m256i Fmix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 13));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}
inline __m256i StochasticToBf16Low(__m256 x, uint32_t idx, uint32_t seed) {
  const __m256i lanes =
      _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(idx)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i h = _mm256_xor_si256(
      _mm256_mullo_epi32(lanes, _mm256_set1_epi32(static_cast<int>(0x9e3779b1u))),
      _mm256_set1_epi32(static_cast<int>(seed)));
  const __m256i r = _mm256_srli_epi32(Fmix32(h), 16);
  const __m256i u = _mm256_castps_si256(x);
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  const __m256i special = _mm256_cmpeq_epi32(_mm256_and_si256(u, exp_mask), exp_mask);
  const __m256i sr = _mm256_srli_epi32(_mm256_add_epi32(u, r), 16);
  return _mm256_blendv_epi8(sr, RoundToBf16Low(x), special);
}
// 16 lanes (elements idx..idx+15) stochastically rounded to bf16 and stored.
inline void StoreBf16Stochastic(void* p, __m256 lo, __m256 hi, uint32_t idx, uint32_t seed) {
  const __m256i packed = _mm256_packus_epi32(StochasticToBf16Low(lo, idx, seed),
                                             StochasticToBf16Low(hi, idx + 8, seed));
  _mm256_storeu_si256(static_cast<__m256i*>(p), _mm256_permute4x64_epi64(packed, 0xd8));
}

// 16 fp32 lanes (lo = elements 0..7, hi = 8..15) -> 16 16-bit values in one ymm.
template <DType kType>
inline __m256i Pack16(__m256 lo, __m256 hi) {
  if constexpr (kType == DType::kBf16) {
    // packus interleaves 128-bit halves (lo0 hi0 lo1 hi1); the permute restores the order.
    const __m256i packed = _mm256_packus_epi32(RoundToBf16Low(lo), RoundToBf16Low(hi));
    return _mm256_permute4x64_epi64(packed, 0xd8);
  } else {
    const __m128i a = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT);
    const __m128i b = _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
  }
}

// ---- loads and stores of 16 elements -----------------------------------------------------

template <DType kType>
inline void Load16(const void* p, __m256& lo, __m256& hi) {
  if constexpr (kType == DType::kF32) {
    lo = _mm256_loadu_ps(static_cast<const float*>(p));
    hi = _mm256_loadu_ps(static_cast<const float*>(p) + 8);
  } else {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    const __m128i h_lo = _mm256_castsi256_si128(h);
    const __m128i h_hi = _mm256_extracti128_si256(h, 1);
    if constexpr (kType == DType::kBf16) {
      lo = Bf16ToF32(h_lo);
      hi = Bf16ToF32(h_hi);
    } else {
      lo = _mm256_cvtph_ps(h_lo);
      hi = _mm256_cvtph_ps(h_hi);
    }
  }
}

template <DType kType, bool kStream>
inline void Store16(void* p, __m256 lo, __m256 hi) {
  if constexpr (kType == DType::kF32) {
    _mm256_storeu_ps(static_cast<float*>(p), lo);
    _mm256_storeu_ps(static_cast<float*>(p) + 8, hi);
  } else if constexpr (kStream) {
    _mm256_stream_si256(static_cast<__m256i*>(p), Pack16<kType>(lo, hi));  // 32-byte aligned
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(p), Pack16<kType>(lo, hi));
  }
}

constexpr size_t Size(DType t) { return t == DType::kF32 ? 4 : 2; }

inline const void* At(const void* base, DType t, size_t i) {
  return static_cast<const char*>(base) + i * Size(t);
}
inline void* At(void* base, DType t, size_t i) { return static_cast<char*>(base) + i * Size(t); }

// A zero-filled block of kBlock elements for a chunk's tail.
struct alignas(32) TailBlock {
  unsigned char bytes[kBlock * 4];
};

// ---- Adam --------------------------------------------------------------------------------

struct Coeffs {
  __m256 beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, inv_sqrt_bc2, eps, decay,
      l2, grad_scale;
};

inline Coeffs Broadcast(const AdamCoeffs& c) {
  return {_mm256_set1_ps(c.beta1),
          _mm256_set1_ps(c.one_minus_beta1),
          _mm256_set1_ps(c.beta2),
          _mm256_set1_ps(c.one_minus_beta2),
          _mm256_set1_ps(c.neg_step_size),
          _mm256_set1_ps(c.inv_sqrt_bc2),
          _mm256_set1_ps(c.eps),
          _mm256_set1_ps(c.decay),
          _mm256_set1_ps(c.l2),
          _mm256_set1_ps(c.grad_scale)};
}

// The formulas of adam.h on 8 lanes.
inline void AdamCore(const Coeffs& c, __m256& p, __m256 g, __m256& m, __m256& v) {
  g = _mm256_fmadd_ps(c.l2, p, _mm256_mul_ps(g, c.grad_scale));
  p = _mm256_mul_ps(p, c.decay);
  m = _mm256_fmadd_ps(c.beta1, m, _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_fmadd_ps(c.beta2, v, _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), c.inv_sqrt_bc2, c.eps);
  p = _mm256_fmadd_ps(c.neg_step_size, _mm256_div_ps(m, denom), p);
}

template <DType kGrad, DType kState, int kOut, bool kStream, bool kSR>
inline void AdamStep16(const Coeffs& c, float* param, const void* grad, void* m_ptr, void* v_ptr,
                       void* out, uint32_t idx, uint32_t seed_m, uint32_t seed_v) {
  __m256 p0, p1, g0, g1, m0, m1, v0, v1;
  Load16<DType::kF32>(param, p0, p1);
  Load16<kGrad>(grad, g0, g1);
  Load16<kState>(m_ptr, m0, m1);
  Load16<kState>(v_ptr, v0, v1);
  AdamCore(c, p0, g0, m0, v0);
  AdamCore(c, p1, g1, m1, v1);
  // In-place arrays: ordinary stores (their lines are already in cache from the loads).
  Store16<DType::kF32, false>(param, p0, p1);
  if constexpr (kSR) {
    StoreBf16Stochastic(m_ptr, m0, m1, idx, seed_m);
    StoreBf16Stochastic(v_ptr, v0, v1, idx, seed_v);
  } else {
    Store16<kState, false>(m_ptr, m0, m1);
    Store16<kState, false>(v_ptr, v0, v1);
  }
  if constexpr (kOut != 0) Store16<static_cast<DType>(kOut), kStream>(out, p0, p1);
}

// Software prefetch distance in bytes of each stream (see kernels_avx512.inc).
constexpr size_t kAdamPrefetchBytes = 1024;

inline void PrefetchAhead(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kAdamPrefetchBytes, _MM_HINT_T0);
}

template <DType kGrad, DType kState, int kOut, bool kStream, bool kSR>
void AdamChunkT(const AdamCoeffs& coeffs, const AdamChunk& chunk) {
  const AdamChunk ch = chunk;  // a local copy: see kernels_avx512.inc
  constexpr DType kOutType = kOut != 0 ? static_cast<DType>(kOut) : DType::kBf16;
  const Coeffs c = Broadcast(coeffs);
  size_t i = 0;
  for (; i + kBlock <= ch.n; i += kBlock) {
    // One prefetch per stream per 16 elements (a 16-bit stream gets each line twice: cheap);
    // prefetches never fault past the end of a buffer.
    PrefetchAhead(ch.param + i);
    PrefetchAhead(At(ch.grad, kGrad, i));
    PrefetchAhead(At(ch.exp_avg, kState, i));
    PrefetchAhead(At(ch.exp_avg_sq, kState, i));
    AdamStep16<kGrad, kState, kOut, kStream, kSR>(
        c, ch.param + i, At(ch.grad, kGrad, i), At(ch.exp_avg, kState, i),
        At(ch.exp_avg_sq, kState, i), kOut != 0 ? At(ch.param16, kOutType, i) : nullptr,
        static_cast<uint32_t>(ch.first + i), coeffs.seed_m, coeffs.seed_v);
  }
  if (i < ch.n) {
    const size_t rest = ch.n - i;
    TailBlock p{}, g{}, m{}, v{}, out{};
    std::memcpy(p.bytes, ch.param + i, rest * 4);
    std::memcpy(g.bytes, At(ch.grad, kGrad, i), rest * Size(kGrad));
    std::memcpy(m.bytes, At(ch.exp_avg, kState, i), rest * Size(kState));
    std::memcpy(v.bytes, At(ch.exp_avg_sq, kState, i), rest * Size(kState));
    AdamStep16<kGrad, kState, kOut, false, kSR>(c, reinterpret_cast<float*>(p.bytes), g.bytes,
                                                 m.bytes, v.bytes, out.bytes,
                                                 static_cast<uint32_t>(ch.first + i),
                                                 coeffs.seed_m, coeffs.seed_v);
    std::memcpy(ch.param + i, p.bytes, rest * 4);
    std::memcpy(At(ch.exp_avg, kState, i), m.bytes, rest * Size(kState));
    std::memcpy(At(ch.exp_avg_sq, kState, i), v.bytes, rest * Size(kState));
    if constexpr (kOut != 0) std::memcpy(At(ch.param16, kOutType, i), out.bytes, rest * 2);
  }
}

using AdamFn = void (*)(const AdamCoeffs&, const AdamChunk&);

template <DType kGrad, DType kState, bool kSR = false>
AdamFn PickOut(const AdamLayout& l, bool stream) {
  if (!l.has_param16) return AdamChunkT<kGrad, kState, 0, false, kSR>;
  if (l.param16_type == DType::kBf16) {
    return stream ? AdamChunkT<kGrad, kState, int(DType::kBf16), true, kSR>
                  : AdamChunkT<kGrad, kState, int(DType::kBf16), false, kSR>;
  }
  return stream ? AdamChunkT<kGrad, kState, int(DType::kF16), true, kSR>
                : AdamChunkT<kGrad, kState, int(DType::kF16), false, kSR>;
}

template <DType kGrad>
AdamFn PickState(const AdamLayout& l, bool stream) {
  if (l.state_type == DType::kF32) return PickOut<kGrad, DType::kF32>(l, stream);
  return l.stochastic_state ? PickOut<kGrad, DType::kBf16, true>(l, stream)
                            : PickOut<kGrad, DType::kBf16>(l, stream);
}

void Adam(const AdamCoeffs& c, const AdamLayout& l, const AdamChunk& ch) {
  const bool stream =
      l.has_param16 && l.stream_param16 && (reinterpret_cast<uintptr_t>(ch.param16) & 31) == 0;
  AdamFn fn = l.grad_type == DType::kF32    ? PickState<DType::kF32>(l, stream)
              : l.grad_type == DType::kBf16 ? PickState<DType::kBf16>(l, stream)
                                            : PickState<DType::kF16>(l, stream);
  fn(c, ch);
}

// ---- finiteness, accumulation -------------------------------------------------------------

// Largest |bit pattern| (sign cleared) seen, compared with the pattern of +inf.
bool AllFinite(const void* src, DType type, size_t n) {
  const size_t size = Size(type);
  const size_t body = n - n % kBlock;
  TailBlock tail{};
  std::memcpy(tail.bytes, static_cast<const char*>(src) + body * size, (n - body) * size);
  __m256i worst = _mm256_setzero_si256();
  if (type == DType::kF32) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
    auto scan = [&](const float* s) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 8));
      worst = _mm256_max_epu32(worst, _mm256_and_si256(a, abs_mask));
      worst = _mm256_max_epu32(worst, _mm256_and_si256(b, abs_mask));
    };
    const float* s = static_cast<const float*>(src);
    for (size_t i = 0; i < body; i += kBlock) scan(s + i);
    scan(reinterpret_cast<const float*>(tail.bytes));
    const __m256i bad = _mm256_cmpgt_epi32(worst, _mm256_set1_epi32(0x7f7fffff));
    return _mm256_testz_si256(bad, bad);
  }
  const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
  auto scan = [&](const uint16_t* s) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    worst = _mm256_max_epu16(worst, _mm256_and_si256(a, abs_mask));
  };
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < body; i += kBlock) scan(s + i);
  scan(reinterpret_cast<const uint16_t*>(tail.bytes));
  const short last_finite = type == DType::kBf16 ? 0x7f7f : 0x7bff;
  const __m256i bad = _mm256_cmpgt_epi16(worst, _mm256_set1_epi16(last_finite));
  return _mm256_testz_si256(bad, bad);
}

template <DType kType>
inline __m256i Accumulate16(float* acc, const void* src, __m256 scale, __m256i worst) {
  __m256 a0, a1, x0, x1;
  Load16<DType::kF32>(acc, a0, a1);
  Load16<kType>(src, x0, x1);
  a0 = _mm256_fmadd_ps(scale, x0, a0);
  a1 = _mm256_fmadd_ps(scale, x1, a1);
  Store16<DType::kF32, false>(acc, a0, a1);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  worst = _mm256_max_epu32(worst, _mm256_and_si256(_mm256_castps_si256(a0), abs_mask));
  return _mm256_max_epu32(worst, _mm256_and_si256(_mm256_castps_si256(a1), abs_mask));
}

template <DType kType>
bool AccumulateT(float* acc, const void* src, size_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  __m256i worst = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    worst = Accumulate16<kType>(acc + i, At(src, kType, i), s, worst);
  if (i < n) {
    const size_t rest = n - i;
    TailBlock a{}, x{};  // zero padding accumulates to zero: finite
    std::memcpy(a.bytes, acc + i, rest * 4);
    std::memcpy(x.bytes, At(src, kType, i), rest * Size(kType));
    worst = Accumulate16<kType>(reinterpret_cast<float*>(a.bytes), x.bytes, s, worst);
    std::memcpy(acc + i, a.bytes, rest * 4);
  }
  const __m256i bad = _mm256_cmpgt_epi32(worst, _mm256_set1_epi32(0x7f7fffff));
  return _mm256_testz_si256(bad, bad);
}

bool Accumulate(float* acc, const void* src, DType type, size_t n, float scale) {
  switch (type) {
    case DType::kF32:
      return AccumulateT<DType::kF32>(acc, src, n, scale);
    case DType::kBf16:
      return AccumulateT<DType::kBf16>(acc, src, n, scale);
    case DType::kF16:
      return AccumulateT<DType::kF16>(acc, src, n, scale);
  }
  return false;
}

// ---- casts --------------------------------------------------------------------------------

template <DType kFrom, DType kTo>
void Convert(const void* src, void* dst, size_t n) {
  size_t i = 0;
  __m256 lo, hi;
  for (; i + kBlock <= n; i += kBlock) {
    Load16<kFrom>(At(src, kFrom, i), lo, hi);
    Store16<kTo, false>(At(dst, kTo, i), lo, hi);
  }
  if (i < n) {
    TailBlock in{}, out{};
    std::memcpy(in.bytes, At(src, kFrom, i), (n - i) * Size(kFrom));
    Load16<kFrom>(in.bytes, lo, hi);
    Store16<kTo, false>(out.bytes, lo, hi);
    std::memcpy(At(dst, kTo, i), out.bytes, (n - i) * Size(kTo));
  }
}

void CastFromF32(const float* src, void* dst, DType dst_type, size_t n) {
  if (dst_type == DType::kBf16) {
    Convert<DType::kF32, DType::kBf16>(src, dst, n);
  } else if (dst_type == DType::kF16) {
    Convert<DType::kF32, DType::kF16>(src, dst, n);
  }
}

void CastToF32(const void* src, DType src_type, float* dst, size_t n) {
  if (src_type == DType::kBf16) {
    Convert<DType::kBf16, DType::kF32>(src, dst, n);
  } else if (src_type == DType::kF16) {
    Convert<DType::kF16, DType::kF32>(src, dst, n);
  }
}

// ---- memory probes ------------------------------------------------------------------------

void CopyStreaming(float* dst, const float* src, size_t n) {
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
  for (; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(src + i + 1024), _MM_HINT_T0);  // 4 KiB ahead
    _mm_prefetch(reinterpret_cast<const char*>(src + i + 1024 + 16), _MM_HINT_T0);
    const __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
    const __m256 c = _mm256_loadu_ps(src + i + 16), d = _mm256_loadu_ps(src + i + 24);
    _mm256_stream_ps(dst + i, a);
    _mm256_stream_ps(dst + i + 8, b);
    _mm256_stream_ps(dst + i + 16, c);
    _mm256_stream_ps(dst + i + 24, d);
  }
  for (; i < n; ++i) dst[i] = src[i];
}

void Triad(float* a, const float* b, const float* c, float s, size_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

constexpr VariantKernels kAvx2 = {
    "avx2", Adam, AllFinite, Accumulate, CastFromF32, CastToF32, CopyStreaming, Triad,
};

}  // namespace

const VariantKernels& Avx2Kernels() { return kAvx2; }

}  // namespace zinf::kernels::internal
