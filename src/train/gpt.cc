#include "src/train/gpt.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "kernels/cpu/parallel.h"

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
  std::vector<TensorInfo> t;
  uint64_t off = 0;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    uint64_t n = 1;
    for (int64_t s : shape) n *= static_cast<uint64_t>(s);
    t.push_back({std::move(name), std::move(shape), off, n});
    off += n;
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
  return t;
}

namespace {

// SplitMix64: a counter-based generator, so element i's draw needs no sequential state.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A standard normal for element i of the stream `key` (Box-Muller on two 53-bit uniforms).
double Normal(uint64_t key, uint64_t i) {
  const uint64_t a = Mix(key ^ Mix(2 * i)), b = Mix(key ^ Mix(2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace

void InitUnit(const GptDims& d, uint32_t unit, uint64_t seed, float* out) {
  const uint64_t key = Mix(seed ^ Mix(0x5eed0000ull + unit));
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
          p[i] = static_cast<float>(stdev * Normal(key, t.offset + i));
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
  T* p = base;
  auto take = [&p](uint64_t n) { T* r = p; p += n; return r; };
  v.ln1w = take(C);
  v.ln1b = take(C);
  v.qkvw = take(3 * C * C);
  v.qkvb = take(3 * C);
  v.attprojw = take(C * C);
  v.attprojb = take(C);
  v.ln2w = take(C);
  v.ln2b = take(C);
  v.fcw = take(4 * C * C);
  v.fcb = take(4 * C);
  v.fcprojw = take(4 * C * C);
  v.fcprojb = take(C);
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
  T* p = base;
  auto take = [&p](uint64_t n) { T* r = p; p += n; return r; };
  a.ln1 = take(N * C);
  a.ln1_mean = take(N);
  a.ln1_rstd = take(N);
  a.qkv = take(N * 3 * C);
  a.atty = take(N * C);
  a.att = take(static_cast<uint64_t>(B) * d.NH * seq * seq);
  a.attproj = take(N * C);
  a.res2 = take(N * C);
  a.ln2 = take(N * C);
  a.ln2_mean = take(N);
  a.ln2_rstd = take(N);
  a.fch = take(N * 4 * C);
  a.fch_gelu = take(N * 4 * C);
  a.fcproj = take(N * C);
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
  T* p = base;
  auto take = [&p](uint64_t n) { T* r = p; p += n; return r; };
  h.lnf = take(N * C);
  h.lnf_mean = take(N);
  h.lnf_rstd = take(N);
  h.probs = take(N * V);
  h.dlogits = take(N * V);
  h.losses = take(N);
  h.dlnf = take(N * C);
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

template <typename T>
Result<double> ResidentForwardBackward(Backend<T>& be, const GptDims& d,
                                       const std::vector<const T*>& params,
                                       const std::vector<T*>& grads, const int32_t* tokens,
                                       const int32_t* targets, int B, int seq, T loss_scale) {
  if (params.size() != d.units() || grads.size() != d.units()) {
    return InvalidArgument(fmt::format("expected {} units of params and grads", d.units()));
  }
  const uint64_t NC = static_cast<uint64_t>(B) * seq * d.C;
  std::vector<T> xs(NC * (d.L + 1));  // the input of each block, and the final one
  std::vector<T> acts(BlockActsElems(d, B, seq));
  std::vector<T> head(HeadActsElems(d, B, seq));
  std::vector<T> dres(NC);
  std::vector<T> scratch(
      BlockGradScratchElems(d, B, seq, be.AttentionScratchElems(B, seq, d.C, d.NH)));
  auto x = [&](int l) { return xs.data() + NC * l; };
  const BlockActs<T> a = ViewBlockActs(acts.data(), d, B, seq);
  const HeadActs<T> h = ViewHeadActs(head.data(), d, B, seq);
  const EmbeddingView<const T> emb = ViewEmbedding(params[0], d);
  const FinalView<const T> fin = ViewFinal(params[d.final_unit()], d);

  ZINF_RETURN_IF_ERROR(EmbeddingForward(be, d, emb, tokens, x(0), B, seq));
  for (int l = 0; l < d.L; ++l) {
    ZINF_RETURN_IF_ERROR(BlockForward(be, d, ViewBlock(params[l + 1], d), x(l), x(l + 1), a,
                                      scratch.data(), B, seq));
  }
  ZINF_RETURN_IF_ERROR(HeadForward(be, d, fin, emb.wte, x(d.L), targets, h, B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  double loss = 0;
  for (int i = 0; i < B * seq; ++i) loss += static_cast<double>(h.losses[i]);
  loss /= B * seq;

  EmbeddingView<T> demb = ViewEmbedding(grads[0], d);
  ZINF_RETURN_IF_ERROR(HeadBackward(be, d, fin, ViewFinal(grads[d.final_unit()], d), emb.wte,
                                    demb.wte, x(d.L), targets, h, dres.data(), loss_scale, B, seq));
  for (int l = d.L - 1; l >= 0; --l) {
    const BlockView<const T> w = ViewBlock(params[l + 1], d);
    ZINF_RETURN_IF_ERROR(BlockForward(be, d, w, x(l), x(l + 1), a, scratch.data(), B, seq));  // recompute
    ZINF_RETURN_IF_ERROR(BlockBackward(be, d, w, ViewBlock(grads[l + 1], d), x(l), a,
                                       dres.data(), scratch.data(), B, seq));
  }
  ZINF_RETURN_IF_ERROR(EmbeddingBackward(be, d, demb, tokens, dres.data(), B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  return loss;
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
                               const HeadActs<T>&, T*, T, int, int);                             \
  template Result<double> ResidentForwardBackward(Backend<T>&, const GptDims&,                   \
                                                  const std::vector<const T*>&,                  \
                                                  const std::vector<T*>&, const int32_t*,        \
                                                  const int32_t*, int, int, T);

ZINF_GPT_INSTANTIATE(float)
ZINF_GPT_INSTANTIATE(double)
#undef ZINF_GPT_INSTANTIATE

}  // namespace zinf::train
