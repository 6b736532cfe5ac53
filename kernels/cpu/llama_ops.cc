// kernels/cpu/llama_ops.cc — the CPU ops of a Llama-family layer; see llama_ops.h.
//
// Parallel structure (every split depends on the shapes only; kernels/cpu/op_helpers.h):
// - row ops (RMSNorm, RoPE, SwiGLU): chunks of whole rows;
// - RMSNorm's dweight: chunks of channels, each walking all rows in increasing order;
// - attention forward: one task per (batch, query head), writing only that head's channels;
//   backward: one task per (batch, key/value head), walking its query heads in order, so the
//   key and value gradients that several query heads share add up in one fixed order.
#include "kernels/cpu/llama_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "kernels/cpu/op_helpers.h"

namespace zinf::kernels::cpu {

using detail::CombineLanes;
using detail::Dot;
using detail::ForChunks;
using detail::ForRows;
using detail::kChannelChunk;
using detail::kLanes;

template <typename T>
void TokenEmbeddingForward(T* out, const int32_t* tokens, const T* wte, int N, int C,
                           const OpOptions& o) {
  ForRows(size_t(N), C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      std::copy_n(wte + size_t(tokens[r]) * C, C, out + r * C);
    }
  });
}

template <typename T>
void TokenEmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int N, int C,
                            const OpOptions& o) {
  ForChunks(size_t(C), kChannelChunk, o, [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < size_t(N); ++r) {
      const T* d = dout + r * C;
      T* dw = dwte + size_t(tokens[r]) * C;
      for (size_t i = c0; i < c1; ++i) dw[i] += d[i];
    }
  });
}

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, double eps,
                    const OpOptions& o) {
  const T e = T(eps);
  ForRows(N, C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* x = inp + r * C;
      const T s = T(1) / std::sqrt(Dot(x, x, C) / T(C) + e);
      T* y = out + r * C;
      for (int i = 0; i < C; ++i) y[i] = (x[i] * s) * weight[i];
      rstd[r] = s;
    }
  });
}

// y = w·x·s with s = (Σx²/C + eps)^-1/2, ∂s/∂x_j = −s³·x_j/C:
// dx_j = s·w_j·dy_j − x_j·(s³/C)·Σ_i w_i·dy_i·x_i.
template <typename T>
void RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     const T* rstd, int N, int C, const OpOptions& o) {
  ForRows(N, C, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T s = rstd[r];
      T acc[kLanes] = {};
      int i = 0;
      for (; i + kLanes <= C; i += kLanes)
        for (int j = 0; j < kLanes; ++j) acc[j] += (weight[i + j] * d[i + j]) * x[i + j];
      for (int j = 0; i < C; ++i, ++j) acc[j] += (weight[i] * d[i]) * x[i];
      const T coef = CombineLanes(acc) * (s * s * s) / T(C);
      T* dx = dinp + r * C;
      for (int k = 0; k < C; ++k) dx[k] += (weight[k] * d[k]) * s - x[k] * coef;
    }
  });
  if (dweight == nullptr) return;
  ForChunks(C, kChannelChunk, o, [&](size_t c0, size_t c1) {
    for (size_t r = 0; r < size_t(N); ++r) {
      const T* x = inp + r * C;
      const T* d = dout + r * C;
      const T s = rstd[r];
      for (size_t i = c0; i < c1; ++i) dweight[i] += (x[i] * s) * d[i];
    }
  });
}

// HF's _compute_default_rope_parameters and _compute_llama3_parameters, in float32 as its
// tensors are (python scalars meet float32 tensors as float32).
Result<std::vector<float>> RopeInvFreq(int head_dim, double theta, const RopeScaling& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) {
    return InvalidArgument(fmt::format("rotary embeddings: head_dim {} must be even and positive",
                                       head_dim));
  }
  if (!(theta > 0) || !std::isfinite(theta)) {
    return InvalidArgument(fmt::format("rope_theta {}: expected a finite value > 0", theta));
  }
  const bool llama3 = scaling.kind == "llama3";
  if (!llama3 && scaling.kind != "default") {
    return InvalidArgument(fmt::format(
        "rope_scaling type \"{}\" is not implemented (zinf has \"default\" and \"llama3\")",
        scaling.kind));
  }
  const float base = float(theta);
  std::vector<float> inv(size_t(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    const float exponent = float(2 * i) / float(head_dim);
    inv[i] = 1.0f / float(std::pow(double(base), double(exponent)));
  }
  if (!llama3) return inv;
  const double f = scaling.factor, lo = scaling.low_freq_factor, hi = scaling.high_freq_factor;
  const double old_len = scaling.original_max_position_embeddings;
  if (!(f > 0) || !(lo > 0) || !(hi > lo) || !(old_len > 0)) {
    return InvalidArgument(fmt::format(
        "rope_scaling llama3: factor {}, low_freq_factor {}, high_freq_factor {} and "
        "original_max_position_embeddings {}: expected factor > 0, 0 < low < high and a "
        "positive length",
        f, lo, hi, old_len));
  }
  const float low_wavelen = float(old_len / lo), high_wavelen = float(old_len / hi);
  for (float& x : inv) {
    const float wavelen = float(2 * std::numbers::pi) / x;
    const float scaled = wavelen > low_wavelen ? x / float(f) : x;
    const float smooth = (float(old_len) / wavelen - float(lo)) / float(hi - lo);
    const float smoothed = (1.0f - smooth) * scaled / float(f) + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    x = medium ? smoothed : scaled;
  }
  return inv;
}

