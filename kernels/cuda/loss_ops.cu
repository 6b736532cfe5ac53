// Softmax cross-entropy forward/backward and the sum of squares for the gradient norm
// (kernels/cuda/layer_ops.h). Reductions are block trees in a fixed order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kRowThreads = 512;
constexpr int kThreads = 256;
// SumSquares: a fixed grid, so the order of the additions is the same on every GPU.
constexpr int kSumBlocks = 512;
constexpr int kSumThreads = 256;

// One block per row of V logits.
__global__ void CrossEntropyForwardKernel(float* losses, float* probs, const float* logits,
                                          const int32_t* targets, int V) {
  __shared__ float shared[kWarp];
  const size_t base = static_cast<size_t>(blockIdx.x) * V;
  const float* x = logits + base;
  float maxval = -INFINITY;
  for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, x[i]);
  maxval = BlockMax(maxval, shared);
  float sum = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(x[i] - maxval);
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) {
    const int32_t t = targets[blockIdx.x];
    // log Σ exp(x - max) - (x_t - max) = -log p_t, finite where p_t underflows
    losses[blockIdx.x] = (t >= 0 && t < V) ? logf(sum) - (x[t] - maxval) : NAN;
  }
  __syncthreads();  // x[t] is read before probs (which may alias logits) is written
  float* p = probs + base;
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(x[i] - maxval) * inv;
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* probs,
                                           const int32_t* targets, const float* dloss, int V,
                                           size_t total) {
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = idx / V;
    const int v = static_cast<int>(idx % V);
    const float indicator = v == targets[row] ? 1.0f : 0.0f;
    dlogits[idx] += (probs[idx] - indicator) * dloss[row];
  }
}

__global__ void SumSquaresPartialKernel(double* partials, const float* x, size_t n) {
  __shared__ double shared[kWarp];
  double acc = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    acc += v * v;
  }
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// One block of kSumBlocks threads.
__global__ void SumSquaresFinalKernel(double* out, const double* partials, bool accumulate) {
  __shared__ double shared[kWarp];
  const double total = BlockSum(partials[threadIdx.x], shared);
  if (threadIdx.x == 0) *out = accumulate ? *out + total : total;
}

}  // namespace

Status CrossEntropyForward(float* losses, float* probs, const float* logits,
                           const int32_t* targets, int N, int V, void* stream) {
  if (N < 0 || V <= 0) {
    return InvalidArgument("CrossEntropyForward: bad shape N=" + std::to_string(N) +
                           " V=" + std::to_string(V) + " (need N >= 0, V > 0)");
  }
  if (N == 0) return Status::Ok();
  CrossEntropyForwardKernel<<<static_cast<unsigned>(N), kRowThreads, 0, AsStream(stream)>>>(
      losses, probs, logits, targets, V);
  return LaunchStatus("CrossEntropyForward");
}

Status CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                            const float* dloss, int N, int V, void* stream) {
  if (N < 0 || V <= 0) {
    return InvalidArgument("CrossEntropyBackward: bad shape N=" + std::to_string(N) +
                           " V=" + std::to_string(V) + " (need N >= 0, V > 0)");
  }
  const size_t total = static_cast<size_t>(N) * V;
  if (total == 0) return Status::Ok();
  CrossEntropyBackwardKernel<<<GridFor(total, kThreads), kThreads, 0, AsStream(stream)>>>(
      dlogits, probs, targets, dloss, V, total);
  return LaunchStatus("CrossEntropyBackward");
}

size_t SumSquaresScratchElems() { return kSumBlocks; }

Status SumSquares(double* out, double* scratch, const float* x, size_t n, bool accumulate,
                  void* stream) {
  cudaStream_t s = AsStream(stream);
  // n == 0 still runs: the partials are zeros and *out is written (or kept).
  SumSquaresPartialKernel<<<kSumBlocks, kSumThreads, 0, s>>>(scratch, x, n);
  SumSquaresFinalKernel<<<1, kSumBlocks, 0, s>>>(out, scratch, accumulate);
  return LaunchStatus("SumSquares");
}

}  // namespace zinf::kernels::cuda
