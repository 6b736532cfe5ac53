#include "src/train/llama.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/cpu/parallel.h"
#include "src/train/unit_layout.h"

namespace zinf::train::llama {

Result<Dims> Dims::Make(const model::ModelShape& shape, int seq) {
  if (shape.arch != model::Arch::kLlama) {
    return InvalidArgument(fmt::format("llama::Dims: the shape is of architecture {}, not llama",
                                       model::ArchName(shape.arch)));
  }
  ZINF_RETURN_IF_ERROR(shape.Check());
  if (seq <= 0) return InvalidArgument(fmt::format("sequence length {}: expected > 0", seq));
  ZINF_RETURN_IF_ERROR(shape.CheckSequence(seq));
  Dims d{.shape = shape, .seq = seq};
  ZINF_ASSIGN_OR_RETURN(d.inv_freq,
                        kernels::cpu::RopeInvFreq(shape.head_dim, shape.rope_theta,
                                                  shape.rope_scaling));
  return d;
}

uint64_t Dims::UnitParams(uint32_t unit) const {
  if (unit == 0) return shape.EmbeddingParams();
  if (unit == final_unit()) return shape.FinalParams();
  return shape.LayerParams();
}

std::string Dims::UnitName(uint32_t unit) const {
  if (unit == 0) return "embedding";
  if (unit == final_unit()) return "final";
  return fmt::format("layer{}", unit - 1);
}

std::vector<TensorInfo> UnitTensors(const Dims& d, uint32_t unit) {
  const int64_t C = d.C(), V = d.V(), Q = d.Q(), K = d.K(), I = d.I();
  const model::ModelShape& s = d.shape;
  TensorListBuilder t;
  auto add = [&t](std::string name, std::vector<int64_t> shape) {
    t.Add(std::move(name), std::move(shape));
  };
  if (unit == 0) {
    add("model.embed_tokens.weight", {V, C});
  } else if (unit == d.final_unit()) {
    add("model.norm.weight", {C});
    if (!s.tie_word_embeddings) add("lm_head.weight", {V, C});
  } else {
    const std::string p = fmt::format("model.layers.{}.", unit - 1);
    add(p + "input_layernorm.weight", {C});
    add(p + "self_attn.q_proj.weight", {Q, C});
    add(p + "self_attn.k_proj.weight", {K, C});
    add(p + "self_attn.v_proj.weight", {K, C});
    if (s.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {Q});
      add(p + "self_attn.k_proj.bias", {K});
      add(p + "self_attn.v_proj.bias", {K});
    }
    add(p + "self_attn.o_proj.weight", {C, Q});
    if (s.o_bias) add(p + "self_attn.o_proj.bias", {C});
    add(p + "post_attention_layernorm.weight", {C});
    add(p + "mlp.gate_proj.weight", {I, C});
    add(p + "mlp.up_proj.weight", {I, C});
    if (s.mlp_bias) {
      add(p + "mlp.gate_proj.bias", {I});
      add(p + "mlp.up_proj.bias", {I});
    }
    add(p + "mlp.down_proj.weight", {C, I});
    if (s.mlp_bias) add(p + "mlp.down_proj.bias", {C});
  }
  return t.Take();
}

void InitUnit(const Dims& d, uint32_t unit, uint64_t seed, float* out) {
  const uint64_t key = UnitKey(seed, unit);
  for (const TensorInfo& t : UnitTensors(d, unit)) {
    float* p = out + t.offset;
    if (t.name.ends_with("norm.weight")) {
      std::fill(p, p + t.elems, 1.0f);
    } else if (t.name.ends_with(".bias")) {
      std::fill(p, p + t.elems, 0.0f);
    } else {
      kernels::ParallelForChunks(t.elems, {}, [&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) {
          p[i] = static_cast<float>(0.02 * InitNormal(key, t.offset + i));
        }
      });
    }
  }
}

template <typename T>
LayerView<T> ViewLayer(T* base, const Dims& d) {
  const uint64_t C = d.C(), Q = d.Q(), W = d.W(), I = d.I();
  const model::ModelShape& s = d.shape;
  Carver<T> c(base);
  LayerView<T> v{};
  v.ln1w = c.Take(C);
  v.qkvw = c.Take(W * C);
  v.qkvb = s.qkv_bias ? c.Take(W) : nullptr;
  v.ow = c.Take(C * Q);
  v.ob = s.o_bias ? c.Take(C) : nullptr;
  v.ln2w = c.Take(C);
  v.guw = c.Take(2 * I * C);
  v.gub = s.mlp_bias ? c.Take(2 * I) : nullptr;
  v.downw = c.Take(C * I);
  v.downb = s.mlp_bias ? c.Take(C) : nullptr;
  return v;
}

