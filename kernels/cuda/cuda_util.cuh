// kernels/cuda/cuda_util.cuh — internal helpers of the CUDA ops (nvcc only, never included by
// host-compiled code): error-to-Status conversion, launch geometry, warp and block reductions,
// and the definition of CublasHandle::Impl.
//
// Contract: LaunchStatus(op) turns cudaGetLastError into a Status naming the op; CublasCheck
// does the same for a cublasStatus_t. Reductions are fixed butterflies / trees, so their
// results do not depend on scheduling.
//
// Thread-safety: pure helpers; CublasHandle::Impl::mutex guards its handle.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "kernels/cuda/layer_ops.h"
#include "zinf/status.h"

namespace zinf::kernels::cuda {

struct CublasHandle::Impl {
  cublasHandle_t handle = nullptr;
  GemmPrecision precision = GemmPrecision::kBf16;
  void* workspace = nullptr;  // the caller's device memory for cuBLAS, or null
  size_t workspace_bytes = 0;
  std::mutex mutex;  // cublasSetStream + the GEMM calls of one op happen under it
};

inline cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

inline Status CudaErrorStatus(cudaError_t err, const char* op) {
  if (err == cudaSuccess) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    code = StatusCode::kUnavailable;
  } else if (err == cudaErrorMemoryAllocation) {
    code = StatusCode::kResourceExhausted;
  } else if (err == cudaErrorInvalidValue || err == cudaErrorInvalidConfiguration ||
             err == cudaErrorInvalidDevicePointer) {
    code = StatusCode::kInvalidArgument;
  }
  return Status(code, std::string(op) + ": " + cudaGetErrorString(err) + " (" +
                          cudaGetErrorName(err) + ")");
}

// The status of the kernels just launched (and of any sticky fault before them).
inline Status LaunchStatus(const char* op) { return CudaErrorStatus(cudaGetLastError(), op); }

const char* CublasStatusName(cublasStatus_t status);

inline Status CublasCheck(cublasStatus_t status, const char* op, const char* call) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  StatusCode code = status == CUBLAS_STATUS_NOT_INITIALIZED ? StatusCode::kUnavailable
                    : status == CUBLAS_STATUS_ALLOC_FAILED  ? StatusCode::kResourceExhausted
                    : status == CUBLAS_STATUS_INVALID_VALUE ? StatusCode::kInvalidArgument
                    : status == CUBLAS_STATUS_NOT_SUPPORTED ? StatusCode::kUnimplemented
                                                            : StatusCode::kInternal;
  return Status(code, std::string(op) + ": " + call + " failed: " + CublasStatusName(status));
}

cublasComputeType_t ComputeTypeOf(GemmPrecision precision);

// Binds the handle to `stream` for the GEMMs that follow, and its workspace again: cublasSetStream
// resets the workspace to cuBLAS's own pool. The caller holds impl.mutex.
inline Status BindStream(CublasHandle::Impl& impl, cudaStream_t stream, const char* op) {
  ZINF_RETURN_IF_ERROR(CublasCheck(cublasSetStream(impl.handle, stream), op, "cublasSetStream"));
  if (impl.workspace == nullptr) return Status::Ok();
  return CublasCheck(cublasSetWorkspace(impl.handle, impl.workspace, impl.workspace_bytes), op,
                     "cublasSetWorkspace");
}

// One column-major GEMM C = alpha·op(A)·op(B) + beta·C on fp32 buffers (cublasGemmEx), or a
// strided batch of them when batch > 1. The caller holds impl.mutex and has set the stream.
Status Gemm(CublasHandle::Impl& impl, const char* op, bool trans_a, bool trans_b, int m, int n,
            int k, const float* a, int lda, long long stride_a, const float* b, int ldb,
            long long stride_b, float beta, float* c, int ldc, long long stride_c, int batch);

constexpr int kWarp = 32;

inline unsigned GridFor(size_t n, int block, unsigned max_blocks = 65535u * 8u) {
  size_t blocks = (n + block - 1) / block;
  if (blocks > max_blocks) blocks = max_blocks;  // kernels use grid-stride loops
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets
// the result. `shared` holds 32 values. Fixed order: warp butterflies, then warp 0's.
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = WarpSum(v);
  __syncthreads();  // `shared` may still be read from an earlier call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return WarpSum(total);
}

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = lane < warps ? shared[lane] : -INFINITY;
  return WarpMax(total);
}

// Column sums: out[c] += Σ_r f(r, c) for r < rows, c < cols, in a fixed order. Launched with
// ColumnSumGrid(cols) blocks of kColumnSumThreads threads; each block owns 32 columns.
constexpr int kColumnSumThreads = 1024;
inline unsigned ColumnSumGrid(int cols) { return static_cast<unsigned>((cols + kWarp - 1) / kWarp); }

}  // namespace zinf::kernels::cuda
