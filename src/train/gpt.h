// src/train/gpt.h — the GPT-2 model, cut into units, written once against the Backend seam.
//
// Contract. The architecture is GPT-2 as nanoGPT and llm.c have it: learned token and position
// embeddings, L pre-LayerNorm blocks with biases (causal self-attention, GELU-tanh MLP of width
// 4C), a final LayerNorm and an LM head tied to the token embedding. It is cut into units, the
// tier manager's unit of paging:
//   unit 0        "embedding": wte (V, C), wpe (seq, C)
//   unit 1 .. L   "block{i}":  ln_1 w,b (C) | c_attn w (3C, C), b (3C) | attn c_proj w (C, C),
//                              b (C) | ln_2 w,b (C) | c_fc w (4C, C), b (4C) |
//                              mlp c_proj w (C, 4C), b (C)        — in this order
//   unit L + 1    "final":     ln_f w, b (C); the head uses the embedding unit's wte.
// A unit's tensors are flattened, in the order above, into one contiguous array (one shard).
// UnitTensors() names them as nanoGPT's state_dict does ("transformer.h.3.attn.c_attn.weight"),
// which is also how --init/--save name them in safetensors.
//
// The per-unit functions (EmbeddingForward, BlockForward, ...) are the whole model code; the
// layer executor (executor.h) calls them with weights paged in by the tier manager and the
// reference driver ResidentForwardBackward (model.h, for tests) with every weight in memory. Both give
// the same arithmetic. Forward outputs overwrite; gradient outputs ACCUMULATE (zero them first).
//
// Init (GPT-2's): every weight matrix and both embeddings ~ N(0, 0.02²); the two residual
// projections (attn c_proj, mlp c_proj) ~ N(0, (0.02/sqrt(2L))²); biases 0; LayerNorm weights 1.
// Draws come from a counter-based generator keyed by (seed, unit, element index), so the result
// depends on nothing else (not the thread count, not the platform's <random>).
//
// Thread-safety: the functions are reentrant; a Backend is used by one thread at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/train/backend.h"
#include "src/train/unit_layout.h"
#include "zinf/status.h"

namespace zinf::train {

struct GptDims {
  int L = 0;    // blocks
  int C = 0;    // channels
  int NH = 0;   // heads (C % NH == 0)
  int V = 0;    // vocabulary
  int seq = 0;  // maximum sequence length (rows of wpe)

