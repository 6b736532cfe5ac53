// kernels/cpu/llama_ops.h — the CPU ops of a Llama-family decoder layer (Hugging Face's
// LlamaForCausalLM, Mistral, Qwen2) that GPT-2's ops (layer_ops.h) do not cover, forward and
// backward: RMSNorm, rotary position embeddings, SwiGLU's gate, and causal attention with
// grouped key/value heads (GPT-2's attention is its case KV = H).
//
// Contract. The conventions of layer_ops.h hold: plain functions on host memory templated on T
// (float for training, double for the gradient checks), row-major, N = B*seq rows; every
// *Backward ACCUMULATES (+=) into its gradient outputs except RopeBackward, which rotates the
// gradient in place (documented there); results are bit-identical for every thread count; each
// op runs on a oneTBB arena of OpOptions::threads workers.
//
// The arithmetic is Hugging Face's (transformers/models/llama/modeling_llama.py):
// - RMSNorm: out = (x · rsqrt(mean(x²) + eps)) · weight; no mean, no bias.
// - RoPE: head_dim d, inv_freq[i] = 1 / theta^(2i/d) (i < d/2), angle = pos · inv_freq[i], and
//   x' = x·cos + rotate_half(x)·sin with rotate_half(x) = (−x[d/2:], x[:d/2]): element i is paired
//   with element i + d/2 (halves, not interleaved pairs), both rotated by angle i. Llama 3.1's
//   `rope_scaling` of type "llama3" rescales inv_freq by wavelength (RopeScaling below).
// - Attention: q has H heads, k and v have KV heads (H % KV == 0); query head h reads key/value
//   head h / (H/KV) (HF's repeat_kv). Scale 1/sqrt(d), causal, softmax in T.
// - SwiGLU: out = silu(gate) · up, silu(g) = g / (1 + e^−g).
//
// Layouts. A layer's q, k and v come from one GEMM, so each row of `qkv` is
// [q: H·d | k: KV·d | v: KV·d] (head j of each part at j·d within it); the attention's output
// is [B, seq, H·d]. The MLP's gate and up also come from one GEMM: each row of `gu` is
// [gate: I | up: I].
//
// Thread-safety: reentrant; concurrent calls on disjoint buffers are fine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/op_options.h"
#include "zinf/status.h"

namespace zinf::kernels::cpu {

// ---------------------------------------------------------------- token embedding

// out[r, :] = wte[tokens[r], :] for N rows of C (Llama has no learned positions).
template <typename T>
void TokenEmbeddingForward(T* out, const int32_t* tokens, const T* wte, int N, int C,
                           const OpOptions& o = {});
// dwte[tokens[r], :] += dout[r, :], rows added in increasing order (chunks of channels).
template <typename T>
void TokenEmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int N, int C,
                            const OpOptions& o = {});

// ---------------------------------------------------------------- RMSNorm

// Per row of C: rstd = 1/sqrt(mean(x²) + eps), out = (x · rstd) · weight. rstd: N values,
// saved for backward.
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, double eps,
                    const OpOptions& o = {});
// dinp += ∂/∂inp, dweight += Σ_rows (x · rstd) · dout (nullable; rows added in increasing order).
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int N, int C, const OpOptions& o = {});

// ---------------------------------------------------------------- rotary position embeddings

// HF's rope_scaling. kind "default" (none) or "llama3" (Llama 3.1: factor, low_freq_factor,
// high_freq_factor, original_max_position_embeddings); other kinds are refused by RopeInvFreq.
struct RopeScaling {
  std::string kind = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
};

// The head_dim/2 inverse frequencies, in float32 as HF computes them (its inv_freq buffer is
// float32): InvalidArgument for an odd or non-positive head_dim, a theta that is not positive,
// or an unknown scaling kind (named).
Result<std::vector<float>> RopeInvFreq(int head_dim, double theta, const RopeScaling& scaling);

// cos and sin tables for positions 0..seq-1: [seq, d/2] each, cos[t, i] = cos(float(t) ·
// inv_freq[i]) with the angle rounded to float32 as HF's float32 product is.
template <typename T>
void RopeTables(T* cos, T* sin, const std::vector<float>& inv_freq, int seq);

// Rotates the q and k heads of qkv ([B, seq, (H + 2·KV)·d], v untouched) in place.
template <typename T>
void RopeForward(T* qkv, const T* cos, const T* sin, int B, int seq, int H, int KV, int d,
                 const OpOptions& o = {});
// The transpose: turns ∂loss/∂(rotated q, k) in dqkv into ∂loss/∂(q, k) in place (the rotation
// is linear, so it needs no saved input). Call it once on the finished gradient (after
// CausalAttentionBackward's accumulation), before the GEMM's backward reads it.
template <typename T>
void RopeBackward(T* dqkv, const T* cos, const T* sin, int B, int seq, int H, int KV, int d,
                  const OpOptions& o = {});

// ---------------------------------------------------------------- attention

// Causal attention over qkv [B, seq, (H + 2·KV)·d] (q, k rotated already); out: [B, seq, H·d];
// att: [B, H, seq, seq], the softmax probabilities (zero above the diagonal), saved for backward.
// Positions above the diagonal are never computed.
template <typename T>
void CausalAttentionForward(T* out, T* att, const T* qkv, int B, int seq, int H, int KV, int d,
                            const OpOptions& o = {});
// dqkv += ∂loss/∂qkv given dout. scratch: CausalAttentionScratchElems(B, seq, KV) elements of T
// (one row of ∂loss/∂att per task), contents on entry irrelevant. One task per (batch, key/value
// head) walks that head's query heads in increasing order, so the dk, dv sums have a fixed order.
size_t CausalAttentionScratchElems(int B, int seq, int KV);
template <typename T>
void CausalAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                             int B, int seq, int H, int KV, int d, const OpOptions& o = {});

// ---------------------------------------------------------------- SwiGLU

// gu: [N, 2·I] (gate then up); out: [N, I] = silu(gate) · up.
template <typename T>
void SwiGluForward(T* out, const T* gu, int N, int I, const OpOptions& o = {});
// dgu += ∂loss/∂gu given dout.
template <typename T>
void SwiGluBackward(T* dgu, const T* dout, const T* gu, int N, int I, const OpOptions& o = {});

}  // namespace zinf::kernels::cpu
