#include "src/train/gpt.h"

#include <cmath>

#include <fmt/format.h>

#include "kernels/cpu/parallel.h"
#include "src/train/unit_layout.h"

namespace zinf::train {

GptDims GptDims::FromConfig(const ModelConfig& m) {
  return {.L = static_cast<int>(m.layers), .C = static_cast<int>(m.width),
          .NH = static_cast<int>(m.heads), .V = static_cast<int>(m.vocab),
          .seq = static_cast<int>(m.seq_len)};
}

uint64_t GptDims::UnitParams(uint32_t unit) const {
  const uint64_t c = static_cast<uint64_t>(C);
  if (unit == 0) return (static_cast<uint64_t>(V) + static_cast<uint64_t>(seq)) * c;
  if (unit == final_unit()) return 2 * c;
  return 12 * c * c + 13 * c;
}

uint64_t GptDims::MaxUnitParams() const {
  uint64_t m = std::max(UnitParams(0), UnitParams(final_unit()));
  return L > 0 ? std::max(m, UnitParams(1)) : m;
}

uint64_t GptDims::TotalParams() const {
  uint64_t n = 0;
  for (uint32_t u = 0; u < units(); ++u) n += UnitParams(u);
  return n;
}

std::string GptDims::UnitName(uint32_t unit) const {
  if (unit == 0) return "embedding";
  if (unit == final_unit()) return "final";
  return fmt::format("block{}", unit - 1);
}

std::vector<TensorInfo> UnitTensors(const GptDims& d, uint32_t unit) {
  const int64_t C = d.C;
  TensorListBuilder t;
  auto add = [&t](std::string name, std::vector<int64_t> shape) {
    t.Add(std::move(name), std::move(shape));
  };
  if (unit == 0) {
    add("transformer.wte.weight", {d.V, C});
    add("transformer.wpe.weight", {d.seq, C});
  } else if (unit == d.final_unit()) {
    add("transformer.ln_f.weight", {C});
    add("transformer.ln_f.bias", {C});
  } else {
    const std::string p = fmt::format("transformer.h.{}.", unit - 1);
    add(p + "ln_1.weight", {C});
    add(p + "ln_1.bias", {C});
    add(p + "attn.c_attn.weight", {3 * C, C});
    add(p + "attn.c_attn.bias", {3 * C});
    add(p + "attn.c_proj.weight", {C, C});
    add(p + "attn.c_proj.bias", {C});
    add(p + "ln_2.weight", {C});
    add(p + "ln_2.bias", {C});
    add(p + "mlp.c_fc.weight", {4 * C, C});
    add(p + "mlp.c_fc.bias", {4 * C});
    add(p + "mlp.c_proj.weight", {C, 4 * C});
    add(p + "mlp.c_proj.bias", {C});
  }
  return t.Take();
}

void InitUnit(const GptDims& d, uint32_t unit, uint64_t seed, float* out) {
  const uint64_t key = UnitKey(seed, unit);
  const double proj_std = 0.02 / std::sqrt(2.0 * d.L);
  for (const TensorInfo& t : UnitTensors(d, unit)) {
    const bool is_bias = t.name.ends_with(".bias");
    const bool is_ln = t.name.find("ln_") != std::string::npos;
    float* p = out + t.offset;
    if (is_ln && !is_bias) {
      std::fill(p, p + t.elems, 1.0f);
    } else if (is_bias) {
      std::fill(p, p + t.elems, 0.0f);
    } else {
      const double stdev = t.name.ends_with("c_proj.weight") ? proj_std : 0.02;
      kernels::ParallelForChunks(t.elems, {}, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          p[i] = static_cast<float>(stdev * InitNormal(key, t.offset + i));
        }
      });
    }
  }
}

template <typename T>
EmbeddingView<T> ViewEmbedding(T* base, const GptDims& d) {
  return {base, base + static_cast<uint64_t>(d.V) * d.C};
}

