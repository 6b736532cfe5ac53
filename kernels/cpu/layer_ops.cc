// kernels/cpu/layer_ops.cc — llm.c's (train_gpt2.c) CPU ops of a GPT-2 block; see layer_ops.h.
//
// Parallel structure (every split depends on the shapes only, never on the thread count):
// - row ops (encoder, layernorm, cross-entropy): chunks of whole rows, each row done by one task;
// - reductions over rows (dbias, LayerNorm dweight/dbias, dwte/dwpe): chunks of channels, each
//   walking all rows in increasing order, so every sum is llm.c's sequential one;
// - attention: llama_ops.cc's causal attention (GPT-2's is its case of as many key/value heads
//   as query heads);
// - elementwise ops: fixed element chunks.
// Short reductions inside a row use kLanes independent partial sums (fixed order) so the
// compiler can vectorize them without -ffast-math.
#include "kernels/cpu/layer_ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/llama_ops.h"
#include "kernels/cpu/op_helpers.h"
#include "kernels/cpu/parallel.h"

namespace zinf::kernels::cpu {
namespace {

using detail::CombineLanes;
using detail::ForChunks;
using detail::ForRows;
using detail::kChannelChunk;
using detail::kElemChunk;
using detail::kLanes;
using detail::Sum;

// Σ (x[i] - m)².
template <typename T>
T SumSqDev(const T* x, T m, int n) {
  T acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const T d = x[i + j] - m;
      acc[j] += d * d;
    }
  for (int j = 0; i < n; ++i, ++j) {
    const T d = x[i] - m;
    acc[j] += d * d;
  }
  return CombineLanes(acc);
}

void BlasGemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda,
              const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void BlasGemm(bool ta, bool tb, int m, int n, int k, double alpha, const double* a, int lda,
              const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
              n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// OpenBLAS runs single-threaded in the caller from the first GEMM on (see layer_ops.h).
void UseSingleThreadedBlas() {
  static const bool done = [] {
    openblas_set_num_threads(1);
    return true;
  }();
  (void)done;
}

// A GEMM below this many multiply-adds is one call (splitting costs more than it gains).
constexpr double kSplitGemmMacs = 1 << 20;
// Blocks per split GEMM (shape-independent count, so block edges depend on shapes only), and
// the block edge's granularity (OpenBLAS's sgemm micro-tiles are 16 x 4 to 16 x 8).
constexpr int kGemmBlocks = 8;
constexpr int kGemmBlockAlign = 16;

// Row-major C[m,n] = alpha·op(A)·op(B) + beta·C, as blocks of C's rows (or of its columns when
// n > m) run on the oneTBB arena, each block one single-threaded OpenBLAS call. A block's edges
// depend on (m, n, k) only, and every element of C is computed by one block with the whole k
// sum, so the bits do not depend on the thread count.
template <typename T>
void Gemm(bool ta, bool tb, int m, int n, int k, T alpha, const T* a, int lda, const T* b, int ldb,
          T beta, T* c, int ldc, const OpOptions& o) {
  UseSingleThreadedBlas();
  const bool split_rows = m >= n;
  const int extent = split_rows ? m : n;
  const int block = std::max(kGemmBlockAlign, (extent + kGemmBlocks * kGemmBlockAlign - 1) /
                                                  (kGemmBlocks * kGemmBlockAlign) *
                                                  kGemmBlockAlign);
  if (double(m) * n * k < kSplitGemmMacs || block >= extent) {
    BlasGemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  ForChunks(size_t(extent), size_t(block), o, [&](size_t begin, size_t end) {
    const int i0 = int(begin), len = int(end - begin);
    if (split_rows) {
      // Rows i0.. of op(A): row i0 of A, or column i0 of a transposed A.
      const T* a_blk = ta ? a + i0 : a + size_t(i0) * lda;
      BlasGemm(ta, tb, len, n, k, alpha, a_blk, lda, b, ldb, beta, c + size_t(i0) * ldc, ldc);
    } else {
      // Columns i0.. of op(B): column i0 of B, or row i0 of a transposed B.
      const T* b_blk = tb ? b + size_t(i0) * ldb : b + i0;
      BlasGemm(ta, tb, m, len, k, alpha, a, lda, b_blk, ldb, beta, c + i0, ldc);
    }
  });
}

// dst[c] += Σ_rows src[r, c] for rows in increasing order; src: (rows, cols).
template <typename T>
void AddColumnSums(T* dst, const T* src, size_t rows, size_t cols, const OpOptions& o) {
  ForChunks(cols, kChannelChunk, o, [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < rows; ++r) {
      const T* row = src + r * cols;
      for (size_t c = c0; c < c1; ++c) dst[c] += row[c];
    }
  });
}

template <typename T>
constexpr T kGeluScale = T(0.79788456080286535588);  // sqrt(2/pi)

}  // namespace


template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int seq,
                    int C, const OpOptions& o) {
  ForRows(size_t(B) * seq, C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      T* out_r = out + r * C;
      const T* wte_r = wte + size_t(tokens[r]) * C;
      const T* wpe_r = wpe + (r % seq) * C;
      for (int i = 0; i < C; ++i) out_r[i] = wte_r[i] + wpe_r[i];
    }
  });
}

