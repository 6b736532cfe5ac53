// kernels/cpu/grad_ops.h — gradient accumulation and the finiteness scan, the two places where
// a step learns whether its gradients hold an inf or a NaN.
//
// Contract:
// - AccumulateGrad: acc[i] += scale * src[i] (src fp32, bf16 or fp16; one fused multiply-add
//   in fp32 per element) and returns whether every resulting acc[i] is finite. The offload
//   pipeline accumulates each unit's gradients into fp32 host memory anyway, so this flag comes
//   for free and AdamStep can then run without its pre-scan (check_finite = false).
//   scale must be finite.
// - AllFinite: whether none of src[0..n) is inf or NaN; reads src once, in parallel, and stops
//   early (at chunk granularity) once one is found. This is AdamStep's check_finite pre-scan.
// - SumSquares / SumSquares16: Σ x² in double for the global gradient norm, in a fixed order
//   (fixed element chunks, 8 partial sums per chunk, the chunks' sums added in chunk order), so
//   the same bits for every thread count. SumSquares16 widens bf16/fp16 exactly: the same bits
//   as SumSquares over the float widening. Instantiated for float and double.
// Errors: InvalidArgument for null pointers with n > 0, an unknown dtype or a bad option;
// FailedPrecondition for a variant this CPU lacks. On error nothing is modified.
// REQUIRES: acc and src do not overlap.
//
// Thread-safety: reentrant; concurrent calls on disjoint buffers are fine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kernel_options.h"
#include "kernels/cpu/op_options.h"
#include "zinf/status.h"

namespace zinf::kernels {

Result<bool> AccumulateGrad(float* acc, const void* src, DType src_type, size_t n,
                            float scale = 1.0f, const KernelOptions& options = {});

Result<bool> AllFinite(const void* src, DType type, size_t n, const KernelOptions& options = {});

}  // namespace zinf::kernels

namespace zinf::kernels::cpu {

template <typename T>
double SumSquares(const T* x, size_t n, const OpOptions& o = {});
// x holds n values of `type` (kBf16 or kF16).
double SumSquares16(const uint16_t* x, DType type, size_t n, const OpOptions& o = {});

}  // namespace zinf::kernels::cpu
