// kernels/cpu/cast.h — bulk fp32 <-> bf16 / fp16 conversion with the SIMD variants.
//
// Contract: CastFromF32 rounds to nearest even exactly like FloatToBf16 / FloatToF16
// (half_convert.h), bit for bit, in every variant (NaN stays NaN); CastToF32 widens exactly
// like Bf16ToFloat / F16ToFloat (an fp16 signalling NaN comes back quiet).
// Errors: InvalidArgument for null pointers with n > 0 or a 16-bit type that is not bf16/fp16;
// FailedPrecondition for a variant this CPU lacks.
// REQUIRES: src and dst do not overlap.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kernel_options.h"
#include "zinf/status.h"

namespace zinf::kernels {

Status CastFromF32(const float* src, void* dst, DType dst_type, size_t n,
                   const KernelOptions& options = {});
Status CastToF32(const void* src, DType src_type, float* dst, size_t n,
                 const KernelOptions& options = {});

}  // namespace zinf::kernels