template <typename T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int seq,
                     int C, const OpOptions& o) {
  const size_t n = size_t(B) * seq;
  ForChunks(C, kChannelChunk, o, [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < n; ++r) {
      const T* d = dout + r * C;
      T* dwte_r = dwte + size_t(tokens[r]) * C;
      T* dwpe_r = dwpe + (r % seq) * C;
      for (size_t i = c0; i < c1; ++i) {
        dwte_r[i] += d[i];
        dwpe_r[i] += d[i];
      }
    }
  });
}

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int N, int C, const OpOptions& o) {
  const T eps = T(1e-5);
  ForRows(N, C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* x = inp + r * C;
      const T m = Sum(x, C) / T(C);
      const T v = SumSqDev(x, m, C) / T(C);
      const T s = T(1) / std::sqrt(v + eps);
      T* out_r = out + r * C;
      for (int i = 0; i < C; ++i) out_r[i] = (s * (x[i] - m)) * weight[i] + bias[i];
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                       const T* weight, const T* mean, const T* rstd, int N, int C,
                       const OpOptions& o) {
  // dinp, per row: two reductions over the row, then the elementwise update.
  ForRows(N, C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T m = mean[r], s = rstd[r];
      T acc_mean[kLanes] = {}, acc_norm[kLanes] = {};
      int i = 0;
      for (; i + kLanes <= C; i += kLanes)
        for (int j = 0; j < kLanes; ++j) {
          const T dnorm = weight[i + j] * d[i + j];
          acc_mean[j] += dnorm;
          acc_norm[j] += dnorm * ((x[i + j] - m) * s);
        }
      for (int j = 0; i < C; ++i, ++j) {
        const T dnorm = weight[i] * d[i];
        acc_mean[j] += dnorm;
        acc_norm[j] += dnorm * ((x[i] - m) * s);
      }
      const T dnorm_mean = CombineLanes(acc_mean) / T(C);
      const T dnorm_norm_mean = CombineLanes(acc_norm) / T(C);
      T* dx = dinp + r * C;
      for (int k = 0; k < C; ++k) {
        const T norm = (x[k] - m) * s;
        dx[k] += (weight[k] * d[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  });
  if (dweight == nullptr && dbias == nullptr) return;
  // dweight, dbias: split by channel, rows added in increasing order.
  ForChunks(C, kChannelChunk, o, [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < size_t(N); ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T m = mean[r], s = rstd[r];
      if (dbias != nullptr)
        for (size_t i = c0; i < c1; ++i) dbias[i] += d[i];
      if (dweight != nullptr)
        for (size_t i = c0; i < c1; ++i) dweight[i] += ((x[i] - m) * s) * d[i];
    }
  });
}

template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                   const OpOptions& o) {
  if (N <= 0 || OC <= 0) return;
  if (bias != nullptr) {
    ForRows(N, OC, o, [&](size_t r0, size_t r1) {
      for (size_t r = r0; r < r1; ++r) std::copy(bias, bias + OC, out + r * OC);
    });
  } else if (C <= 0) {
    std::fill(out, out + size_t(N) * OC, T(0));
  }
  if (C <= 0) return;
  Gemm(false, true, N, OC, C, T(1), inp, C, weight, C, bias != nullptr ? T(1) : T(0), out, OC, o);
}

template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int C, int OC, const OpOptions& o) {
  if (N <= 0 || OC <= 0) return;
  if (C > 0) {
    if (dinp != nullptr) Gemm(false, false, N, C, OC, T(1), dout, OC, weight, C, T(1), dinp, C, o);
    if (dweight != nullptr)
      Gemm(true, false, OC, C, N, T(1), dout, OC, inp, C, T(1), dweight, C, o);
  }
  if (dbias != nullptr) AddColumnSums(dbias, dout, N, OC, o);
}

// GPT-2's attention is the grouped-query one with as many key/value heads as query heads.
size_t AttentionBackwardScratchElems(int B, int seq, int C, int NH) {
  return CausalAttentionScratchElems(B, seq, NH);
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int seq, int C, int NH,
                      const OpOptions& o) {
  CausalAttentionForward(out, att, qkv, B, seq, NH, NH, C / NH, o);
}

template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B,
                       int seq, int C, int NH, const OpOptions& o) {
  CausalAttentionBackward(dqkv, scratch, dout, qkv, att, B, seq, NH, NH, C / NH, o);
}

