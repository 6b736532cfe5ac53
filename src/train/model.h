// src/train/model.h — the model seam: one decoder-only family (GPT-2, gpt.h; the Llama family,
// llama.h) behind the interface the layer executor, the checkpoints and the tests use.
//
// Contract. Every model is cut the same way: unit 0 the token embedding, units 1..L the decoder
// layers (all of one size), unit L + 1 the final norm (with an untied head). The executor pages
// units, holds the embedding's weights through the step (a tied head reads them) and calls, per
// micro-batch: EmbeddingForward, LayerForward for each layer, HeadForward; then HeadBackward,
// for each layer from the last LayerForward (recompute) and LayerBackward, EmbeddingBackward.
// The buffers it passes are sized by LayerActsElems, LayerScratchElems and HeadActsElems
// (elements of T); the weights and gradients are a unit's one contiguous array, laid out as
// UnitTensors says. Forward outputs overwrite, gradients accumulate; HeadBackward overwrites
// dxL and accumulates into the embedding's gradient when the head is tied. The arithmetic and
// layouts are those of the family's file.
//
// Thread-safety: a Model is an immutable value; its compute calls are reentrant (a Backend is
// used by one thread at a time).
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "src/config/config.h"
#include "src/model/model_shape.h"
#include "src/train/backend.h"
#include "src/train/gpt.h"
#include "src/train/llama.h"
#include "zinf/status.h"

namespace zinf::train {

class Model {
 public:
  Model() = default;                       // an empty GPT-2 shape, to assign to
  Model(const GptDims& d) : dims_(d) {}  // NOLINT: a GPT-2 shape is a model
  explicit Model(llama::Dims d) : dims_(std::move(d)) {}
  // `zinf.model`: arch "gpt2" (layers, width, heads, vocab, seq_len) or "llama" (those and
  // the family's keys: kv_heads, intermediate, head_dim, norm_eps, rope_theta, rope_scaling,
  // tie_embeddings, the biases, sliding_window); InvalidArgument naming what no model of that
  // family can have.
  static Result<Model> FromConfig(const ModelConfig& m);

  model::Arch arch() const { return is_gpt() ? model::Arch::kGpt2 : model::Arch::kLlama; }
  bool is_gpt() const { return std::holds_alternative<GptDims>(dims_); }
  const GptDims& gpt() const { return std::get<GptDims>(dims_); }       // GPT-2 only
  const llama::Dims& llama() const { return std::get<llama::Dims>(dims_); }  // Llama only

  int layers() const;
  int width() const;  // the residual stream's C
  int vocab() const;
  int seq() const;    // the training sequence length (GPT-2: its positions)
  uint32_t units() const { return static_cast<uint32_t>(layers()) + 2; }
  uint32_t final_unit() const { return static_cast<uint32_t>(layers()) + 1; }
  uint64_t UnitParams(uint32_t unit) const;
  uint64_t MaxUnitParams() const;
  uint64_t TotalParams() const;
  std::string UnitName(uint32_t unit) const;
  std::vector<TensorInfo> UnitTensors(uint32_t unit) const;
  void InitUnit(uint32_t unit, uint64_t seed, float* out) const;
  // For logs: "4 layers, width 128, 4 heads, seq 128, vocab 256" (GPT-2); Llama's begins
  // "llama:" and adds its key/value heads, head_dim, MLP width and whether the head is tied.
  std::string Describe() const;

  uint64_t LayerActsElems(int B, int seq) const;
  template <typename T>
  uint64_t LayerScratchElems(const Backend<T>& be, int B, int seq) const;
  uint64_t HeadActsElems(int B, int seq) const;
  // Where HeadForward leaves the N per-row losses within the head buffer.
  template <typename T>
  T* HeadLosses(T* head, int B, int seq) const;

  template <typename T>
  Status EmbeddingForward(Backend<T>& be, const T* w, const int32_t* tokens, T* x0, int B,
                          int seq) const;
  template <typename T>
  Status EmbeddingBackward(Backend<T>& be, T* dw, const int32_t* tokens, const T* dx0, int B,
                           int seq) const;
  template <typename T>
  Status LayerForward(Backend<T>& be, const T* w, const T* x, T* out, T* acts, T* scratch, int B,
                      int seq) const;
  template <typename T>
  Status LayerBackward(Backend<T>& be, const T* w, T* dw, const T* x, T* acts, T* dres,
                       T* scratch, int B, int seq) const;
  template <typename T>
  Status HeadForward(Backend<T>& be, const T* w_final, const T* w_embedding, const T* xL,
                     const int32_t* targets, T* head, int B, int seq) const;
  template <typename T>
  Status HeadBackward(Backend<T>& be, const T* w_final, T* dw_final, const T* w_embedding,
                      T* dw_embedding, const T* xL, const int32_t* targets, T* head, T* dxL,
                      T loss_scale, int B, int seq) const;

 private:
  std::variant<GptDims, llama::Dims> dims_;
};

// zinf.model for a shape (a preset, a Hugging Face config.json): every key the shape sets.
// seq_len: GPT-2's is its number of positions; a Llama's is the training length given (its
// max_position_embeddings bounds nothing zinf computes).
ModelConfig ModelConfigOf(const model::ModelShape& shape, uint32_t seq_len);

// The whole model with every weight in memory (tests and references), the executor's sequence
// of calls without the paging: params[u] and grads[u] are the units' arrays (grads accumulate).
// Returns the mean loss; the gradients are those of loss_scale times it. Buffers come from
// std::vector (host memory), so only for a CPU backend (or one reading host memory).
template <typename T>
Result<double> ResidentForwardBackward(Backend<T>& be, const Model& m,
                                       const std::vector<const T*>& params,
                                       const std::vector<T*>& grads, const int32_t* tokens,
                                       const int32_t* targets, int B, int seq, T loss_scale);

}  // namespace zinf::train