template <typename T>
FinalView<T> ViewFinal(T* base, const Dims& d) {
  return {base, d.shape.tie_word_embeddings ? nullptr : base + d.C()};
}

uint64_t LayerActsElems(const Dims& d, int B, int seq) {
  const uint64_t N = uint64_t(B) * seq, C = d.C();
  return N * (3 * C + 2 + uint64_t(d.W()) + d.Q() + 3 * uint64_t(d.I())) +
         uint64_t(B) * d.shape.heads * seq * seq;
}

template <typename T>
LayerActs<T> ViewLayerActs(T* base, const Dims& d, int B, int seq) {
  const uint64_t N = uint64_t(B) * seq, C = d.C();
  Carver<T> c(base);
  LayerActs<T> a;
  a.ln1 = c.Take(N * C);
  a.rstd1 = c.Take(N);
  a.qkv = c.Take(N * d.W());
  a.atty = c.Take(N * d.Q());
  a.att = c.Take(uint64_t(B) * d.shape.heads * seq * seq);
  a.res2 = c.Take(N * C);
  a.ln2 = c.Take(N * C);
  a.rstd2 = c.Take(N);
  a.gu = c.Take(N * 2 * d.I());
  a.h = c.Take(N * d.I());
  return a;
}

namespace {

// The layer scratch: dh (N, I), dgu (N, 2I), dln (N, C), datty (N, Q), dqkv (N, W) for the
// backward, then the rotary tables (cos, sin: seq·d/2 each) and the attention's scratch, which
// the forward uses too.
template <typename T>
struct Scratch {
  T *dh, *dgu, *dln, *datty, *dqkv, *cos, *sin, *att;
};

template <typename T>
Scratch<T> ViewScratch(T* base, const Dims& d, int B, int seq) {
  const uint64_t N = uint64_t(B) * seq, half = uint64_t(seq) * d.shape.head_dim / 2;
  Carver<T> c(base);
  Scratch<T> s;
  s.dh = c.Take(N * d.I());
  s.dgu = c.Take(N * 2 * d.I());
  s.dln = c.Take(N * d.C());
  s.datty = c.Take(N * d.Q());
  s.dqkv = c.Take(N * d.W());
  s.cos = c.Take(half);
  s.sin = c.Take(half);
  s.att = c.next();
  return s;
}

}  // namespace

uint64_t LayerScratchElems(const Dims& d, int B, int seq, uint64_t attention_scratch) {
  const uint64_t N = uint64_t(B) * seq;
  return N * (3 * uint64_t(d.I()) + d.C() + d.Q() + d.W()) +
         uint64_t(seq) * d.shape.head_dim + attention_scratch;
}

uint64_t HeadActsElems(const Dims& d, int B, int seq) {
  const uint64_t N = uint64_t(B) * seq, C = d.C(), V = d.V();
  return N * C * 2 + N * 2 + N * V * 2;
}

template <typename T>
HeadActs<T> ViewHeadActs(T* base, const Dims& d, int B, int seq) {
  const uint64_t N = uint64_t(B) * seq, C = d.C(), V = d.V();
  Carver<T> c(base);
  HeadActs<T> h;
  h.lnf = c.Take(N * C);
  h.rstd = c.Take(N);
  h.probs = c.Take(N * V);
  h.dlogits = c.Take(N * V);
  h.losses = c.Take(N);
  h.dlnf = c.Take(N * C);
  return h;
}

template <typename T>
Status EmbeddingForward(Backend<T>& be, const Dims& d, const T* wte, const int32_t* tokens,
                        T* x0, int B, int seq) {
  return be.TokenEmbeddingForward(x0, tokens, wte, B * seq, d.C());
}

template <typename T>
Status EmbeddingBackward(Backend<T>& be, const Dims& d, T* dwte, const int32_t* tokens,
                         const T* dx0, int B, int seq) {
  return be.TokenEmbeddingBackward(dwte, dx0, tokens, B * seq, d.C());
}

