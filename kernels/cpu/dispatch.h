// kernels/cpu/dispatch.h — INTERNAL: from options to the kernel table and chunking to use.
//
// Thread-safety: pure functions (ResolveKernels reads the environment).
#pragma once

#include <cstddef>

#include "kernels/cpu/kernel_options.h"
#include "kernels/cpu/variant_kernels.h"
#include "zinf/status.h"

namespace zinf::kernels::internal {

struct Dispatch {
  const VariantKernels* kernels;
  KernelVariant variant;     // concrete, never kAuto
  ParallelOptions parallel;  // threads resolved, chunk rounded to a multiple of 64
};

// Validates threads (>= 0) and chunk_elems (> 0) and resolves the variant (variant.h).
Result<Dispatch> ResolveDispatch(KernelVariant variant, int threads, size_t chunk_elems);

// The table of a concrete variant.
const VariantKernels& KernelsOf(KernelVariant variant);

// Parallel pre-scan: true when none of src[0..n) is inf or NaN (stops early when one is).
bool ParallelAllFinite(const Dispatch& d, const void* src, DType type, size_t n);

inline const void* ElementAt(const void* base, DType type, size_t i) {
  return static_cast<const char*>(base) + i * DTypeSize(type);
}
inline void* ElementAt(void* base, DType type, size_t i) {
  return static_cast<char*>(base) + i * DTypeSize(type);
}

}  // namespace zinf::kernels::internal
