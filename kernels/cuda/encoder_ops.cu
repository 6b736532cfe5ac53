// Token + position embedding, forward and backward (kernels/cuda/layer_ops.h).
//
// EncoderBackward is deterministic without atomics: dwpe[t,c] adds the B rows of position t in
// batch order; dwte is written by one block per FIRST occurrence of each token (the block for
// position i leaves as soon as it sees the same token at an earlier position), which adds every
// row holding that token in position order, starting from dwte's old value. That is the CPU
// loop's order, so both give the same bits (plain adds, no FMA to contract).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTokensPerTile = kThreads;      // one token per thread per tile
constexpr int kChannelsPerThread = 4;
constexpr int kChannelsPerBlock = kThreads * kChannelsPerThread;

__global__ void EncoderForwardKernel(float* out, const int32_t* tokens, const float* wte,
                                     const float* wpe, int seq, int C, size_t total) {
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t row = idx / C;
    const int c = static_cast<int>(idx % C);
    const int t = static_cast<int>(row % seq);
    const size_t ix = static_cast<size_t>(tokens[row]);
    out[idx] = wte[ix * C + c] + wpe[static_cast<size_t>(t) * C + c];
  }
}

// One thread per (t, c): dwpe[t,c] += dout[0,t,c] + dout[1,t,c] + ... in batch order.
__global__ void PositionBackwardKernel(float* dwpe, const float* dout, int B, int seq, int C) {
  const size_t total = static_cast<size_t>(seq) * C;
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float acc = dwpe[idx];
    for (int b = 0; b < B; ++b) acc += dout[static_cast<size_t>(b) * total + idx];
    dwpe[idx] = acc;
  }
}

// grid (N, ceil(C / kChannelsPerBlock)); block kThreads.
__global__ void TokenBackwardKernel(float* dwte, const float* dout, const int32_t* tokens, int N,
                                    int C) {
  __shared__ int rows[kTokensPerTile];
  __shared__ int warp_counts[kThreads / kWarp];
  const int i = blockIdx.x;
  const int token = tokens[i];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int c0 = blockIdx.y * kChannelsPerBlock + threadIdx.x;
  float* dst = dwte + static_cast<size_t>(token) * C;
  float acc[kChannelsPerThread];
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = c0 + k * kThreads;
    acc[k] = c < C ? dst[c] : 0.0f;
  }
  for (int j0 = 0; j0 < N; j0 += kTokensPerTile) {
    const int j = j0 + threadIdx.x;
    const bool match = j < N && tokens[j] == token;
    // An earlier position holds this token: its block does the work. Uniform exit.
    if (__syncthreads_or(match && j < i)) return;
    if (j0 + kTokensPerTile <= i) continue;  // no match at or after i in this tile
    // Compact the matching positions of this tile, in order, into `rows`.
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_counts[warp] = __popc(mask);
    __syncthreads();
    int offset = 0, total = 0;
    for (int w = 0; w < kThreads / kWarp; ++w) {
      offset += w < warp ? warp_counts[w] : 0;
      total += warp_counts[w];
    }
    if (match) rows[offset + __popc(mask & ((1u << lane) - 1u))] = j;
    __syncthreads();
    for (int r = 0; r < total; ++r) {
      const float* src = dout + static_cast<size_t>(rows[r]) * C;
#pragma unroll
      for (int k = 0; k < kChannelsPerThread; ++k) {
        const int c = c0 + k * kThreads;
        if (c < C) acc[k] += src[c];
      }
    }
    __syncthreads();  // `rows` and `warp_counts` are rewritten by the next tile
  }
#pragma unroll
  for (int k = 0; k < kChannelsPerThread; ++k) {
    const int c = c0 + k * kThreads;
    if (c < C) dst[c] = acc[k];
  }
}

Status CheckShape(const char* op, int B, int seq, int C) {
  if (B < 0 || seq < 0 || C < 0) {
    return InvalidArgument(std::string(op) + ": negative shape B=" + std::to_string(B) +
                           " seq=" + std::to_string(seq) + " C=" + std::to_string(C));
  }
  return Status::Ok();
}

}  // namespace

Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int B, int seq, int C, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("EncoderForward", B, seq, C));
  const size_t total = static_cast<size_t>(B) * seq * C;
  if (total == 0) return Status::Ok();
  EncoderForwardKernel<<<GridFor(total, kThreads), kThreads, 0, AsStream(stream)>>>(
      out, tokens, wte, wpe, seq, C, total);
  return LaunchStatus("EncoderForward");
}

Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int B, int seq, int C, void* stream) {
  ZINF_RETURN_IF_ERROR(CheckShape("EncoderBackward", B, seq, C));
  const int N = B * seq;
  if (N == 0 || C == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  PositionBackwardKernel<<<GridFor(static_cast<size_t>(seq) * C, kThreads), kThreads, 0, s>>>(
      dwpe, dout, B, seq, C);
  const dim3 grid(static_cast<unsigned>(N),
                  static_cast<unsigned>((C + kChannelsPerBlock - 1) / kChannelsPerBlock));
  TokenBackwardKernel<<<grid, kThreads, 0, s>>>(dwte, dout, tokens, N, C);
  return LaunchStatus("EncoderBackward");
}

}  // namespace zinf::kernels::cuda