template <typename T>
BlockView<T> ViewBlock(T* base, const GptDims& d) {
  const uint64_t C = d.C;
  BlockView<T> v;
  Carver<T> c(base);
  v.ln1w = c.Take(C);
  v.ln1b = c.Take(C);
  v.qkvw = c.Take(3 * C * C);
  v.qkvb = c.Take(3 * C);
  v.attprojw = c.Take(C * C);
  v.attprojb = c.Take(C);
  v.ln2w = c.Take(C);
  v.ln2b = c.Take(C);
  v.fcw = c.Take(4 * C * C);
  v.fcb = c.Take(4 * C);
  v.fcprojw = c.Take(4 * C * C);
  v.fcprojb = c.Take(C);
  return v;
}

template <typename T>
FinalView<T> ViewFinal(T* base, const GptDims& d) {
  return {base, base + d.C};
}

uint64_t BlockActsElems(const GptDims& d, int B, int seq) {
  const uint64_t N = static_cast<uint64_t>(B) * seq, C = d.C;
  return N * C * 7 + N * 4 + N * 3 * C + N * 8 * C +
         static_cast<uint64_t>(B) * d.NH * seq * seq;
}

template <typename T>
BlockActs<T> ViewBlockActs(T* base, const GptDims& d, int B, int seq) {
  const uint64_t N = static_cast<uint64_t>(B) * seq, C = d.C;
  BlockActs<T> a;
  Carver<T> c(base);
  a.ln1 = c.Take(N * C);
  a.ln1_mean = c.Take(N);
  a.ln1_rstd = c.Take(N);
  a.qkv = c.Take(N * 3 * C);
  a.atty = c.Take(N * C);
  a.att = c.Take(static_cast<uint64_t>(B) * d.NH * seq * seq);
  a.attproj = c.Take(N * C);
  a.res2 = c.Take(N * C);
  a.ln2 = c.Take(N * C);
  a.ln2_mean = c.Take(N);
  a.ln2_rstd = c.Take(N);
  a.fch = c.Take(N * 4 * C);
  a.fch_gelu = c.Take(N * 4 * C);
  a.fcproj = c.Take(N * C);
  return a;
}

// Backward scratch: dfch_gelu, dfch (N, 4C), dln (N, C), datty (N, C), dqkv (N, 3C), then the
// attention's own scratch.
uint64_t BlockGradScratchElems(const GptDims& d, int B, int seq, uint64_t attention_scratch) {
  const uint64_t N = static_cast<uint64_t>(B) * seq, C = d.C;
  return N * C * (4 + 4 + 1 + 1 + 3) + attention_scratch;
}

uint64_t HeadActsElems(const GptDims& d, int B, int seq) {
  const uint64_t N = static_cast<uint64_t>(B) * seq, C = d.C, V = d.V;
  return N * C * 2 + N * 3 + N * V * 2;
}

template <typename T>
HeadActs<T> ViewHeadActs(T* base, const GptDims& d, int B, int seq) {
  const uint64_t N = static_cast<uint64_t>(B) * seq, C = d.C, V = d.V;
  HeadActs<T> h;
  Carver<T> c(base);
  h.lnf = c.Take(N * C);
  h.lnf_mean = c.Take(N);
  h.lnf_rstd = c.Take(N);
  h.probs = c.Take(N * V);
  h.dlogits = c.Take(N * V);
  h.losses = c.Take(N);
  h.dlnf = c.Take(N * C);
  return h;
}

template <typename T>
Status EmbeddingForward(Backend<T>& be, const GptDims& d, const EmbeddingView<const T>& w,
                        const int32_t* tokens, T* x0, int B, int seq) {
  return be.EncoderForward(x0, tokens, w.wte, w.wpe, B, seq, d.C);
}

template <typename T>
Status EmbeddingBackward(Backend<T>& be, const GptDims& d, const EmbeddingView<T>& dw,
                         const int32_t* tokens, const T* dx0, int B, int seq) {
  return be.EncoderBackward(dw.wte, dw.wpe, dx0, tokens, B, seq, d.C);
}