// GELU through 0.5·(1 + tanh y) = σ(2y) = 1 / (1 + e^{-2y}): the same function as llm.c's, with
// one exp instead of tanh (and cosh in the backward), ~3x faster, and no cancellation in 1 + tanh.
template <typename T>
void GeluForward(T* out, const T* inp, size_t n, const OpOptions& o) {
  ForChunks(n, kElemChunk, o, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const T x = inp[i];
      const T y = kGeluScale<T> * (x + T(0.044715) * x * x * x);
      out[i] = x / (T(1) + std::exp(T(-2) * y));
    }
  });
}

// d/dx = 0.5·(1 + tanh y) + 0.5·x·sech²(y)·y', with 0.5·(1 + tanh y) = s = σ(2y) and
// sech²(y) = 4·s·(1 - s), e = e^{-2y}; 1 - s computed as 1 / (1 + 1/e), which has no
// cancellation near s = 1 and no branch. llm.c's 1/cosh² form is the same value.
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, const OpOptions& o) {
  ForChunks(n, kElemChunk, o, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) {
      const T x = inp[i];
      const T y = kGeluScale<T> * (x + T(0.044715) * x * x * x);
      const T e = std::exp(T(-2) * y);
      const T s = T(1) / (T(1) + e);
      const T one_minus_s = T(1) / (T(1) + T(1) / e);  // = e·s; exact at e = 0 and e = inf
      const T half_sech2 = T(2) * s * one_minus_s;
      // Zero in the saturated tails, where x² may overflow (0·inf).
      const T local_grad =
          half_sech2 == T(0)
              ? s
              : s + x * half_sech2 * kGeluScale<T> * (T(1) + T(3 * 0.044715) * x * x);
      dinp[i] += local_grad * dout[i];
    }
  });
}

template <typename T>
void ResidualForward(T* out, const T* a, const T* b, size_t n, const OpOptions& o) {
  ForChunks(n, kElemChunk, o, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

template <typename T>
void AddInPlace(T* dst, const T* src, size_t n, const OpOptions& o) {
  ForChunks(n, kElemChunk, o, [&](size_t i0, size_t i1) {
    for (size_t i = i0; i < i1; ++i) dst[i] += src[i];
  });
}

template <typename T>
void CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                         int V, const OpOptions& o) {
  ForRows(N, V, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* l = logits + r * V;
      T* pr = probs + r * V;  // may be l
      T maxval = -std::numeric_limits<T>::infinity();
      for (int v = 0; v < V; ++v) maxval = std::max(maxval, l[v]);
      const T target_shifted = l[targets[r]] - maxval;  // read before l is overwritten
      T sum = 0;
      for (int v = 0; v < V; ++v) {
        const T e = std::exp(l[v] - maxval);
        pr[v] = e;
        sum += e;
      }
      const T inv = T(1) / sum;
      for (int v = 0; v < V; ++v) pr[v] *= inv;
      losses[r] = std::log(sum) - target_shifted;
    }
  });
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, const T* dloss,
                          int N, int V, const OpOptions& o) {
  ForRows(N, V, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* pr = probs + r * V;
      T* dl = dlogits + r * V;
      const T g = dloss[r];
      const int t = targets[r];
      for (int v = 0; v < V; ++v) dl[v] += (pr[v] - (v == t ? T(1) : T(0))) * g;
    }
  });
}

#define ZINF_LAYER_OPS_INSTANTIATE(T)                                                         \
  template void EncoderForward<T>(T*, const int32_t*, const T*, const T*, int, int, int,       \
                                  const OpOptions&);                                           \
  template void EncoderBackward<T>(T*, T*, const T*, const int32_t*, int, int, int,            \
                                   const OpOptions&);                                          \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int, int,        \
                                    const OpOptions&);                                         \
  template void LayerNormBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,       \
                                     const T*, int, int, const OpOptions&);                    \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int, int, int,              \
                                 const OpOptions&);                                            \
  template void MatmulBackward<T>(T*, T*, T*, const T*, const T*, const T*, int, int, int,     \
                                  const OpOptions&);                                           \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int, const OpOptions&);   \
  template void AttentionBackward<T>(T*, T*, const T*, const T*, const T*, int, int, int, int, \
                                     const OpOptions&);                                        \
  template void GeluForward<T>(T*, const T*, size_t, const OpOptions&);                        \
  template void GeluBackward<T>(T*, const T*, const T*, size_t, const OpOptions&);             \
  template void ResidualForward<T>(T*, const T*, const T*, size_t, const OpOptions&);          \
  template void AddInPlace<T>(T*, const T*, size_t, const OpOptions&);                         \
  template void CrossEntropyForward<T>(T*, T*, const T*, const int32_t*, int, int,             \
                                       const OpOptions&);                                      \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, const T*, int, int,      \
                                        const OpOptions&);

ZINF_LAYER_OPS_INSTANTIATE(float)
ZINF_LAYER_OPS_INSTANTIATE(double)
#undef ZINF_LAYER_OPS_INSTANTIATE

}  // namespace zinf::kernels::cpu