template <typename T>
Status LayerForward(Backend<T>& be, const Dims& d, const LayerView<const T>& w, const T* x,
                    T* out, const LayerActs<T>& a, T* scratch, int B, int seq) {
  const int N = B * seq, C = d.C(), I = d.I();
  const int H = d.shape.heads, KV = d.shape.kv_heads, hd = d.shape.head_dim;
  const double eps = d.shape.norm_eps;
  const size_t NC = static_cast<size_t>(N) * C;
  const Scratch<T> s = ViewScratch(scratch, d, B, seq);
  ZINF_RETURN_IF_ERROR(be.RmsNormForward(a.ln1, a.rstd1, x, w.ln1w, N, C, eps));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.qkv, a.ln1, w.qkvw, w.qkvb, N, C, d.W()));
  ZINF_RETURN_IF_ERROR(be.RopeTables(s.cos, s.sin, d.inv_freq, seq));
  ZINF_RETURN_IF_ERROR(be.RopeForward(a.qkv, s.cos, s.sin, B, seq, H, KV, hd));
  ZINF_RETURN_IF_ERROR(be.CausalAttentionForward(a.atty, a.att, s.att, a.qkv, B, seq, H, KV, hd));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.res2, a.atty, w.ow, w.ob, N, d.Q(), C));
  ZINF_RETURN_IF_ERROR(be.AddInPlace(a.res2, x, NC));  // o_proj(attention) + x
  ZINF_RETURN_IF_ERROR(be.RmsNormForward(a.ln2, a.rstd2, a.res2, w.ln2w, N, C, eps));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(a.gu, a.ln2, w.guw, w.gub, N, C, 2 * I));
  ZINF_RETURN_IF_ERROR(be.SwiGluForward(a.h, a.gu, N, I));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(out, a.h, w.downw, w.downb, N, I, C));
  return be.AddInPlace(out, a.res2, NC);  // down(h) + res2
}

template <typename T>
Status LayerBackward(Backend<T>& be, const Dims& d, const LayerView<const T>& w,
                     const LayerView<T>& dw, const T* x, const LayerActs<T>& a, T* dres,
                     T* scratch, int B, int seq) {
  const int N = B * seq, C = d.C(), I = d.I(), Q = d.Q(), W = d.W();
  const int H = d.shape.heads, KV = d.shape.kv_heads, hd = d.shape.head_dim;
  const size_t n = static_cast<size_t>(N);
  const Scratch<T> s = ViewScratch(scratch, d, B, seq);
  // MLP: out = res2 + down(swiglu(gate_up(norm2(res2)))); dres turns into ∂/∂res2.
  ZINF_RETURN_IF_ERROR(be.Zero(s.dh, n * I));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(s.dh, dw.downw, dw.downb, dres, a.h, w.downw, N, I, C));
  ZINF_RETURN_IF_ERROR(be.Zero(s.dgu, n * 2 * I));
  ZINF_RETURN_IF_ERROR(be.SwiGluBackward(s.dgu, s.dh, a.gu, N, I));
  ZINF_RETURN_IF_ERROR(be.Zero(s.dln, n * C));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(s.dln, dw.guw, dw.gub, s.dgu, a.ln2, w.guw, N, C, 2 * I));
  ZINF_RETURN_IF_ERROR(be.RmsNormBackward(dres, dw.ln2w, s.dln, a.res2, w.ln2w, a.rstd2, N, C));
  // Attention: res2 = x + o_proj(attn(rope(qkv(norm1(x))))); dres turns into ∂/∂x.
  ZINF_RETURN_IF_ERROR(be.Zero(s.datty, n * Q));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(s.datty, dw.ow, dw.ob, dres, a.atty, w.ow, N, Q, C));
  ZINF_RETURN_IF_ERROR(be.Zero(s.dqkv, n * W));
  ZINF_RETURN_IF_ERROR(be.CausalAttentionBackward(s.dqkv, s.att, s.datty, a.qkv, a.att, B, seq,
                                                  H, KV, hd));
  ZINF_RETURN_IF_ERROR(be.RopeTables(s.cos, s.sin, d.inv_freq, seq));
  ZINF_RETURN_IF_ERROR(be.RopeBackward(s.dqkv, s.cos, s.sin, B, seq, H, KV, hd));
  ZINF_RETURN_IF_ERROR(be.Zero(s.dln, n * C));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(s.dln, dw.qkvw, dw.qkvb, s.dqkv, a.ln1, w.qkvw, N, C, W));
  return be.RmsNormBackward(dres, dw.ln1w, s.dln, x, w.ln1w, a.rstd1, N, C);
}

