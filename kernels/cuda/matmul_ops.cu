// Linear layer forward and backward through cuBLAS (kernels/cuda/layer_ops.h).
//
// Row-major [rows, cols] buffers are column-major [cols, rows] to cuBLAS, so
//   out[N,OC] = inp·Wᵀ       is  outᵀ[OC,N]   = op_T(W as [C,OC]) · inp as [C,N]
//   dinp[N,C] += dout·W      is  dinpᵀ[C,N]  += W as [C,OC] · dout as [OC,N]
//   dW[OC,C]  += doutᵀ·inp   is  dWᵀ[C,OC]   += inp as [C,N] · op_T(dout as [OC,N])
// The bias is broadcast into `out` first and the GEMM adds onto it (beta = 1). dbias is a
// column sum in a fixed order (each block owns 32 columns, its warps stride over the rows).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void BroadcastRowsKernel(float* out, const float* bias, int OC, size_t total) {
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[idx] = bias != nullptr ? bias[idx % OC] : 0.0f;
  }
}

// grid ColumnSumGrid(OC), block kColumnSumThreads: dbias[c] += Σ_r dout[r, c].
__global__ void BiasBackwardKernel(float* dbias, const float* dout, int N, int OC) {
  __shared__ float part[kWarp][kWarp + 1];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int c = blockIdx.x * kWarp + lane;
  float sum = 0.0f;
  if (c < OC) {
    for (int r = warp; r < N; r += warps) sum += dout[static_cast<size_t>(r) * OC + c];
  }
  part[warp][lane] = sum;
  __syncthreads();
  if (warp == 0 && c < OC) {
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += part[w][lane];
    dbias[c] += total;
  }
}

Status CheckShape(const char* op, int N, int C, int OC) {
  if (N < 0 || C < 0 || OC < 0) {
    return InvalidArgument(std::string(op) + ": negative shape N=" + std::to_string(N) +
                           " C=" + std::to_string(C) + " OC=" + std::to_string(OC));
  }
  return Status::Ok();
}

}  // namespace

Status MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int C, int OC, CublasHandle& cublas, void* stream) {
  constexpr const char* kOp = "MatmulForward";
  ZINF_RETURN_IF_ERROR(CheckShape(kOp, N, C, OC));
  if (N == 0 || OC == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  const size_t total = static_cast<size_t>(N) * OC;
  if (bias != nullptr || C == 0) {
    BroadcastRowsKernel<<<GridFor(total, kThreads), kThreads, 0, s>>>(out, bias, OC, total);
    ZINF_RETURN_IF_ERROR(LaunchStatus(kOp));
  }
  if (C == 0) return Status::Ok();
  CublasHandle::Impl& impl = cublas.impl();
  std::lock_guard<std::mutex> lock(impl.mutex);
  ZINF_RETURN_IF_ERROR(BindStream(impl, s, kOp));
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, /*trans_a=*/true, /*trans_b=*/false, OC, N, C, weight, C,
                            0, inp, C, 0, bias != nullptr ? 1.0f : 0.0f, out, OC, 0, 1));
  return LaunchStatus(kOp);
}

Status MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int C, int OC,
                      CublasHandle& cublas, void* stream) {
  constexpr const char* kOp = "MatmulBackward";
  ZINF_RETURN_IF_ERROR(CheckShape(kOp, N, C, OC));
  if (N == 0 || OC == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  if (C > 0) {
    CublasHandle::Impl& impl = cublas.impl();
    std::lock_guard<std::mutex> lock(impl.mutex);
    ZINF_RETURN_IF_ERROR(BindStream(impl, s, kOp));
    if (dinp != nullptr) {
      ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, false, C, N, OC, weight, C, 0, dout, OC, 0,
                                1.0f, dinp, C, 0, 1));
    }
    ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, true, C, OC, N, inp, C, 0, dout, OC, 0, 1.0f,
                              dweight, C, 0, 1));
  }
  if (dbias != nullptr) {
    BiasBackwardKernel<<<ColumnSumGrid(OC), kColumnSumThreads, 0, s>>>(dbias, dout, N, OC);
  }
  return LaunchStatus(kOp);
}

}  // namespace zinf::kernels::cuda
