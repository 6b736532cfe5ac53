// kernels/cpu/variant_kernels.h — INTERNAL: the table of kernels each SIMD variant provides.
//
// Contract: every function works on one contiguous chunk on the calling thread; splitting
// into chunks, threads, validation and dispatch live in adam.cc / grad_ops.cc / cast.cc.
// Functions that use non-temporal stores (adam with stream_param16, copy_streaming) do NOT
// fence: they run under ParallelForChunks, which issues one sfence per thread's run of chunks.
// All variants compute the same formulas (see adam.h); fp32 results may differ between
// variants by FMA contraction (a few ulps), 16-bit conversions never differ.
//
// The SIMD translation units that define these tables are compiled with their own ISA flags.
// They include only this header (plain structs, no inline functions) and <immintrin.h>, and
// keep everything else in an anonymous namespace, so no AVX-compiled inline function can be
// chosen by the linker for code that must run on any x86-64.
//
// Thread-safety: the tables are immutable; the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dtype.h"

namespace zinf::kernels::internal {

// One Adam step's coefficients, derived once per call in double and rounded to fp32.
struct AdamCoeffs {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float neg_step_size;  // -lr / (1 - beta1^t), or -lr without bias correction
  float inv_sqrt_bc2;   // 1 / sqrt(1 - beta2^t), or 1
  float eps;
  float decay;  // AdamW: 1 - lr * weight_decay; Adam: 1
  float l2;     // Adam: weight_decay; AdamW: 0
  float grad_scale;
  // Stochastic rounding of bf16 moments: the random streams of exp_avg and exp_avg_sq.
  uint32_t seed_m;
  uint32_t seed_v;
};

struct AdamLayout {
  DType grad_type;
  DType state_type;  // kF32 or kBf16
  bool stochastic_state;  // kBf16 state rounded stochastically (StochasticBits), not to nearest
  bool has_param16;
  DType param16_type;   // kBf16 or kF16 when has_param16
  bool stream_param16;  // non-temporal stores for param16 where it is 64-byte aligned
};

// One chunk of the buffers, each pointer already at the chunk's first element.
struct AdamChunk {
  float* param;
  const void* grad;
  void* exp_avg;
  void* exp_avg_sq;
  void* param16;  // null when !has_param16
  size_t n;
  size_t first;  // the index of the chunk's first element in the whole call (random streams)
};

struct VariantKernels {
  const char* name;
  void (*adam)(const AdamCoeffs& c, const AdamLayout& layout, const AdamChunk& chunk);
  // True when none of src[0..n) is an inf or a NaN.
  bool (*all_finite)(const void* src, DType type, size_t n);
  // acc[i] += scale * src[i]; true when every resulting acc[i] is finite.
  bool (*accumulate)(float* acc, const void* src, DType type, size_t n, float scale);
  // dst[i] = round_to_nearest_even(src[i]) as bf16 or fp16.
  void (*cast_from_f32)(const float* src, void* dst, DType dst_type, size_t n);
  // dst[i] = src[i] (bf16 or fp16) widened to fp32, exactly.
  void (*cast_to_f32)(const void* src, DType src_type, float* dst, size_t n);
  // dst[i] = src[i] with non-temporal stores (memory probe).
  void (*copy_streaming)(float* dst, const float* src, size_t n);
  // a[i] = b[i] + s * c[i] with ordinary stores (STREAM triad, memory probe).
  void (*triad)(float* a, const float* b, const float* c, float s, size_t n);
};

const VariantKernels& ScalarKernels();
const VariantKernels& Avx2Kernels();
const VariantKernels& Avx512Kernels();
const VariantKernels& Avx512Bf16Kernels();

}  // namespace zinf::kernels::internal