template <typename T>
void RopeTables(T* cos, T* sin, const std::vector<float>& inv_freq, int seq) {
  const size_t half = inv_freq.size();
  for (int t = 0; t < seq; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = float(t) * inv_freq[i];
      cos[t * half + i] = T(float(std::cos(double(angle))));
      sin[t * half + i] = T(float(std::sin(double(angle))));
    }
  }
}

namespace {

// Each q and k head of every row: (x1, x2) -> (x1·c − x2·s, x2·c + x1·s) forward, the
// transpose (g1·c + g2·s, g2·c − g1·s) backward.
template <typename T, bool kTranspose>
void Rotate(T* qkv, const T* cos, const T* sin, int B, int seq, int H, int KV, int d,
            const OpOptions& o) {
  const size_t width = size_t(H + 2 * KV) * d, half = size_t(d / 2);
  ForRows(size_t(B) * seq, size_t(H + KV) * d, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* c = cos + (r % seq) * half;
      const T* s = sin + (r % seq) * half;
      for (int j = 0; j < H + KV; ++j) {
        T* x = qkv + r * width + size_t(j) * d;
        for (size_t i = 0; i < half; ++i) {
          const T a = x[i], b = x[i + half];
          if constexpr (kTranspose) {
            x[i] = a * c[i] + b * s[i];
            x[i + half] = b * c[i] - a * s[i];
          } else {
            x[i] = a * c[i] - b * s[i];
            x[i + half] = b * c[i] + a * s[i];
          }
        }
      }
    }
  });
}

}  // namespace

template <typename T>
void RopeForward(T* qkv, const T* cos, const T* sin, int B, int seq, int H, int KV, int d,
                 const OpOptions& o) {
  Rotate<T, false>(qkv, cos, sin, B, seq, H, KV, d, o);
}

template <typename T>
void RopeBackward(T* dqkv, const T* cos, const T* sin, int B, int seq, int H, int KV, int d,
                  const OpOptions& o) {
  Rotate<T, true>(dqkv, cos, sin, B, seq, H, KV, d, o);
}

size_t CausalAttentionScratchElems(int B, int seq, int KV) {
  return size_t(B) * size_t(KV) * size_t(seq);
}

template <typename T>
void CausalAttentionForward(T* out, T* att, const T* qkv, int B, int seq, int H, int KV, int d,
                            const OpOptions& o) {
  const T scale = T(1) / std::sqrt(T(d));
  const size_t width = size_t(H + 2 * KV) * d, out_width = size_t(H) * d;
  const int rep = H / KV;
  ForChunks(size_t(B) * H, 1, o, [&](size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; ++p) {
      const size_t b = p / H, h = p % H, g = h / rep;
      const T* row0 = qkv + b * seq * width;
      const T* qbase = row0 + h * d;
      const T* kbase = row0 + (size_t(H) + g) * d;
      const T* vbase = row0 + (size_t(H) + KV + g) * d;
      for (int t = 0; t < seq; ++t) {
        const T* q = qbase + t * width;
        T* att_row = att + (p * seq + t) * seq;
        T maxval = -std::numeric_limits<T>::infinity();
        for (int t2 = 0; t2 <= t; ++t2) {
          const T val = Dot(q, kbase + t2 * width, d) * scale;
          maxval = std::max(maxval, val);
          att_row[t2] = val;
        }
        T expsum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const T e = std::exp(att_row[t2] - maxval);
          expsum += e;
          att_row[t2] = e;
        }
        const T inv = expsum == T(0) ? T(0) : T(1) / expsum;
        for (int t2 = 0; t2 <= t; ++t2) att_row[t2] *= inv;
        for (int t2 = t + 1; t2 < seq; ++t2) att_row[t2] = T(0);
        T* out_r = out + (b * seq + t) * out_width + h * d;
        std::fill(out_r, out_r + d, T(0));
        for (int t2 = 0; t2 <= t; ++t2) {
          const T* v = vbase + t2 * width;
          const T a = att_row[t2];
          for (int i = 0; i < d; ++i) out_r[i] += a * v[i];
        }
      }
    }
  });
}

