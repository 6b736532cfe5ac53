#include "kernels/cpu/grad_ops.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <string>

#include "kernels/cpu/dispatch.h"

namespace zinf::kernels {
namespace {

bool KnownDType(DType t) { return t == DType::kF32 || t == DType::kBf16 || t == DType::kF16; }

}  // namespace

Result<bool> AccumulateGrad(float* acc, const void* src, DType src_type, size_t n, float scale,
                            const KernelOptions& options) {
  if (!KnownDType(src_type)) return InvalidArgument("AccumulateGrad: unknown source dtype");
  if (!std::isfinite(scale)) {
    return InvalidArgument(fmt::format("AccumulateGrad: scale must be finite, got {}", scale));
  }
  if (n > 0 && (acc == nullptr || src == nullptr)) {
    return InvalidArgument("AccumulateGrad: null buffer with n > 0");
  }
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  std::atomic<bool> nonfinite{false};
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    const bool finite = d.kernels->accumulate(
        acc + begin, internal::ElementAt(src, src_type, begin), src_type, end - begin, scale);
    if (!finite) nonfinite.store(true, std::memory_order_relaxed);
  });
  return !nonfinite.load();
}

Result<bool> AllFinite(const void* src, DType type, size_t n, const KernelOptions& options) {
  if (!KnownDType(type)) return InvalidArgument("AllFinite: unknown dtype");
  if (n > 0 && src == nullptr) return InvalidArgument("AllFinite: null buffer with n > 0");
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  return internal::ParallelAllFinite(d, src, type, n);
}

}  // namespace zinf::kernels
