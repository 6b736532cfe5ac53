#include "kernels/cpu/memory_probe.h"

#include <cstring>

#include "kernels/cpu/dispatch.h"

namespace zinf::kernels {

Status StreamingCopy(float* dst, const float* src, size_t n, const KernelOptions& options) {
  if (n > 0 && (dst == nullptr || src == nullptr)) {
    return InvalidArgument("StreamingCopy: null buffer with n > 0");
  }
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    d.kernels->copy_streaming(dst + begin, src + begin, end - begin);
  });
  return Status::Ok();
}

Status Triad(float* a, const float* b, const float* c, float s, size_t n,
             const KernelOptions& options) {
  if (n > 0 && (a == nullptr || b == nullptr || c == nullptr)) {
    return InvalidArgument("Triad: null buffer with n > 0");
  }
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    d.kernels->triad(a + begin, b + begin, c + begin, s, end - begin);
  });
  return Status::Ok();
}

Status TouchPages(void* p, size_t bytes, const KernelOptions& options) {
  if (bytes > 0 && p == nullptr) return InvalidArgument("TouchPages: null buffer");
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  // Chunks of bytes, 4x the element chunk: the same split as a 4-byte-element kernel.
  ParallelOptions parallel = d.parallel;
  parallel.chunk_elems *= sizeof(float);
  ParallelForChunks(bytes, parallel, [&](size_t begin, size_t end) {
    std::memset(static_cast<char*>(p) + begin, 0, end - begin);
  });
  return Status::Ok();
}

}  // namespace zinf::kernels
