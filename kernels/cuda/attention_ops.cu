// Causal multi-head attention forward and backward, llm.c's way (kernels/cuda/layer_ops.h):
// permute qkv [B,T,3,NH,hs] to q, k, v [B,NH,T,hs]; batched GEMMs through cuBLAS; a causal
// softmax kernel (one warp per row, scale folded in, zeros written above the diagonal);
// unpermute. T is `seq`, hs = C/NH.
//
// Scratch layout (floats, X = B*T*C, A = B*NH*T*T):
//   forward:  q | k | v                      (3X; att·v lands in q's slot)
//   backward: q | k | v | dva→dq | dk | dv | datt  (6X + A)
// att·v and q·kᵀ in row-major are, to column-major cuBLAS, (vᵀ·attᵀ) and (k·qᵀ) on the same
// buffers, so every GEMM is one strided-batched call over B*NH heads.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <mutex>
#include <string>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;

struct Dims {
  int B, T, C, NH, hs;
  size_t Elems() const { return static_cast<size_t>(B) * T * C; }  // one of q, k, v
  size_t AttElems() const { return static_cast<size_t>(B) * NH * T * T; }
};

// Index idx of [B,NH,T,hs] -> offset of the q part of the same element in [B,T,3C].
__device__ __forceinline__ size_t QkvOffset(size_t idx, int T, int NH, int hs, int C,
                                            size_t* bthd_out) {
  const int d = static_cast<int>(idx % hs);
  size_t rest = idx / hs;
  const int t = static_cast<int>(rest % T);
  rest /= T;
  const int h = static_cast<int>(rest % NH);
  const size_t b = rest / NH;
  // [B,T,C] offset of the same element, for unpermute.
  *bthd_out = (b * T + t) * static_cast<size_t>(C) + static_cast<size_t>(h) * hs + d;
  return (b * T + t) * static_cast<size_t>(3 * C) + static_cast<size_t>(h) * hs + d;
}

#define ZINF_ATT_LOOP(idx, n)                                                            \
  for (size_t idx = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < (n); \
       idx += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void PermuteKernel(float* q, float* k, float* v, const float* qkv, int T, int NH,
                              int hs, int C, size_t n) {
  ZINF_ATT_LOOP(idx, n) {
    size_t unused;
    const size_t src = QkvOffset(idx, T, NH, hs, C, &unused);
    q[idx] = qkv[src];
    k[idx] = qkv[src + C];
    v[idx] = qkv[src + 2 * static_cast<size_t>(C)];
  }
}

// dqkv += (dq, dk, dv) permuted back.
__global__ void PermuteBackwardKernel(float* dqkv, const float* dq, const float* dk,
                                      const float* dv, int T, int NH, int hs, int C, size_t n) {
  ZINF_ATT_LOOP(idx, n) {
    size_t unused;
    const size_t dst = QkvOffset(idx, T, NH, hs, C, &unused);
    dqkv[dst] += dq[idx];
    dqkv[dst + C] += dk[idx];
    dqkv[dst + 2 * static_cast<size_t>(C)] += dv[idx];
  }
}

// out [B,T,C] <- vacc [B,NH,T,hs]
__global__ void UnpermuteKernel(float* out, const float* vacc, int T, int NH, int hs, int C,
                                size_t n) {
  ZINF_ATT_LOOP(idx, n) {
    size_t btc;
    QkvOffset(idx, T, NH, hs, C, &btc);
    out[btc] = vacc[idx];
  }
}

// dvacc [B,NH,T,hs] <- dout [B,T,C]
__global__ void UnpermuteBackwardKernel(float* dvacc, const float* dout, int T, int NH, int hs,
                                        int C, size_t n) {
  ZINF_ATT_LOOP(idx, n) {
    size_t btc;
    QkvOffset(idx, T, NH, hs, C, &btc);
    dvacc[idx] = dout[btc];
  }
}

// In place on att [rows = B*NH*T, T]: row r (position t = r % T) becomes
// softmax(scale * x[0..t]) and zeros after t. One warp per row.
__global__ void CausalSoftmaxKernel(float* att, float scale, size_t rows, int T) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* x = att + row * T;
  float maxval = -INFINITY;
  for (int i = lane; i <= t; i += kWarp) maxval = fmaxf(maxval, scale * x[i]);
  maxval = WarpMax(maxval);
  float sum = 0.0f;
  for (int i = lane; i <= t; i += kWarp) sum += expf(scale * x[i] - maxval);
  const float inv = 1.0f / WarpSum(sum);
  for (int i = lane; i < T; i += kWarp) x[i] = i <= t ? expf(scale * x[i] - maxval) * inv : 0.0f;
}

// In place on datt: dpreatt[j] = scale * att[j] * (datt[j] - Σ_{i<=t} att[i]·datt[i]) for
// j <= t, 0 after. One warp per row.
__global__ void CausalSoftmaxBackwardKernel(float* datt, const float* att, float scale,
                                            size_t rows, int T) {
  const size_t row = static_cast<size_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* d = datt + row * T;
  const float* a = att + row * T;
  float dot = 0.0f;
  for (int i = lane; i <= t; i += kWarp) dot += a[i] * d[i];
  dot = WarpSum(dot);
  for (int i = lane; i < T; i += kWarp) d[i] = i <= t ? scale * a[i] * (d[i] - dot) : 0.0f;
}