  static GptDims FromConfig(const ModelConfig& m);
  uint32_t units() const { return static_cast<uint32_t>(L) + 2; }
  uint32_t final_unit() const { return static_cast<uint32_t>(L) + 1; }
  uint64_t UnitParams(uint32_t unit) const;
  uint64_t MaxUnitParams() const;
  uint64_t TotalParams() const;
  std::string UnitName(uint32_t unit) const;  // "embedding", "block3", "final"
};

std::vector<TensorInfo> UnitTensors(const GptDims& d, uint32_t unit);

// Writes the unit's initial weights (GPT-2 init, see above) into out (UnitParams elements).
void InitUnit(const GptDims& d, uint32_t unit, uint64_t seed, float* out);

template <typename T>
struct EmbeddingView {
  T* wte;  // (V, C)
  T* wpe;  // (seq, C)
};
template <typename T>
struct BlockView {
  T *ln1w, *ln1b;          // (C)
  T *qkvw, *qkvb;          // (3C, C), (3C)
  T *attprojw, *attprojb;  // (C, C), (C)
  T *ln2w, *ln2b;          // (C)
  T *fcw, *fcb;            // (4C, C), (4C)
  T *fcprojw, *fcprojb;    // (C, 4C), (C)
};
template <typename T>
struct FinalView {
  T *lnfw, *lnfb;  // (C)
};
template <typename T> EmbeddingView<T> ViewEmbedding(T* base, const GptDims& d);
template <typename T> BlockView<T> ViewBlock(T* base, const GptDims& d);
template <typename T> FinalView<T> ViewFinal(T* base, const GptDims& d);

// What one block's forward leaves for its backward (recomputed per block in backward), for B
// sequences of `seq` tokens (N = B*seq rows).
template <typename T>
struct BlockActs {
  T *ln1, *ln1_mean, *ln1_rstd;  // (N, C), (N), (N)
  T* qkv;                        // (N, 3C)
  T* atty;                       // (N, C)
  T* att;                        // (B, NH, seq, seq)
  T* attproj;                    // (N, C)
  T* res2;                       // (N, C)
  T *ln2, *ln2_mean, *ln2_rstd;  // (N, C), (N), (N)
  T* fch;                        // (N, 4C)
  T* fch_gelu;                   // (N, 4C)
  T* fcproj;                     // (N, C)
};
uint64_t BlockActsElems(const GptDims& d, int B, int seq);
template <typename T> BlockActs<T> ViewBlockActs(T* base, const GptDims& d, int B, int seq);

// Scratch of one block's forward and backward (its contents on entry are irrelevant);
// attention_scratch: Backend::AttentionScratchElems.
uint64_t BlockGradScratchElems(const GptDims& d, int B, int seq, uint64_t attention_scratch);

// The head's buffers: final LayerNorm, logits (then probabilities) and their gradient.
template <typename T>
struct HeadActs {
  T *lnf, *lnf_mean, *lnf_rstd;  // (N, C), (N), (N)
  T* probs;                      // (N, V) logits, then softmax probabilities in place
  T* dlogits;                    // (N, V)
  T* losses;                     // (N)
  T* dlnf;                       // (N, C)
};
uint64_t HeadActsElems(const GptDims& d, int B, int seq);
template <typename T> HeadActs<T> ViewHeadActs(T* base, const GptDims& d, int B, int seq);

// x0 (N, C) = wte[tokens] + wpe.
template <typename T>
Status EmbeddingForward(Backend<T>& be, const GptDims& d, const EmbeddingView<const T>& w,
                        const int32_t* tokens, T* x0, int B, int seq);
template <typename T>
Status EmbeddingBackward(Backend<T>& be, const GptDims& d, const EmbeddingView<T>& dw,
                         const int32_t* tokens, const T* dx0, int B, int seq);

// out (N, C) = block(x (N, C)); acts filled for the backward. scratch: the block scratch of
// BlockGradScratchElems (the forward uses its attention part).
template <typename T>
Status BlockForward(Backend<T>& be, const GptDims& d, const BlockView<const T>& w, const T* x,
                    T* out, const BlockActs<T>& acts, T* scratch, int B, int seq);
// dres (N, C) holds ∂loss/∂out on entry and ∂loss/∂x on return; dw accumulates. acts must be
// those of BlockForward on the same x and w.
template <typename T>
Status BlockBackward(Backend<T>& be, const GptDims& d, const BlockView<const T>& w,
                     const BlockView<T>& dw, const T* x, const BlockActs<T>& acts, T* dres,
                     T* scratch, int B, int seq);

// Final LayerNorm, the tied head and the cross-entropy: fills h.losses (N) (and h.probs).
template <typename T>
Status HeadForward(Backend<T>& be, const GptDims& d, const FinalView<const T>& w,
                   const T* wte, const T* xL, const int32_t* targets, const HeadActs<T>& h,
                   int B, int seq);
// Backward of the mean loss times loss_scale: dw and dwte accumulate; dxL (N, C) is
// overwritten with ∂(loss_scale · mean loss)/∂xL.
template <typename T>
Status HeadBackward(Backend<T>& be, const GptDims& d, const FinalView<const T>& w,
                    const FinalView<T>& dw, const T* wte, T* dwte, const T* xL,
                    const int32_t* targets, const HeadActs<T>& h, T* dxL, T loss_scale, int B,
                    int seq);

}  // namespace zinf::train
