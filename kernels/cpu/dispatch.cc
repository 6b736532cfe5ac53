#include "kernels/cpu/dispatch.h"

#include <atomic>
#include <string>

namespace zinf::kernels::internal {

const VariantKernels& KernelsOf(KernelVariant variant) {
#if defined(ZINF_CPU_X86_SIMD)
  switch (variant) {
    case KernelVariant::kAvx2:
      return Avx2Kernels();
    case KernelVariant::kAvx512:
      return Avx512Kernels();
    case KernelVariant::kAvx512Bf16:
      return Avx512Bf16Kernels();
    case KernelVariant::kAuto:
    case KernelVariant::kScalar:
      break;
  }
#endif
  // Without the x86 variants compiled in, VariantSupported never admits them (no cpuid).
  return ScalarKernels();
}

Result<Dispatch> ResolveDispatch(KernelVariant variant, int threads, size_t chunk_elems) {
  if (threads < 0) {
    return InvalidArgument("threads must be >= 0 (0 = all cores), got " + std::to_string(threads));
  }
  if (chunk_elems == 0) return InvalidArgument("chunk_elems must be > 0");
  ZINF_ASSIGN_OR_RETURN(KernelVariant resolved, ResolveVariant(variant));
  constexpr size_t kAlign = 64;  // keeps a 64-byte aligned buffer aligned in every chunk
  Dispatch d;
  d.kernels = &KernelsOf(resolved);
  d.variant = resolved;
  d.parallel.threads = ResolveThreads(threads);
  d.parallel.chunk_elems = (chunk_elems + kAlign - 1) / kAlign * kAlign;
  return d;
}

bool ParallelAllFinite(const Dispatch& d, const void* src, DType type, size_t n) {
  std::atomic<bool> found{false};
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    if (found.load(std::memory_order_relaxed)) return;
    if (!d.kernels->all_finite(ElementAt(src, type, begin), type, end - begin)) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return !found.load();
}

}  // namespace zinf::kernels::internal
