// The scalar variant: portable C++ compiled for baseline x86-64 (the compiler may still use
// SSE2). It is the fallback on any CPU and the readable statement of every formula.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/variant_kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace zinf::kernels::internal {
namespace {

using AdamFn = void (*)(const AdamCoeffs&, const AdamChunk&);

// kOut: 0 no 16-bit copy, otherwise the DType of the copy. kSR: bf16 state rounded
// stochastically.
template <DType kGrad, DType kState, int kOut, bool kSR = false>
void AdamChunkT(const AdamCoeffs& c, const AdamChunk& chunk) {
  const AdamChunk ch = chunk;  // a local copy: see kernels_avx512.inc
  for (size_t i = 0; i < ch.n; ++i) {
    float p = ch.param[i];
    float g = LoadAsFloat(ch.grad, kGrad, i) * c.grad_scale;
    g = c.l2 * p + g;  // Adam's L2 term (l2 = 0 for AdamW)
    p = p * c.decay;   // AdamW's decoupled decay (decay = 1 for Adam)
    const float m = c.beta1 * LoadAsFloat(ch.exp_avg, kState, i) + c.one_minus_beta1 * g;
    const float v = c.beta2 * LoadAsFloat(ch.exp_avg_sq, kState, i) + c.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    p = p + c.neg_step_size * (m / denom);
    ch.param[i] = p;
    if constexpr (kSR) {
      const auto j = static_cast<uint32_t>(ch.first + i);
      static_cast<uint16_t*>(ch.exp_avg)[i] = FloatToBf16Stochastic(m, StochasticBits(j, c.seed_m));
      static_cast<uint16_t*>(ch.exp_avg_sq)[i] =
          FloatToBf16Stochastic(v, StochasticBits(j, c.seed_v));
    } else {
      StoreFromFloat(ch.exp_avg, kState, i, m);
      StoreFromFloat(ch.exp_avg_sq, kState, i, v);
    }
    if constexpr (kOut != 0) StoreFromFloat(ch.param16, static_cast<DType>(kOut), i, p);
  }
}

template <DType kGrad, DType kState, bool kSR = false>
AdamFn PickOut(const AdamLayout& l) {
  if (!l.has_param16) return AdamChunkT<kGrad, kState, 0, kSR>;
  if (l.param16_type == DType::kBf16) return AdamChunkT<kGrad, kState, int(DType::kBf16), kSR>;
  return AdamChunkT<kGrad, kState, int(DType::kF16), kSR>;
}

template <DType kGrad>
AdamFn PickState(const AdamLayout& l) {
  if (l.state_type == DType::kF32) return PickOut<kGrad, DType::kF32>(l);
  return l.stochastic_state ? PickOut<kGrad, DType::kBf16, true>(l)
                            : PickOut<kGrad, DType::kBf16>(l);
}

void Adam(const AdamCoeffs& c, const AdamLayout& l, const AdamChunk& ch) {
  AdamFn fn = l.grad_type == DType::kF32    ? PickState<DType::kF32>(l)
              : l.grad_type == DType::kBf16 ? PickState<DType::kBf16>(l)
                                            : PickState<DType::kF16>(l);
  fn(c, ch);
}

bool AllFinite(const void* src, DType type, size_t n) {
  if (type == DType::kF32) {
    const uint32_t* u = static_cast<const uint32_t*>(src);
    uint32_t worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, u[i] & 0x7fffffffu);
    return worst < 0x7f800000u;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  uint32_t worst = 0;
  for (size_t i = 0; i < n; ++i) worst = std::max<uint32_t>(worst, h[i] & 0x7fffu);
  return worst < (type == DType::kBf16 ? 0x7f80u : 0x7c00u);
}

bool Accumulate(float* acc, const void* src, DType type, size_t n, float scale) {
  uint32_t worst = 0;
  for (size_t i = 0; i < n; ++i) {
    const float a = acc[i] + scale * LoadAsFloat(src, type, i);
    acc[i] = a;
    worst = std::max(worst, FloatBits(a) & 0x7fffffffu);
  }
  return worst < 0x7f800000u;
}

void CastFromF32(const float* src, void* dst, DType dst_type, size_t n) {
  for (size_t i = 0; i < n; ++i) StoreFromFloat(dst, dst_type, i, src[i]);
}

void CastToF32(const void* src, DType src_type, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = LoadAsFloat(src, src_type, i);
}

void CopyStreaming(float* dst, const float* src, size_t n) {
#if defined(__SSE2__)
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
  for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
#else
  std::memcpy(dst, src, n * sizeof(float));
#endif
}

void Triad(float* a, const float* b, const float* c, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

constexpr VariantKernels kScalar = {
    "scalar", Adam, AllFinite, Accumulate, CastFromF32, CastToF32, CopyStreaming, Triad,
};

}  // namespace

const VariantKernels& ScalarKernels() { return kScalar; }

}  // namespace zinf::kernels::internal
