// kernels/cpu/layer_ops.h — the CPU ops of a GPT-2 decoder block, forward and backward.
//
// Contract. Plain functions on host memory, templated on the element type T (float for training,
// double for the gradient checks), explicitly instantiated for both in layer_ops.cc. The layouts
// and the arithmetic are llm.c's (train_gpt2.c), which is what nanoGPT computes:
//   B batch, T sequence length (`seq` below), C channels, NH heads (C % NH == 0), V vocabulary,
//   N = B*seq rows, OC output channels. Row-major everywhere. A linear layer's weight is [OC, C]
//   (PyTorch's nn.Linear layout): out = inp · weightᵀ + bias.
// - Every *Backward ACCUMULATES (+=) into its gradient outputs (dinp, dweight, dbias, dqkv, ...),
//   as llm.c does, so a caller zeroes them once and several uses add up (the residual stream,
//   the tied embedding). Forward outputs are overwritten.
// - Results are deterministic: the same inputs give the same bits on every run and for every
//   thread count (no reduction whose order depends on scheduling).
// - Every op runs on a oneTBB arena of `threads` workers (0 = every core; kernels/cpu/parallel.h).
//   Work is split into chunks whose boundaries depend on the shapes only, and every output
//   element is computed by one chunk in a fixed order. Sums over rows (dbias, dweight of
//   LayerNorm, dwte/dwpe) are split by channel and add rows in increasing order, as llm.c's
//   loops do.
// - GEMMs (MatmulForward/Backward) are split into blocks of the output's rows (or columns),
//   each one single-threaded OpenBLAS call (cblas_sgemm / cblas_dgemm) on that arena. On the
//   first GEMM zinf sets OpenBLAS to one thread for the whole process
//   (openblas_set_num_threads(1)): Debian's libopenblas is the pthread build, whose own pool
//   busy-waits (sched_yield) for a while after each GEMM; in training next to the I/O and
//   optimizer threads on 2 cores that spinning took ~20% of the CPU, and a second pool beside
//   oneTBB's oversubscribes the cores anyway. A program embedding zinf that wants OpenBLAS
//   threads for its own GEMMs sets them back after zinf's last GEMM. All GEMMs are fp32
//   (sgemm) or fp64: Debian's OpenBLAS 0.3.21 is built without BFLOAT16 (libopenblas exports
//   no cblas_sbgemm, though cblas.h declares it), so there is no CPU bf16 GEMM to use.
// - LayerNorm eps is 1e-5 (nanoGPT). GELU is the tanh approximation. Attention is causal with
//   scale 1/sqrt(C/NH). CrossEntropy is softmax over V then -log p[target].
// - Null gradient pointers mean "not needed" where the comment says nullable.
// - Pointers given as inputs never alias outputs unless stated.
//
// The global gradient norm's fixed-order sum of squares is in kernels/cpu/grad_ops.h.
//
// Thread-safety: reentrant; concurrent calls on disjoint buffers are fine.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/op_options.h"

namespace zinf::kernels::cpu {

// Tunables shared by the ops.

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  tokens: N int32 in [0, V) (checked by the caller).
template <typename T>
void EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int seq,
                    int C, const OpOptions& o = {});
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. Deterministic order.
template <typename T>
void EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int seq,
                     int C, const OpOptions& o = {});

// Per row of C: mean, rstd = 1/sqrt(var + 1e-5) (biased variance), out = (x-mean)*rstd*w + b.
// mean, rstd: N values each (saved for backward). In LayerNormBackward dweight and dbias are
// nullable.
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                      int N, int C, const OpOptions& o = {});
template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                       const T* weight, const T* mean, const T* rstd, int N, int C,
                       const OpOptions& o = {});

// out[N,OC] = inp[N,C] · weight[OC,C]ᵀ + bias[OC] (bias nullable).
template <typename T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                   const OpOptions& o = {});
// dinp[N,C] += dout·weight; dweight[OC,C] += doutᵀ·inp; dbias[OC] += Σ_rows dout.
// dinp, dweight and dbias nullable.
template <typename T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int C, int OC, const OpOptions& o = {});

// qkv: [B, seq, 3C] (q, k, v concatenated along channels, head h at channels h*hs..h*hs+hs of
// each part, hs = C/NH). out: [B, seq, C]. att: [B, NH, seq, seq], the softmax probabilities
// (zero above the diagonal), saved for backward.
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int B, int seq, int C, int NH,
                      const OpOptions& o = {});
// dqkv += ∂loss/∂qkv given dout. scratch: AttentionBackwardScratchElems(...) elements of T
// (B*NH*seq: one row of ∂loss/∂att per head), contents on entry irrelevant. The softmax's
// backward uses the O(seq²) form datt_pre = att ⊙ (datt − Σ att·datt), not llm.c's O(seq³) loop.
size_t AttentionBackwardScratchElems(int B, int seq, int C, int NH);
template <typename T>
void AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B,
                       int seq, int C, int NH, const OpOptions& o = {});

// GELU, tanh approximation: 0.5x(1 + tanh(√(2/π)(x + 0.044715x³))), evaluated as x·σ(2y) with
// y the tanh's argument (the same function; one exp, no cancellation). out may alias inp, dinp
// may alias dout.
template <typename T>
void GeluForward(T* out, const T* inp, size_t n, const OpOptions& o = {});
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n, const OpOptions& o = {});

// out = a + b (out may alias a or b).
template <typename T>
void ResidualForward(T* out, const T* a, const T* b, size_t n, const OpOptions& o = {});
// dst += src.
template <typename T>
void AddInPlace(T* dst, const T* src, size_t n, const OpOptions& o = {});

// Softmax cross-entropy. logits: [N, V]; targets: N int32 in [0, V). probs: [N, V] (may alias
// logits: computed in place). losses[i] = -log probs[i, targets[i]], computed as
// log Σ exp(logit - max) - (logit[target] - max) so it stays finite when the fp32 prob underflows.
template <typename T>
void CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                         int V, const OpOptions& o = {});
// dlogits[i,:] += dloss[i] * (probs[i,:] - onehot(targets[i])). dloss: N values (for a mean
// loss scaled by S: S / N each).
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, const T* dloss,
                          int N, int V, const OpOptions& o = {});

}  // namespace zinf::kernels::cpu
