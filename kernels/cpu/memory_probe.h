// kernels/cpu/memory_probe.h — the memory-bandwidth yardsticks the CPU Adam is measured
// against, run with the same variant, threads and chunking as the kernels.
//
// Contract:
// - StreamingCopy: dst[i] = src[i] with non-temporal stores, so the memory sees exactly one
//   read and one write per byte (no write-allocate): the machine's practical traffic limit.
//   Count 8 bytes per element.
// - Triad: a[i] = b[i] + s * c[i] with ordinary stores (STREAM's triad). Count 12 bytes per
//   element, as STREAM does; the memory really moves 16 (the write-allocate read of a).
// - TouchPages: writes zeros over [p, p + bytes) in parallel, so that page faults happen before
//   timing starts and pages land near the threads that will use them.
// Errors: InvalidArgument for null pointers with a size > 0 or bad options; FailedPrecondition
// for a variant this CPU lacks.
//
// Thread-safety: reentrant.
#pragma once

#include <cstddef>

#include "kernels/cpu/kernel_options.h"
#include "zinf/status.h"

namespace zinf::kernels {

Status StreamingCopy(float* dst, const float* src, size_t n, const KernelOptions& options = {});
Status Triad(float* a, const float* b, const float* c, float s, size_t n,
             const KernelOptions& options = {});
Status TouchPages(void* p, size_t bytes, const KernelOptions& options = {});

}  // namespace zinf::kernels