Status CheckShape(const char* op, int B, int T, int C, int NH, Dims* dims) {
  if (B < 0 || T < 0 || C < 0 || NH <= 0 || C % NH != 0) {
    return InvalidArgument(std::string(op) + ": bad shape B=" + std::to_string(B) + " seq=" +
                           std::to_string(T) + " C=" + std::to_string(C) + " NH=" +
                           std::to_string(NH) + " (need sizes >= 0, NH > 0, C % NH == 0)");
  }
  *dims = Dims{B, T, C, NH, C / NH};
  return Status::Ok();
}

unsigned RowGrid(size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

size_t AttentionForwardScratchElems(int B, int seq, int C, int NH) {
  return 3 * static_cast<size_t>(B) * seq * C;
}

size_t AttentionBackwardScratchElems(int B, int seq, int C, int NH) {
  return 6 * static_cast<size_t>(B) * seq * C + static_cast<size_t>(B) * NH * seq * seq;
}

Status AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B, int seq,
                        int C, int NH, CublasHandle& cublas, void* stream) {
  constexpr const char* kOp = "AttentionForward";
  Dims d{};
  ZINF_RETURN_IF_ERROR(CheckShape(kOp, B, seq, C, NH, &d));
  const size_t n = d.Elems();
  if (n == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  float* q = scratch;
  float* k = q + n;
  float* v = k + n;
  float* vacc = q;  // q is dead once att = q·kᵀ is computed
  const long long head = static_cast<long long>(d.T) * d.hs;
  const long long square = static_cast<long long>(d.T) * d.T;
  const int heads = d.B * d.NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));

  PermuteKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(q, k, v, qkv, d.T, d.NH, d.hs, C, n);
  ZINF_RETURN_IF_ERROR(LaunchStatus(kOp));
  CublasHandle::Impl& impl = cublas.impl();
  std::lock_guard<std::mutex> lock(impl.mutex);
  ZINF_RETURN_IF_ERROR(BindStream(impl, s, kOp));
  // att = q·kᵀ (unscaled; the softmax applies the scale)
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, true, false, d.T, d.T, d.hs, k, d.hs, head, q, d.hs, head,
                            0.0f, att, d.T, square, heads));
  CausalSoftmaxKernel<<<RowGrid(d.AttElems() / d.T), kThreads, 0, s>>>(
      att, scale, d.AttElems() / d.T, d.T);
  ZINF_RETURN_IF_ERROR(LaunchStatus(kOp));
  // vacc = att·v
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, false, d.hs, d.T, d.T, v, d.hs, head, att, d.T,
                            square, 0.0f, vacc, d.hs, head, heads));
  UnpermuteKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(out, vacc, d.T, d.NH, d.hs, C, n);
  return LaunchStatus(kOp);
}

Status AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int B, int seq, int C, int NH, CublasHandle& cublas,
                         void* stream) {
  constexpr const char* kOp = "AttentionBackward";
  Dims d{};
  ZINF_RETURN_IF_ERROR(CheckShape(kOp, B, seq, C, NH, &d));
  const size_t n = d.Elems();
  if (n == 0) return Status::Ok();
  cudaStream_t s = AsStream(stream);
  float* q = scratch;
  float* k = q + n;
  float* v = k + n;
  float* dvacc = v + n;
  float* dq = dvacc;  // dvacc is dead once datt and dv are computed
  float* dk = dvacc + n;
  float* dv = dk + n;
  float* datt = dv + n;
  const long long head = static_cast<long long>(d.T) * d.hs;
  const long long square = static_cast<long long>(d.T) * d.T;
  const int heads = d.B * d.NH;
  const size_t rows = d.AttElems() / d.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.hs));

  PermuteKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(q, k, v, qkv, d.T, d.NH, d.hs, C, n);
  UnpermuteBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(dvacc, dout, d.T, d.NH,
                                                                    d.hs, C, n);
  ZINF_RETURN_IF_ERROR(LaunchStatus(kOp));
  CublasHandle::Impl& impl = cublas.impl();
  std::lock_guard<std::mutex> lock(impl.mutex);
  ZINF_RETURN_IF_ERROR(BindStream(impl, s, kOp));
  // datt = dvacc·vᵀ
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, true, false, d.T, d.T, d.hs, v, d.hs, head, dvacc, d.hs,
                            head, 0.0f, datt, d.T, square, heads));
  // dv = attᵀ·dvacc
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, true, d.hs, d.T, d.T, dvacc, d.hs, head, att, d.T,
                            square, 0.0f, dv, d.hs, head, heads));
  CausalSoftmaxBackwardKernel<<<RowGrid(rows), kThreads, 0, s>>>(datt, att, scale, rows, d.T);
  ZINF_RETURN_IF_ERROR(LaunchStatus(kOp));
  // dq = dpreatt·k; dk = dpreattᵀ·q
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, false, d.hs, d.T, d.T, k, d.hs, head, datt, d.T,
                            square, 0.0f, dq, d.hs, head, heads));
  ZINF_RETURN_IF_ERROR(Gemm(impl, kOp, false, true, d.hs, d.T, d.T, q, d.hs, head, datt, d.T,
                            square, 0.0f, dk, d.hs, head, heads));
  PermuteBackwardKernel<<<GridFor(n, kThreads), kThreads, 0, s>>>(dqkv, dq, dk, dv, d.T, d.NH,
                                                                  d.hs, C, n);
  return LaunchStatus(kOp);
}

}  // namespace zinf::kernels::cuda