template <typename T>
void CausalAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                             int B, int seq, int H, int KV, int d, const OpOptions& o) {
  const T scale = T(1) / std::sqrt(T(d));
  const size_t width = size_t(H + 2 * KV) * d, out_width = size_t(H) * d;
  const int rep = H / KV;
  ForChunks(size_t(B) * KV, 1, o, [&](size_t p0, size_t p1) {
    for (size_t p = p0; p < p1; ++p) {
      const size_t b = p / KV, g = p % KV;
      const size_t row0 = b * seq * width;
      const size_t k_off = row0 + (size_t(H) + g) * d, v_off = row0 + (size_t(H) + KV + g) * d;
      T* datt = scratch + p * seq;  // (seq): ∂loss/∂att[t, :], then ∂loss/∂preatt[t, :]·scale
      for (size_t h = g * rep; h < (g + 1) * rep; ++h) {
        const size_t q_off = row0 + h * d;
        const T* att_h = att + (b * H + h) * seq * seq;
        for (int t = 0; t < seq; ++t) {
          const T* att_row = att_h + size_t(t) * seq;
          const T* dy = dout + (b * seq + t) * out_width + h * d;
          // out = Σ_t2 att[t2]·v[t2].
          for (int t2 = 0; t2 <= t; ++t2) {
            datt[t2] = Dot(qkv + v_off + t2 * width, dy, d);
            const T a = att_row[t2];
            T* dv = dqkv + v_off + t2 * width;
            for (int i = 0; i < d; ++i) dv[i] += a * dy[i];
          }
          // Softmax: dpreatt[t2] = att[t2]·(datt[t2] − Σ_t3 att[t3]·datt[t3]).
          T dot = 0;
          for (int t2 = 0; t2 <= t; ++t2) dot += att_row[t2] * datt[t2];
          for (int t2 = 0; t2 <= t; ++t2) datt[t2] = att_row[t2] * (datt[t2] - dot) * scale;
          // preatt[t2] = scale·q·k[t2].
          const T* q = qkv + q_off + t * width;
          T* dq = dqkv + q_off + t * width;
          for (int t2 = 0; t2 <= t; ++t2) {
            const T gr = datt[t2];
            const T* k = qkv + k_off + t2 * width;
            T* dk = dqkv + k_off + t2 * width;
            for (int i = 0; i < d; ++i) {
              dq[i] += k[i] * gr;
              dk[i] += q[i] * gr;
            }
          }
        }
      }
    }
  });
}

template <typename T>
void SwiGluForward(T* out, const T* gu, int N, int I, const OpOptions& o) {
  ForRows(N, size_t(2) * I, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* g = gu + r * 2 * I;
      const T* u = g + I;
      T* y = out + r * I;
      for (int i = 0; i < I; ++i) y[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
    }
  });
}

// silu(g) = g·σ(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g))).
template <typename T>
void SwiGluBackward(T* dgu, const T* dout, const T* gu, int N, int I, const OpOptions& o) {
  ForRows(N, size_t(2) * I, o, [&](size_t r0, size_t r1) {
    for (size_t r = r0; r < r1; ++r) {
      const T* g = gu + r * 2 * I;
      const T* u = g + I;
      const T* dy = dout + r * I;
      T* dg = dgu + r * 2 * I;
      T* du = dg + I;
      for (int i = 0; i < I; ++i) {
        const T sig = T(1) / (T(1) + std::exp(-g[i]));
        const T silu = g[i] * sig;
        dg[i] += dy[i] * u[i] * (sig * (T(1) + g[i] * (T(1) - sig)));
        du[i] += dy[i] * silu;
      }
    }
  });
}

#define ZINF_LLAMA_OPS_INSTANTIATE(T)                                                          \
  template void TokenEmbeddingForward<T>(T*, const int32_t*, const T*, int, int,              \
                                         const OpOptions&);                                    \
  template void TokenEmbeddingBackward<T>(T*, const T*, const int32_t*, int, int,             \
                                          const OpOptions&);                                   \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int, int, double,                \
                                  const OpOptions&);                                           \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int, int,    \
                                   const OpOptions&);                                          \
  template void RopeTables<T>(T*, T*, const std::vector<float>&, int);                         \
  template void RopeForward<T>(T*, const T*, const T*, int, int, int, int, int,                \
                               const OpOptions&);                                              \
  template void RopeBackward<T>(T*, const T*, const T*, int, int, int, int, int,               \
                                const OpOptions&);                                             \
  template void CausalAttentionForward<T>(T*, T*, const T*, int, int, int, int, int,           \
                                          const OpOptions&);                                   \
  template void CausalAttentionBackward<T>(T*, T*, const T*, const T*, const T*, int, int, int, \
                                           int, int, const OpOptions&);                        \
  template void SwiGluForward<T>(T*, const T*, int, int, const OpOptions&);                    \
  template void SwiGluBackward<T>(T*, const T*, const T*, int, int, const OpOptions&);

ZINF_LLAMA_OPS_INSTANTIATE(float)
ZINF_LLAMA_OPS_INSTANTIATE(double)
#undef ZINF_LLAMA_OPS_INSTANTIATE

}  // namespace zinf::kernels::cpu
