// LayerNorm forward and backward (kernels/cuda/layer_ops.h).
//
// Forward: one warp per row, two passes (mean, then the biased variance of x - mean), as the
// CPU does. Backward: one warp per row for dinp, then a column kernel for dweight and dbias in
// which each block owns 32 columns and its 32 warps stride over the rows; the warps' partial
// sums are added in warp order. No atomics anywhere, so the bits do not vary between runs.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;  // 8 rows (warps) per block
constexpr int kRowsPerBlock = kRowThreads / kWarp;
constexpr float kEps = 1e-5f;

__global__ void LayerNormForwardKernel(float* out, float* mean, float* rstd, const float* inp,
                                       const float* weight, const float* bias, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) sum += x[i];
  const float m = WarpSum(sum) / C;
  sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float d = x[i] - m;
    sum += d * d;
  }
  const float s = 1.0f / sqrtf(WarpSum(sum) / C + kEps);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
  float* o = out + static_cast<size_t>(row) * C;
  for (int i = lane; i < C; i += kWarp) {
    const float n = s * (x[i] - m);
    o[i] = n * weight[i] + bias[i];
  }
}

__global__ void LayerNormBackwardInputKernel(float* dinp, const float* dout, const float* inp,
                                             const float* weight, const float* mean,
                                             const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const size_t base = static_cast<size_t>(row) * C;
  const float m = mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float norm = (inp[base + i] - m) * s;
    const float dnorm = weight[i] * dout[base + i];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = WarpSum(dnorm_sum) / C;
  const float dnorm_norm_mean = WarpSum(dnorm_norm_sum) / C;
  for (int i = lane; i < C; i += kWarp) {
    const float norm = (inp[base + i] - m) * s;
    float dval = weight[i] * dout[base + i];
    dval -= dnorm_mean;
    dval -= norm * dnorm_norm_mean;
    dval *= s;
    dinp[base + i] += dval;
  }
}

// grid ColumnSumGrid(C), block kColumnSumThreads (32 warps).
__global__ void LayerNormBackwardParamsKernel(float* dweight, float* dbias, const float* dout,
                                              const float* inp, const float* mean,
                                              const float* rstd, int N, int C) {
  __shared__ float dw_part[kWarp][kWarp + 1];
  __shared__ float db_part[kWarp][kWarp + 1];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  const int c = blockIdx.x * kWarp + lane;
  float dw = 0.0f, db = 0.0f;
  if (c < C) {
    for (int r = warp; r < N; r += warps) {
      const size_t idx = static_cast<size_t>(r) * C + c;
      const float d = dout[idx];
      dw += (inp[idx] - mean[r]) * rstd[r] * d;
      db += d;
    }
  }
  dw_part[warp][lane] = dw;
  db_part[warp][lane] = db;
  __syncthreads();
  if (warp == 0 && c < C) {
    float dw_total = 0.0f, db_total = 0.0f;
    for (int w = 0; w < warps; ++w) {
      dw_total += dw_part[w][lane];
      db_total += db_part[w][lane];
    }
    if (dweight != nullptr) dweight[c] += dw_total;
    if (dbias != nullptr) dbias[c] += db_total;
  }
}

Status CheckShape(const char* op, int N, int C) {
  if (N < 0 || C < 0) {
    return InvalidArgument(std::string(op) + ": negative shape N=" + std::to_string(N) +
                           " C=" + std::to_string(C));
  }
  return Status::Ok();
}

unsigned RowGrid(int N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int N, int C, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("LayerNormForward", N, C));
  if (N == 0 || C == 0) return Status::Ok();
  LayerNormForwardKernel<<<RowGrid(N), kRowThreads, 0, AsStream(stream)>>>(out, mean, rstd, inp,
                                                                           weight, bias, N, C);
  return LaunchStatus("LayerNormForward");
}

Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("LayerNormBackward", N, C));
  if (N == 0 || C == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  if (dinp != nullptr) {
    LayerNormBackwardInputKernel<<<RowGrid(N), kRowThreads, 0, s>>>(dinp, dout, inp, weight,
                                                                    mean, rstd, N, C);
  }
  if (dweight != nullptr || dbias != nullptr) {
    LayerNormBackwardParamsKernel<<<ColumnSumGrid(C), kColumnSumThreads, 0, s>>>(
        dweight, dbias, dout, inp, mean, rstd, N, C);
  }
  return LaunchStatus("LayerNormBackward");
}

}  // namespace zinf::kernels::cuda
