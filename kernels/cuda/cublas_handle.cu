// CublasHandle and the one GEMM entry point of the CUDA ops (kernels/cuda/cuda_util.cuh).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {

const char* GemmPrecisionName(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kBf16: return "bf16";
    case GemmPrecision::kTf32: return "tf32";
    case GemmPrecision::kFp32: return "fp32";
  }
  return "?";
}

const char* CublasStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "cublasStatus (unknown)";
  }
}

cublasComputeType_t ComputeTypeOf(GemmPrecision precision) {
  switch (precision) {
    case GemmPrecision::kBf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
    case GemmPrecision::kTf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case GemmPrecision::kFp32: return CUBLAS_COMPUTE_32F;
  }
  return CUBLAS_COMPUTE_32F;
}

CublasHandle::CublasHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CublasHandle::~CublasHandle() {
  if (impl_ && impl_->handle != nullptr) cublasDestroy(impl_->handle);
}

Result<std::unique_ptr<CublasHandle>> CublasHandle::Create(GemmPrecision precision,
                                                          void* workspace,
                                                          size_t workspace_bytes) {
  auto impl = std::make_unique<Impl>();
  impl->precision = precision;
  impl->workspace = workspace;
  impl->workspace_bytes = workspace_bytes;
  cublasStatus_t st = cublasCreate(&impl->handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cudaGetLastError();  // cublasCreate may leave a runtime error behind (no device)
    impl->handle = nullptr;
    return CublasCheck(st, "CublasHandle::Create", "cublasCreate");
  }
  // Owned from here on: the destructor destroys the cuBLAS handle on every path.
  std::unique_ptr<CublasHandle> handle(new CublasHandle(std::move(impl)));
  cublasHandle_t h = handle->impl().handle;
  // alpha/beta are host values; CUBLAS_DEFAULT_MATH keeps fp32 exact unless the compute type
  // asks for tensor cores.
  ZINF_RETURN_IF_ERROR(CublasCheck(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST),
                                   "CublasHandle::Create", "cublasSetPointerMode"));
  ZINF_RETURN_IF_ERROR(CublasCheck(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH),
                                   "CublasHandle::Create", "cublasSetMathMode"));
  return Result<std::unique_ptr<CublasHandle>>(std::move(handle));
}

GemmPrecision CublasHandle::precision() const { return impl_->precision; }
void CublasHandle::set_precision(GemmPrecision precision) { impl_->precision = precision; }

Status Gemm(CublasHandle::Impl& impl, const char* op, bool trans_a, bool trans_b, int m, int n,
            int k, const float* a, int lda, long long stride_a, const float* b, int ldb,
            long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch) {
  const float alpha = 1.0f;
  const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute = ComputeTypeOf(impl.precision);
  if (batch == 1) {
    return CublasCheck(cublasGemmEx(impl.handle, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b,
                                    CUDA_R_32F, ldb, &beta, c, CUDA_R_32F, ldc, compute,
                                    CUBLAS_GEMM_DEFAULT),
                       op, "cublasGemmEx");
  }
  return CublasCheck(
      cublasGemmStridedBatchedEx(impl.handle, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda,
                                 stride_a, b, CUDA_R_32F, ldb, stride_b, &beta, c, CUDA_R_32F,
                                 ldc, stride_c, batch, compute, CUBLAS_GEMM_DEFAULT),
      op, "cublasGemmStridedBatchedEx");
}

}  // namespace zinf::kernels::cuda