template <typename T>
Status HeadForward(Backend<T>& be, const Dims& d, const FinalView<const T>& w, const T* wte,
                   const T* xL, const int32_t* targets, const HeadActs<T>& h, int B, int seq) {
  const int N = B * seq;
  const T* head = w.head != nullptr ? w.head : wte;
  ZINF_RETURN_IF_ERROR(be.RmsNormForward(h.lnf, h.rstd, xL, w.normw, N, d.C(), d.shape.norm_eps));
  ZINF_RETURN_IF_ERROR(be.MatmulForward(h.probs, h.lnf, head, nullptr, N, d.C(), d.V()));
  return be.CrossEntropyForward(h.losses, h.probs, h.probs, targets, N, d.V());
}

template <typename T>
Status HeadBackward(Backend<T>& be, const Dims& d, const FinalView<const T>& w,
                    const FinalView<T>& dw, const T* wte, T* dwte, const T* xL,
                    const int32_t* targets, const HeadActs<T>& h, T* dxL, T loss_scale, int B,
                    int seq) {
  const int N = B * seq, C = d.C(), V = d.V();
  const size_t NC = static_cast<size_t>(N) * C;
  const T* head = w.head != nullptr ? w.head : wte;
  T* dhead = w.head != nullptr ? dw.head : dwte;
  ZINF_RETURN_IF_ERROR(be.Zero(h.dlogits, static_cast<size_t>(N) * V));
  ZINF_RETURN_IF_ERROR(be.CrossEntropyBackward(h.dlogits, h.probs, targets,
                                               loss_scale / static_cast<T>(N), N, V));
  ZINF_RETURN_IF_ERROR(be.Zero(h.dlnf, NC));
  ZINF_RETURN_IF_ERROR(be.MatmulBackward(h.dlnf, dhead, nullptr, h.dlogits, h.lnf, head, N, C, V));
  ZINF_RETURN_IF_ERROR(be.Zero(dxL, NC));
  return be.RmsNormBackward(dxL, dw.normw, h.dlnf, xL, w.normw, h.rstd, N, C);
}

#define ZINF_LLAMA_INSTANTIATE(T)                                                               \
  template LayerView<T> ViewLayer(T*, const Dims&);                                             \
  template LayerView<const T> ViewLayer(const T*, const Dims&);                                 \
  template FinalView<T> ViewFinal(T*, const Dims&);                                             \
  template FinalView<const T> ViewFinal(const T*, const Dims&);                                 \
  template LayerActs<T> ViewLayerActs(T*, const Dims&, int, int);                               \
  template HeadActs<T> ViewHeadActs(T*, const Dims&, int, int);                                 \
  template Status EmbeddingForward(Backend<T>&, const Dims&, const T*, const int32_t*, T*, int, \
                                   int);                                                        \
  template Status EmbeddingBackward(Backend<T>&, const Dims&, T*, const int32_t*, const T*,     \
                                    int, int);                                                  \
  template Status LayerForward(Backend<T>&, const Dims&, const LayerView<const T>&, const T*,   \
                               T*, const LayerActs<T>&, T*, int, int);                          \
  template Status LayerBackward(Backend<T>&, const Dims&, const LayerView<const T>&,            \
                                const LayerView<T>&, const T*, const LayerActs<T>&, T*, T*,     \
                                int, int);                                                      \
  template Status HeadForward(Backend<T>&, const Dims&, const FinalView<const T>&, const T*,    \
                              const T*, const int32_t*, const HeadActs<T>&, int, int);          \
  template Status HeadBackward(Backend<T>&, const Dims&, const FinalView<const T>&,             \
                               const FinalView<T>&, const T*, T*, const T*, const int32_t*,     \
                               const HeadActs<T>&, T*, T, int, int);

ZINF_LLAMA_INSTANTIATE(float)
ZINF_LLAMA_INSTANTIATE(double)
#undef ZINF_LLAMA_INSTANTIATE

}  // namespace zinf::train::llama
