// kernels/cpu/kernel_options.h — how a CPU kernel call is run: which SIMD variant, how many
// threads, what chunk size. Shared by the gradient ops, the casts and the memory probes
// (AdamOptions carries the same fields plus its own).
//
// Thread-safety: a plain value.
#pragma once

#include <cstddef>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/variant.h"

namespace zinf::kernels {

struct KernelOptions {
  KernelVariant variant = KernelVariant::kAuto;  // see variant.h (ZINF_ADAM_VARIANT)
  int threads = 0;                               // 0 = all cores; 1 = the calling thread only
  size_t chunk_elems = kDefaultChunkElems;       // > 0; rounded up to a multiple of 64
};

}  // namespace zinf::kernels
