#include "kernels/cpu/cast.h"

#include <string>

#include "kernels/cpu/dispatch.h"

namespace zinf::kernels {
namespace {

Status CheckArgs(const char* what, const void* src, const void* dst, DType half, size_t n) {
  if (half != DType::kBf16 && half != DType::kF16) {
    return InvalidArgument(std::string(what) + ": the 16-bit type must be bf16 or fp16");
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return InvalidArgument(std::string(what) + ": null buffer with n > 0");
  }
  return Status::Ok();
}

}  // namespace

Status CastFromF32(const float* src, void* dst, DType dst_type, size_t n,
                   const KernelOptions& options) {
  ZINF_RETURN_IF_ERROR(CheckArgs("CastFromF32", src, dst, dst_type, n));
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    d.kernels->cast_from_f32(src + begin, internal::ElementAt(dst, dst_type, begin), dst_type,
                             end - begin);
  });
  return Status::Ok();
}

Status CastToF32(const void* src, DType src_type, float* dst, size_t n,
                 const KernelOptions& options) {
  ZINF_RETURN_IF_ERROR(CheckArgs("CastToF32", src, dst, src_type, n));
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  ParallelForChunks(n, d.parallel, [&](size_t begin, size_t end) {
    d.kernels->cast_to_f32(internal::ElementAt(src, src_type, begin), src_type, dst + begin,
                           end - begin);
  });
  return Status::Ok();
}

}  // namespace zinf::kernels
