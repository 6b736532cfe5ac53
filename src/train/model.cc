#include "src/train/model.h"

#include <algorithm>

#include <fmt/format.h>

namespace zinf::train {

Result<Model> Model::FromConfig(const ModelConfig& m) {
  if (!m.is_llama()) return Model(GptDims::FromConfig(m));
  if (m.heads == 0 || (m.head_dim == 0 && m.width % m.heads != 0)) {
    return InvalidArgument(fmt::format("zinf.model.width: {} is not divisible by heads {}",
                                       m.width, m.heads));
  }
  const RopeScalingConfig& r = m.rope_scaling;
  const model::ModelShape shape{
      .arch = model::Arch::kLlama,
      .layers = static_cast<int>(m.layers),
      .hidden = static_cast<int>(m.width),
      .heads = static_cast<int>(m.heads),
      .kv_heads = static_cast<int>(m.KvHeads()),
      .head_dim = static_cast<int>(m.HeadDim()),
      .intermediate = static_cast<int>(m.Intermediate()),
      .vocab = static_cast<int>(m.vocab),
      .max_positions = static_cast<int>(m.seq_len),
      .norm_eps = m.norm_eps,
      .rope_theta = m.rope_theta,
      .rope_scaling = {.kind = r.type,
                       .factor = r.factor,
                       .low_freq_factor = r.low_freq_factor,
                       .high_freq_factor = r.high_freq_factor,
                       .original_max_position_embeddings = r.original_max_position_embeddings},
      .tie_word_embeddings = m.tie_embeddings,
      .qkv_bias = m.qkv_bias,
      .o_bias = m.o_bias,
      .mlp_bias = m.mlp_bias,
      .sliding_window = static_cast<int>(m.sliding_window)};
  auto d = llama::Dims::Make(shape, static_cast<int>(m.seq_len));
  if (!d.ok()) return d.status().WithContext("zinf.model");
  return Model(std::move(*d));
}

ModelConfig ModelConfigOf(const model::ModelShape& s, uint32_t seq_len) {
  ModelConfig m;
  m.arch = std::string(model::ArchName(s.arch));
  m.layers = static_cast<uint32_t>(s.layers);
  m.width = static_cast<uint32_t>(s.hidden);
  m.heads = static_cast<uint32_t>(s.heads);
  m.vocab = static_cast<uint32_t>(s.vocab);
  m.seq_len = s.arch == model::Arch::kGpt2 ? static_cast<uint32_t>(s.max_positions) : seq_len;
  if (s.arch == model::Arch::kGpt2) return m;
  m.kv_heads = static_cast<uint32_t>(s.kv_heads);
  m.intermediate = static_cast<uint32_t>(s.intermediate);
  m.norm_eps = s.norm_eps;
  m.rope_theta = s.rope_theta;
  m.tie_embeddings = s.tie_word_embeddings;
  m.head_dim = static_cast<uint32_t>(s.head_dim);
  m.qkv_bias = s.qkv_bias;
  m.o_bias = s.o_bias;
  m.mlp_bias = s.mlp_bias;
  const kernels::cpu::RopeScaling& r = s.rope_scaling;
  m.rope_scaling = {.type = r.kind,
                    .factor = r.factor,
                    .low_freq_factor = r.low_freq_factor,
                    .high_freq_factor = r.high_freq_factor,
                    .original_max_position_embeddings = r.original_max_position_embeddings};
  m.sliding_window = static_cast<uint32_t>(s.sliding_window);
  return m;
}

int Model::layers() const { return is_gpt() ? gpt().L : llama().L(); }
int Model::width() const { return is_gpt() ? gpt().C : llama().C(); }
int Model::vocab() const { return is_gpt() ? gpt().V : llama().V(); }
int Model::seq() const { return is_gpt() ? gpt().seq : llama().seq; }

uint64_t Model::UnitParams(uint32_t unit) const {
  return is_gpt() ? gpt().UnitParams(unit) : llama().UnitParams(unit);
}

uint64_t Model::MaxUnitParams() const {
  uint64_t m = std::max(UnitParams(0), UnitParams(final_unit()));
  return layers() > 0 ? std::max(m, UnitParams(1)) : m;
}

uint64_t Model::TotalParams() const {
  uint64_t n = 0;
  for (uint32_t u = 0; u < units(); ++u) n += UnitParams(u);
  return n;
}

std::string Model::UnitName(uint32_t unit) const {
  return is_gpt() ? gpt().UnitName(unit) : llama().UnitName(unit);
}

std::vector<TensorInfo> Model::UnitTensors(uint32_t unit) const {
  return is_gpt() ? train::UnitTensors(gpt(), unit) : llama::UnitTensors(llama(), unit);
}

void Model::InitUnit(uint32_t unit, uint64_t seed, float* out) const {
  if (is_gpt()) {
    train::InitUnit(gpt(), unit, seed, out);
  } else {
    llama::InitUnit(llama(), unit, seed, out);
  }
}

std::string Model::Describe() const {
  if (is_gpt()) {
    const GptDims& d = gpt();
    return fmt::format("{} layers, width {}, {} heads, seq {}, vocab {}", d.L, d.C, d.NH, d.seq,
                       d.V);
  }
  const model::ModelShape& s = llama().shape;
  return fmt::format("llama: {} layers, width {}, {} heads ({} key/value, head_dim {}), MLP {}, "
                     "seq {}, vocab {}, {} head",
                     s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate,
                     llama().seq, s.vocab, s.tie_word_embeddings ? "tied" : "untied");
}

uint64_t Model::LayerActsElems(int B, int seq) const {
  return is_gpt() ? BlockActsElems(gpt(), B, seq) : llama::LayerActsElems(llama(), B, seq);
}

template <typename T>
uint64_t Model::LayerScratchElems(const Backend<T>& be, int B, int seq) const {
  if (is_gpt()) {
    const GptDims& d = gpt();
    return BlockGradScratchElems(d, B, seq, be.AttentionScratchElems(B, seq, d.C, d.NH));
  }
  const model::ModelShape& s = llama().shape;
  return llama::LayerScratchElems(
      llama(), B, seq, be.CausalAttentionScratchElems(B, seq, s.heads, s.kv_heads, s.head_dim));
}

uint64_t Model::HeadActsElems(int B, int seq) const {
  return is_gpt() ? train::HeadActsElems(gpt(), B, seq) : llama::HeadActsElems(llama(), B, seq);
}

template <typename T>
T* Model::HeadLosses(T* head, int B, int seq) const {
  return is_gpt() ? ViewHeadActs(head, gpt(), B, seq).losses
                  : llama::ViewHeadActs(head, llama(), B, seq).losses;
}

template <typename T>
Status Model::EmbeddingForward(Backend<T>& be, const T* w, const int32_t* tokens, T* x0, int B,
                               int seq) const {
  if (is_gpt()) {
    return train::EmbeddingForward(be, gpt(), ViewEmbedding(w, gpt()), tokens, x0, B, seq);
  }
  return llama::EmbeddingForward(be, llama(), w, tokens, x0, B, seq);
}

template <typename T>
Status Model::EmbeddingBackward(Backend<T>& be, T* dw, const int32_t* tokens, const T* dx0,
                                int B, int seq) const {
  if (is_gpt()) {
    return train::EmbeddingBackward(be, gpt(), ViewEmbedding(dw, gpt()), tokens, dx0, B, seq);
  }
  return llama::EmbeddingBackward(be, llama(), dw, tokens, dx0, B, seq);
}

template <typename T>
Status Model::LayerForward(Backend<T>& be, const T* w, const T* x, T* out, T* acts, T* scratch,
                           int B, int seq) const {
  if (is_gpt()) {
    return BlockForward(be, gpt(), ViewBlock(w, gpt()), x, out, ViewBlockActs(acts, gpt(), B, seq),
                        scratch, B, seq);
  }
  return llama::LayerForward(be, llama(), llama::ViewLayer(w, llama()), x, out,
                             llama::ViewLayerActs(acts, llama(), B, seq), scratch, B, seq);
}

template <typename T>
Status Model::LayerBackward(Backend<T>& be, const T* w, T* dw, const T* x, T* acts, T* dres,
                            T* scratch, int B, int seq) const {
  if (is_gpt()) {
    return BlockBackward(be, gpt(), ViewBlock(w, gpt()), ViewBlock(dw, gpt()), x,
                         ViewBlockActs(acts, gpt(), B, seq), dres, scratch, B, seq);
  }
  return llama::LayerBackward(be, llama(), llama::ViewLayer(w, llama()),
                              llama::ViewLayer(dw, llama()), x,
                              llama::ViewLayerActs(acts, llama(), B, seq), dres, scratch, B, seq);
}

template <typename T>
Status Model::HeadForward(Backend<T>& be, const T* w_final, const T* w_embedding, const T* xL,
                          const int32_t* targets, T* head, int B, int seq) const {
  if (is_gpt()) {
    return train::HeadForward(be, gpt(), ViewFinal(w_final, gpt()),
                              ViewEmbedding(w_embedding, gpt()).wte, xL, targets,
                              ViewHeadActs(head, gpt(), B, seq), B, seq);
  }
  return llama::HeadForward(be, llama(), llama::ViewFinal(w_final, llama()), w_embedding, xL,
                            targets, llama::ViewHeadActs(head, llama(), B, seq), B, seq);
}

template <typename T>
Status Model::HeadBackward(Backend<T>& be, const T* w_final, T* dw_final, const T* w_embedding,
                           T* dw_embedding, const T* xL, const int32_t* targets, T* head, T* dxL,
                           T loss_scale, int B, int seq) const {
  if (is_gpt()) {
    return train::HeadBackward(be, gpt(), ViewFinal(w_final, gpt()), ViewFinal(dw_final, gpt()),
                               ViewEmbedding(w_embedding, gpt()).wte,
                               ViewEmbedding(dw_embedding, gpt()).wte, xL, targets,
                               ViewHeadActs(head, gpt(), B, seq), dxL, loss_scale, B, seq);
  }
  return llama::HeadBackward(be, llama(), llama::ViewFinal(w_final, llama()),
                             llama::ViewFinal(dw_final, llama()), w_embedding, dw_embedding, xL,
                             targets, llama::ViewHeadActs(head, llama(), B, seq), dxL, loss_scale,
                             B, seq);
}

template <typename T>
Result<double> ResidentForwardBackward(Backend<T>& be, const Model& m,
                                       const std::vector<const T*>& params,
                                       const std::vector<T*>& grads, const int32_t* tokens,
                                       const int32_t* targets, int B, int seq, T loss_scale) {
  if (params.size() != m.units() || grads.size() != m.units()) {
    return InvalidArgument(fmt::format("expected {} units of params and grads", m.units()));
  }
  const int L = m.layers();
  const uint32_t fin = m.final_unit();
  const uint64_t NC = static_cast<uint64_t>(B) * seq * m.width();
  std::vector<T> xs(NC * (L + 1));  // the input of each layer, and the final one
  std::vector<T> acts(m.LayerActsElems(B, seq));
  std::vector<T> head(m.HeadActsElems(B, seq));
  std::vector<T> dres(NC);
  std::vector<T> scratch(m.LayerScratchElems(be, B, seq));
  auto x = [&](int l) { return xs.data() + NC * l; };

  ZINF_RETURN_IF_ERROR(m.EmbeddingForward(be, params[0], tokens, x(0), B, seq));
  for (int l = 0; l < L; ++l) {
    ZINF_RETURN_IF_ERROR(
        m.LayerForward(be, params[l + 1], x(l), x(l + 1), acts.data(), scratch.data(), B, seq));
  }
  ZINF_RETURN_IF_ERROR(
      m.HeadForward(be, params[fin], params[0], x(L), targets, head.data(), B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  const T* losses = m.HeadLosses(head.data(), B, seq);
  double loss = 0;
  for (int i = 0; i < B * seq; ++i) loss += static_cast<double>(losses[i]);
  loss /= B * seq;

  ZINF_RETURN_IF_ERROR(m.HeadBackward(be, params[fin], grads[fin], params[0], grads[0], x(L),
                                      targets, head.data(), dres.data(), loss_scale, B, seq));
  for (int l = L - 1; l >= 0; --l) {
    // Recompute the layer's activations from its input, then its backward.
    ZINF_RETURN_IF_ERROR(
        m.LayerForward(be, params[l + 1], x(l), x(l + 1), acts.data(), scratch.data(), B, seq));
    ZINF_RETURN_IF_ERROR(m.LayerBackward(be, params[l + 1], grads[l + 1], x(l), acts.data(),
                                         dres.data(), scratch.data(), B, seq));
  }
  ZINF_RETURN_IF_ERROR(m.EmbeddingBackward(be, grads[0], tokens, dres.data(), B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  return loss;
}

#define ZINF_MODEL_INSTANTIATE(T)                                                                \
  template uint64_t Model::LayerScratchElems(const Backend<T>&, int, int) const;                 \
  template T* Model::HeadLosses(T*, int, int) const;                                             \
  template Status Model::EmbeddingForward(Backend<T>&, const T*, const int32_t*, T*, int, int)   \
      const;                                                                                     \
  template Status Model::EmbeddingBackward(Backend<T>&, T*, const int32_t*, const T*, int, int)  \
      const;                                                                                     \
  template Status Model::LayerForward(Backend<T>&, const T*, const T*, T*, T*, T*, int, int)     \
      const;                                                                                     \
  template Status Model::LayerBackward(Backend<T>&, const T*, T*, const T*, T*, T*, T*, int,     \
                                       int) const;                                               \
  template Status Model::HeadForward(Backend<T>&, const T*, const T*, const T*, const int32_t*,  \
                                     T*, int, int) const;                                        \
  template Status Model::HeadBackward(Backend<T>&, const T*, T*, const T*, T*, const T*,         \
                                      const int32_t*, T*, T*, T, int, int) const;                \
  template Result<double> ResidentForwardBackward(                                               \
      Backend<T>&, const Model&, const std::vector<const T*>&, const std::vector<T*>&,           \
      const int32_t*, const int32_t*, int, int, T);

ZINF_MODEL_INSTANTIATE(float)
ZINF_MODEL_INSTANTIATE(double)
#undef ZINF_MODEL_INSTANTIATE

}  // namespace zinf::train