template <typename T>
Status BlockForward(Backend<T>& be, const GptDims& d, const BlockView<const T>& w, const T* x,
                    T* out, const BlockActs<T>& a, T* scratch, int B, int seq) {
  const int N = B * seq, C = d.C;
  const size_t NC = static_cast<size_t>(N) * C;
  T* att_scratch = scratch + 13 * NC;  // where BlockBackward keeps the attention's scratch
  ZINF_RETURN_IF_ERROR(be.LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1w, w.ln1b, N, C));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, 3 * C));
  ZINF_RETURN_IF_ERROR(be.AttentionForward(a.atty, a.att, att_scratch, a.qkv, B, seq, C, d.NH));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.attproj, a.atty, w.attprojw, w.attprojb, N, C, C));
  ZINF_RETURN_IF_ERROR(be.ResidualForward(a.res2, x, a.attproj, NC));
  ZINF_RETURN_IF_ERROR(be.LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2w, w.ln2b, N, C));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.fch, a.ln2, w.fcw, w.fcb, N, C, 4 * C));
  ZINF_RETURN_IF_ERROR(be.GeluForward(a.fch_gelu, a.fch, NC * 4));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.fcproj, a.fch_gelu, w.fcprojw, w.fcprojb, N, 4 * C, C));
  return be.ResidualForward(out, a.res2, a.fcproj, NC);
}

