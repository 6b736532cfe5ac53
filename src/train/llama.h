// src/train/llama.h — the Llama-family model (Hugging Face's LlamaForCausalLM, Mistral, Qwen2),
// cut into units, written once against the Backend seam like gpt.h.
//
// Contract. The arithmetic is HF's (kernels/cpu/llama_ops.h says how each op follows
// modeling_llama.py): pre-RMSNorm decoder layers with rotary positions, grouped-query causal
// attention and a SwiGLU MLP, a final RMSNorm and an LM head, tied to the token embedding or
// not. Units, the tier manager's unit of paging, and their tensors in the order they sit in the
// unit's one contiguous array (HF's names, as a safetensors checkpoint names them):
//   unit 0       "embedding": model.embed_tokens.weight (V, C)
//   unit 1 .. L  "layer{i}":  model.layers.{i}.input_layernorm.weight (C) |
//                             self_attn.{q,k,v}_proj.weight (H·d, C), (KV·d, C), (KV·d, C) |
//                             self_attn.{q,k,v}_proj.bias (with qkv_bias) |
//                             self_attn.o_proj.weight (C, H·d) | self_attn.o_proj.bias (o_bias) |
//                             post_attention_layernorm.weight (C) |
//                             mlp.{gate,up}_proj.weight (I, C) each | mlp.{gate,up}_proj.bias
//                             (mlp_bias) | mlp.down_proj.weight (C, I) | mlp.down_proj.bias
//   unit L + 1   "final":     model.norm.weight (C) | lm_head.weight (V, C) unless tied
// q, k and v (weights, and biases) are adjacent so that one GEMM computes the [q | k | v] rows
// RoPE and the attention take; gate and up likewise for the [gate | up] rows SwiGLU takes.
//
// Init (HF's _init_weights with initializer_range 0.02): every Linear and the embedding
// ~ N(0, 0.02²), biases 0, RMSNorm weights 1; the draws come from the same counter-based
// generator as GPT-2's (gpt.h), keyed by (seed, unit, element index).
//
// The per-unit functions mirror gpt.h's: forward outputs overwrite, gradients ACCUMULATE (zero
// them first); a layer's backward takes the acts of its forward on the same input and weights
// (the executor recomputes the forward just before). The rotary tables live in the layer
// scratch and are rebuilt by every layer forward and backward (seq·d values; no state).
//
// Thread-safety: the functions are reentrant; a Backend is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/model/model_shape.h"
#include "src/train/backend.h"
#include "src/train/unit_layout.h"
#include "zinf/status.h"

namespace zinf::train::llama {

struct Dims {
  model::ModelShape shape;     // arch kLlama, Check()ed
  int seq = 0;                 // the training sequence length
  std::vector<float> inv_freq; // RopeInvFreq(head_dim, rope_theta, rope_scaling)

  // InvalidArgument when the shape is not a consistent Llama shape or seq is not one it can
  // attend over (a Mistral sliding window shorter than seq).
  static Result<Dims> Make(const model::ModelShape& shape, int seq);

  int L() const { return shape.layers; }
  int C() const { return shape.hidden; }
  int V() const { return shape.vocab; }
  int Q() const { return shape.heads * shape.head_dim; }       // q's width
  int K() const { return shape.kv_heads * shape.head_dim; }    // k's (and v's) width
  int W() const { return Q() + 2 * K(); }                      // a [q | k | v] row
  int I() const { return shape.intermediate; }
  uint32_t units() const { return static_cast<uint32_t>(L()) + 2; }
  uint32_t final_unit() const { return static_cast<uint32_t>(L()) + 1; }
  uint64_t UnitParams(uint32_t unit) const;
  std::string UnitName(uint32_t unit) const;  // "embedding", "layer3", "final"
};

std::vector<TensorInfo> UnitTensors(const Dims& d, uint32_t unit);
void InitUnit(const Dims& d, uint32_t unit, uint64_t seed, float* out);

template <typename T>
struct LayerView {
  T* ln1w;         // (C)
  T *qkvw, *qkvb;  // (W, C), (W) or null
  T *ow, *ob;      // (C, Q), (C) or null
  T* ln2w;         // (C)
  T *guw, *gub;    // (2I, C), (2I) or null
  T *downw, *downb;  // (C, I), (C) or null
};
template <typename T>
struct FinalView {
  T* normw;  // (C)
  T* head;   // (V, C), or null when tied (the head is then the embedding)
};
template <typename T> LayerView<T> ViewLayer(T* base, const Dims& d);
template <typename T> FinalView<T> ViewFinal(T* base, const Dims& d);

// What a layer's forward leaves for its backward, for N = B·seq rows.
template <typename T>
struct LayerActs {
  T *ln1, *rstd1;  // (N, C), (N)
  T* qkv;          // (N, W), q and k rotated
  T* atty;         // (N, Q)
  T* att;          // (B, H, seq, seq)
  T* res2;         // (N, C) x + o_proj(atty)
  T *ln2, *rstd2;  // (N, C), (N)
  T* gu;           // (N, 2I)
  T* h;            // (N, I) silu(gate)·up
  T* mlp;          // (N, C) down(h)
};
uint64_t LayerActsElems(const Dims& d, int B, int seq);
template <typename T> LayerActs<T> ViewLayerActs(T* base, const Dims& d, int B, int seq);
// Scratch of one layer's forward and backward; attention_scratch:
// Backend::CausalAttentionScratchElems.
uint64_t LayerScratchElems(const Dims& d, int B, int seq, uint64_t attention_scratch);

template <typename T>
struct HeadActs {
  T *lnf, *rstd;  // (N, C), (N)
  T* probs;       // (N, V) logits, then probabilities in place
  T* dlogits;     // (N, V)
  T* losses;      // (N)
  T* dlnf;        // (N, C)
};
uint64_t HeadActsElems(const Dims& d, int B, int seq);
template <typename T> HeadActs<T> ViewHeadActs(T* base, const Dims& d, int B, int seq);

// x0 (N, C) = embed_tokens[tokens].
template <typename T>
Status EmbeddingForward(Backend<T>& be, const Dims& d, const T* wte, const int32_t* tokens,
                        T* x0, int B, int seq);
template <typename T>
Status EmbeddingBackward(Backend<T>& be, const Dims& d, T* dwte, const int32_t* tokens,
                         const T* dx0, int B, int seq);

template <typename T>
Status LayerForward(Backend<T>& be, const Dims& d, const LayerView<const T>& w, const T* x,
                    T* out, const LayerActs<T>& acts, T* scratch, int B, int seq);
// dres holds ∂loss/∂out on entry and ∂loss/∂x on return; dw accumulates.
template <typename T>
Status LayerBackward(Backend<T>& be, const Dims& d, const LayerView<const T>& w,
                     const LayerView<T>& dw, const T* x, const LayerActs<T>& acts, T* dres,
                     T* scratch, int B, int seq);

// Final RMSNorm, the head (w.head, or wte when tied) and the cross-entropy: fills h.losses.
template <typename T>
Status HeadForward(Backend<T>& be, const Dims& d, const FinalView<const T>& w, const T* wte,
                   const T* xL, const int32_t* targets, const HeadActs<T>& h, int B, int seq);
// Backward of loss_scale · mean loss: dw (and dwte when tied) accumulate; dxL is overwritten.
template <typename T>
Status HeadBackward(Backend<T>& be, const Dims& d, const FinalView<const T>& w,
                    const FinalView<T>& dw, const T* wte, T* dwte, const T* xL,
                    const int32_t* targets, const HeadActs<T>& h, T* dxL, T loss_scale, int B,
                    int seq);

}  // namespace zinf::train::llama