template <typename T>
Status BlockBackward(Backend<T>& be, const GptDims& d, const BlockView<const T>& w,
                     const BlockView<T>& dw, const T* x, const BlockActs<T>& a, T* dres,
                     T* scratch, int B, int seq) {
  const int N = B * seq, C = d.C;
  const size_t NC = static_cast<size_t>(N) * C;
  T* dfch_gelu = scratch;          // (N, 4C)
  T* dfch = dfch_gelu + 4 * NC;    // (N, 4C)
  T* dln = dfch + 4 * NC;          // (N, C): dln2, then dln1
  T* datty = dln + NC;             // (N, C)
  T* dqkv = datty + NC;            // (N, 3C)
  T* att_scratch = dqkv + 3 * NC;  // the backend's attention scratch
  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))); dres is ∂/∂out, and the residual path
  // passes it to res2 unchanged, so dres becomes ∂/∂res2 by accumulating the MLP branch.
  ZINF_RETURN_IF_ERROR(be.Zero(dfch_gelu, 4 * NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(dfch_gelu, dw.fcprojw, dw.fcprojb, dres, a.fch_gelu,
                                         w.fcprojw, N, 4 * C, C));
  ZINF_RETURN_IF_ERROR(be.Zero(dfch, 4 * NC));
  ZINF_RETURN_IF_ERROR(be.GeluBackward(dfch, a.fch, dfch_gelu, 4 * NC));
  ZINF_RETURN_IF_ERROR(be.Zero(dln, NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(dln, dw.fcw, dw.fcb, dfch, a.ln2, w.fcw, N, C, 4 * C));
  ZINF_RETURN_IF_ERROR(be.LayerNormBackward(dres, dw.ln2w, dw.ln2b, dln, a.res2, w.ln2w,
                                            a.ln2_mean, a.ln2_rstd, N, C));
  // Attention: res2 = x + attproj(attn(qkv(ln1(x)))); dres becomes ∂/∂x the same way.
  ZINF_RETURN_IF_ERROR(be.Zero(datty, NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(datty, dw.attprojw, dw.attprojb, dres, a.atty,
                                         w.attprojw, N, C, C));
  ZINF_RETURN_IF_ERROR(be.Zero(dqkv, 3 * NC));
  ZINF_RETURN_IF_ERROR(be.AttentionBackward(dqkv, att_scratch, datty, a.qkv, a.att, B, seq, C, d.NH));
  ZINF_RETURN_IF_ERROR(be.Zero(dln, NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(dln, dw.qkvw, dw.qkvb, dqkv, a.ln1, w.qkvw, N, C, 3 * C));
  return be.LayerNormBackward(dres, dw.ln1w, dw.ln1b, dln, x, w.ln1w, a.ln1_mean, a.ln1_rstd, N, C);
}

template <typename T>
Status HeadForward(Backend<T>& be, const GptDims& d, const FinalView<const T>& w, const T* wte,
                   const T* xL, const int32_t* targets, const HeadActs<T>& h, int B, int seq) {
  const int N = B * seq;
  ZINF_RETURN_IF_ERROR(be.LayerNormForward(h.lnf, h.lnf_mean, h.lnf_rstd, xL, w.lnfw, w.lnfb, N, d.C));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(h.probs, h.lnf, wte, nullptr, N, d.C, d.V));
  return be.CrossEntropyForward(h.losses, h.probs, h.probs, targets, N, d.V);
}

template <typename T>
Status HeadBackward(Backend<T>& be, const GptDims& d, const FinalView<const T>& w,
                    const FinalView<T>& dw, const T* wte, T* dwte, const T* xL,
                    const int32_t* targets, const HeadActs<T>& h, T* dxL, T loss_scale, int B,
                    int seq) {
  const int N = B * seq;
  const size_t NC = static_cast<size_t>(N) * d.C;
  ZINF_RETURN_IF_ERROR(be.Zero(h.dlogits, static_cast<size_t>(N) * d.V));
  ZINF_RETURN_IF_ERROR(be.CrossEntropyBackward(h.dlogits, h.probs, targets,
                                               loss_scale / static_cast<T>(N), N, d.V));
  ZINF_RETURN_IF_ERROR(be.Zero(h.dlnf, NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(h.dlnf, dwte, nullptr, h.dlogits, h.lnf, wte, N, d.C, d.V));
  ZINF_RETURN_IF_ERROR(be.Zero(dxL, NC));
  return be.LayerNormBackward(dxL, dw.lnfw, dw.lnfb, h.dlnf, xL, w.lnfw, h.lnf_mean, h.lnf_rstd,
                              N, d.C);
}

#define ZINF_GPT_INSTANTIATE(T)                                                                  \
  template EmbeddingView<T> ViewEmbedding(T*, const GptDims&);                                   \
  template EmbeddingView<const T> ViewEmbedding(const T*, const GptDims&);                       \
  template BlockView<T> ViewBlock(T*, const GptDims&);                                           \
  template BlockView<const T> ViewBlock(const T*, const GptDims&);                               \
  template FinalView<T> ViewFinal(T*, const GptDims&);                                           \
  template FinalView<const T> ViewFinal(const T*, const GptDims&);                               \
  template BlockActs<T> ViewBlockActs(T*, const GptDims&, int, int);                             \
  template HeadActs<T> ViewHeadActs(T*, const GptDims&, int, int);                               \
  template Status EmbeddingForward(Backend<T>&, const GptDims&, const EmbeddingView<const T>&,   \
                                   const int32_t*, T*, int, int);                                \
  template Status EmbeddingBackward(Backend<T>&, const GptDims&, const EmbeddingView<T>&,        \
                                    const int32_t*, const T*, int, int);                         \
  template Status BlockForward(Backend<T>&, const GptDims&, const BlockView<const T>&, const T*, \
                               T*, const BlockActs<T>&, T*, int, int);                           \
  template Status BlockBackward(Backend<T>&, const GptDims&, const BlockView<const T>&,          \
                                const BlockView<T>&, const T*, const BlockActs<T>&, T*, T*, int, \
                                int);                                                            \
  template Status HeadForward(Backend<T>&, const GptDims&, const FinalView<const T>&, const T*,  \
                              const T*, const int32_t*, const HeadActs<T>&, int, int);           \
  template Status HeadBackward(Backend<T>&, const GptDims&, const FinalView<const T>&,           \
                               const FinalView<T>&, const T*, T*, const T*, const int32_t*,      \
                               const HeadActs<T>&, T*, T, int, int);

ZINF_GPT_INSTANTIATE(float)
ZINF_GPT_INSTANTIATE(double)
#undef ZINF_GPT_INSTANTIATE

}  // namespace zinf::train
