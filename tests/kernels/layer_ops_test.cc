// Tests of kernels/cpu/layer_ops.h: every backward against central finite differences (double),
// forwards against naive references, float against double, accumulation, determinism (run to
// run and across thread counts), on small shapes and on odd ones (C=12, NH=3, seq=1).
#include "kernels/cpu/layer_ops.h"
#include "kernels/cpu/grad_ops.h"

#include "kernels/cpu/half_convert.h"
#include "tests/kernels/grad_check.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <ostream>
#include <random>
#include <string>
#include <vector>

namespace zinf::kernels::cpu {
namespace {

struct Shape {
  const char* name;
  int B, seq, C, NH, V;
  int N() const { return B * seq; }
  int OC() const { return 3 * C + 1; }  // a matmul width that is no multiple of anything
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

constexpr Shape kSmall{"Small", 2, 5, 8, 2, 11};
// Odd widths: head size 4, 3 heads, a single position (attention is out = v there).
constexpr Shape kOdd{"Odd", 3, 1, 12, 3, 7};
// The same widths with 3 positions, so the softmax's gradient is exercised too.
constexpr Shape kOddSeq3{"OddSeq3", 2, 3, 12, 3, 5};
// Enough rows, channels and elements for several chunks of every parallel split.
constexpr Shape kWide{"Wide", 4, 32, 96, 4, 200};

std::vector<int32_t> Ids(size_t n, int V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  if (n >= 2) v[n - 1] = v[0];  // a repeated token: dwte rows add up
  return v;
}

class LayerOpsShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LayerOpsShapeTest, EncoderGradient) {
  const Shape s = GetParam();
  const auto tokens = Ids(s.N(), s.V, 1);
  GradCase c{{Uniform(size_t(s.V) * s.C, 2), Uniform(size_t(s.seq) * s.C, 3)},
             [&](const Buffers& in) {
               Vec out(size_t(s.N()) * s.C);
               EncoderForward(out.data(), tokens.data(), in[0].data(), in[1].data(), s.B, s.seq,
                              s.C);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               EncoderBackward(g[0].data(), g[1].data(), dout.data(), tokens.data(), s.B, s.seq,
                               s.C);
             }};
  CheckGradients(c, 4);
}

TEST_P(LayerOpsShapeTest, LayerNormGradient) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C;
  auto fwd = [=](const Buffers& in, Vec& mean, Vec& rstd) {
    Vec out(size_t(N) * C);
    mean.assign(N, 0);
    rstd.assign(N, 0);
    LayerNormForward(out.data(), mean.data(), rstd.data(), in[0].data(), in[1].data(),
                     in[2].data(), N, C);
    return out;
  };
  GradCase c{{Uniform(size_t(N) * C, 5, -2, 2), Uniform(C, 6, 0.5, 1.5), Uniform(C, 7)},
             [&](const Buffers& in) {
               Vec mean, rstd;
               return fwd(in, mean, rstd);
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               Vec mean, rstd;
               fwd(in, mean, rstd);
               LayerNormBackward(g[0].data(), g[1].data(), g[2].data(), dout.data(),
                                 in[0].data(), in[1].data(), mean.data(), rstd.data(), N, C);
             }};
  CheckGradients(c, 8);
}

TEST_P(LayerOpsShapeTest, MatmulGradient) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C, OC = s.OC();
  GradCase c{{Uniform(size_t(N) * C, 9), Uniform(size_t(OC) * C, 10), Uniform(OC, 11)},
             [&](const Buffers& in) {
               Vec out(size_t(N) * OC);
               MatmulForward(out.data(), in[0].data(), in[1].data(), in[2].data(), N, C, OC);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               MatmulBackward(g[0].data(), g[1].data(), g[2].data(), dout.data(), in[0].data(),
                              in[1].data(), N, C, OC);
             }};
  CheckGradients(c, 12);
}

TEST_P(LayerOpsShapeTest, AttentionGradient) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C;
  // Scaled up so the softmax is far from uniform.
  GradCase c{{Uniform(size_t(N) * 3 * C, 13, -2, 2)},
             [&](const Buffers& in) {
               Vec out(size_t(N) * C), att(size_t(s.B) * s.NH * s.seq * s.seq);
               AttentionForward(out.data(), att.data(), in[0].data(), s.B, s.seq, C, s.NH);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               Vec out(size_t(N) * C), att(size_t(s.B) * s.NH * s.seq * s.seq);
               AttentionForward(out.data(), att.data(), in[0].data(), s.B, s.seq, C, s.NH);
               Vec scratch(AttentionBackwardScratchElems(s.B, s.seq, C, s.NH), 1e300);
               AttentionBackward(g[0].data(), scratch.data(), dout.data(), in[0].data(),
                                 att.data(), s.B, s.seq, C, s.NH);
             }};
  CheckGradients(c, 14);
}

TEST_P(LayerOpsShapeTest, GeluGradient) {
  const Shape s = GetParam();
  const size_t n = size_t(s.N()) * 4 * s.C;
  GradCase c{{Uniform(n, 15, -5, 5)},
             [&](const Buffers& in) {
               Vec out(n);
               GeluForward(out.data(), in[0].data(), n);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               GeluBackward(g[0].data(), in[0].data(), dout.data(), n);
             }};
  CheckGradients(c, 16);
}

// The residual's backward is AddInPlace into both branches' gradients.
TEST_P(LayerOpsShapeTest, ResidualGradient) {
  const Shape s = GetParam();
  const size_t n = size_t(s.N()) * s.C;
  GradCase c{{Uniform(n, 17), Uniform(n, 18)},
             [&](const Buffers& in) {
               Vec out(n);
               ResidualForward(out.data(), in[0].data(), in[1].data(), n);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               AddInPlace(g[0].data(), dout.data(), n);
               AddInPlace(g[1].data(), dout.data(), n);
             }};
  CheckGradients(c, 19);
}

// L = Σ_i dloss_i · losses_i, so the random weights of CheckGradients are dloss.
TEST_P(LayerOpsShapeTest, CrossEntropyGradient) {
  const Shape s = GetParam();
  const int N = s.N(), V = s.V;
  const auto targets = Ids(N, V, 20);
  auto fwd = [&](const Buffers& in, Vec& probs) {
    Vec losses(N);
    probs.assign(size_t(N) * V, 0);
    CrossEntropyForward(losses.data(), probs.data(), in[0].data(), targets.data(), N, V);
    return losses;
  };
  GradCase c{{Uniform(size_t(N) * V, 21, -3, 3)},
             [&](const Buffers& in) {
               Vec probs;
               return fwd(in, probs);
             },
             [&](const Buffers& in, const Vec& dloss, Buffers& g) {
               Vec probs;
               fwd(in, probs);
               CrossEntropyBackward(g[0].data(), probs.data(), targets.data(), dloss.data(), N,
                                    V);
             }};
  CheckGradients(c, 22);
}

// ---------------------------------------------------------------- forwards vs references

TEST_P(LayerOpsShapeTest, EncoderForwardIsLookupPlusPosition) {
  const Shape s = GetParam();
  const auto tokens = Ids(s.N(), s.V, 1);
  const Vec wte = Uniform(size_t(s.V) * s.C, 2), wpe = Uniform(size_t(s.seq) * s.C, 3);
  Vec out(size_t(s.N()) * s.C);
  EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.seq, s.C);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.seq; ++t)
      for (int i = 0; i < s.C; ++i) {
        const int r = b * s.seq + t;
        ASSERT_EQ(out[size_t(r) * s.C + i], wte[size_t(tokens[r]) * s.C + i] + wpe[t * s.C + i]);
      }
}

TEST_P(LayerOpsShapeTest, LayerNormForwardMatchesNaive) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C;
  const Vec inp = Uniform(size_t(N) * C, 5, -2, 2), w = Uniform(C, 6), bias = Uniform(C, 7);
  Vec out(inp.size()), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(), N, C);
  for (int r = 0; r < N; ++r) {
    long double m = 0, v = 0;
    for (int i = 0; i < C; ++i) m += inp[size_t(r) * C + i];
    m /= C;
    for (int i = 0; i < C; ++i) v += (inp[size_t(r) * C + i] - m) * (inp[size_t(r) * C + i] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(double(v) + 1e-5);
    EXPECT_NEAR(mean[r], double(m), 1e-14);
    EXPECT_NEAR(rstd[r], rs, 1e-13 * rs);
    for (int i = 0; i < C; ++i)
      EXPECT_NEAR(out[size_t(r) * C + i], (inp[size_t(r) * C + i] - m) * rs * w[i] + bias[i],
                  1e-13);
  }
}

TEST_P(LayerOpsShapeTest, MatmulForwardMatchesTripleLoop) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C, OC = s.OC();
  const Vec inp = Uniform(size_t(N) * C, 9), w = Uniform(size_t(OC) * C, 10),
            bias = Uniform(OC, 11);
  for (bool with_bias : {true, false}) {
    Vec out(size_t(N) * OC, std::nan(""));  // beta = 0 must not read it
    std::vector<float> out_f(out.size(), NAN);
    const auto inp_f = Cast<float>(inp), w_f = Cast<float>(w), bias_f = Cast<float>(bias);
    MatmulForward(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, C, OC);
    MatmulForward(out_f.data(), inp_f.data(), w_f.data(), with_bias ? bias_f.data() : nullptr, N,
                  C, OC);
    for (int r = 0; r < N; ++r)
      for (int o = 0; o < OC; ++o) {
        double ref = with_bias ? bias[o] : 0.0;
        for (int i = 0; i < C; ++i) ref += inp[size_t(r) * C + i] * w[size_t(o) * C + i];
        ASSERT_NEAR(out[size_t(r) * OC + o], ref, 1e-13);
        ASSERT_NEAR(out_f[size_t(r) * OC + o], ref, 2e-6);  // ≤ C+1 fp32 roundings of O(1)
      }
  }
}

TEST_P(LayerOpsShapeTest, MatmulBackwardNullGradients) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C, OC = s.OC();
  const Vec inp = Uniform(size_t(N) * C, 9), w = Uniform(size_t(OC) * C, 10),
            dout = Uniform(size_t(N) * OC, 12);
  Vec dinp(inp.size()), dw(w.size()), db(OC), dw_only(w.size());
  MatmulBackward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  MatmulBackward<double>(nullptr, dw_only.data(), nullptr, dout.data(), inp.data(), w.data(), N,
                         C, OC);
  EXPECT_EQ(dw, dw_only);
}

// Attention against a direct transcription of softmax(q·kᵀ/√hs + causal mask)·v.
TEST_P(LayerOpsShapeTest, AttentionForwardMatchesNaiveAndIsCausal) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C, hs = C / s.NH, T = s.seq;
  Vec qkv = Uniform(size_t(N) * 3 * C, 13, -2, 2);
  Vec out(size_t(N) * C), att(size_t(s.B) * s.NH * T * T, std::nan(""));
  AttentionForward(out.data(), att.data(), qkv.data(), s.B, T, C, s.NH);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(size_t(b) * T + t) * 3 * C + part * C + h * hs + i];
  };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<long double> p(t + 1);
        long double mx = -1e300, sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          long double d = 0;
          for (int i = 0; i < hs; ++i) d += (long double)at(b, t, 0, h, i) * at(b, t2, 1, h, i);
          p[t2] = d / std::sqrt((long double)hs);
          mx = std::max(mx, p[t2]);
        }
        for (auto& x : p) sum += (x = std::exp(x - mx));
        const double* att_row = &att[((size_t(b) * s.NH + h) * T + t) * T];
        double row_sum = 0;
        for (int t2 = 0; t2 < T; ++t2) {
          row_sum += att_row[t2];
          if (t2 > t) {
            ASSERT_EQ(att_row[t2], 0.0);
          } else {
            ASSERT_NEAR(att_row[t2], double(p[t2] / sum), 1e-14);
          }
        }
        EXPECT_NEAR(row_sum, 1.0, 1e-14);
        for (int i = 0; i < hs; ++i) {
          long double ref = 0;
          for (int t2 = 0; t2 <= t; ++t2) ref += p[t2] / sum * at(b, t2, 2, h, i);
          ASSERT_NEAR(out[(size_t(b) * T + t) * C + h * hs + i], double(ref), 1e-14);
        }
      }
  // Causality: changing q, k, v at positions > t0 leaves rows ≤ t0 bit-identical.
  for (int t0 = 0; t0 + 1 < T; ++t0) {
    Vec qkv2 = qkv;
    for (int b = 0; b < s.B; ++b)
      for (int t = t0 + 1; t < T; ++t)
        for (int c = 0; c < 3 * C; ++c) qkv2[(size_t(b) * T + t) * 3 * C + c] += 0.5;
    Vec out2(out.size());
    AttentionForward(out2.data(), att.data(), qkv2.data(), s.B, T, C, s.NH);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < T; ++t) {
        const bool same = std::memcmp(&out[(size_t(b) * T + t) * C],
                                      &out2[(size_t(b) * T + t) * C], C * sizeof(double)) == 0;
        EXPECT_EQ(same, t <= t0) << "b " << b << " t " << t << " t0 " << t0;
      }
  }
}

TEST_P(LayerOpsShapeTest, CrossEntropyForward) {
  const Shape s = GetParam();
  const int N = s.N(), V = s.V;
  const auto targets = Ids(N, V, 20);
  // Uniform logits: every loss is log V, every prob 1/V (double and float).
  Vec logits(size_t(N) * V, 0.3), probs(logits.size()), losses(N);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  std::vector<float> logits_f(logits.size(), 0.3f), probs_f(logits.size()), losses_f(N);
  CrossEntropyForward(losses_f.data(), probs_f.data(), logits_f.data(), targets.data(), N, V);
  for (int r = 0; r < N; ++r) {
    EXPECT_NEAR(losses[r], std::log(double(V)), 1e-14);
    EXPECT_NEAR(losses_f[r], std::log(double(V)), 1e-6);
    for (int v = 0; v < V; ++v) EXPECT_NEAR(probs[size_t(r) * V + v], 1.0 / V, 1e-16);
  }
  // Random logits: rows sum to 1, loss = -log p[target]; in place gives the same bits.
  logits = Uniform(size_t(N) * V, 21, -3, 3);
  CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  Vec in_place = logits, losses2(N);
  CrossEntropyForward(losses2.data(), in_place.data(), in_place.data(), targets.data(), N, V);
  EXPECT_EQ(in_place, probs);
  EXPECT_EQ(losses2, losses);
  for (int r = 0; r < N; ++r) {
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += probs[size_t(r) * V + v];
    EXPECT_NEAR(sum, 1.0, 1e-14);
    EXPECT_NEAR(losses[r], -std::log(probs[size_t(r) * V + targets[r]]), 1e-14);
  }
}

TEST(LayerOpsTest, GeluForwardValues) {
  const Vec x = {0.0, 1.0, -1.0, 0.5, 8.0, -8.0, 30.0, -30.0};
  Vec out(x.size());
  GeluForward(out.data(), x.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref =
        0.5 * x[i] * (1 + std::tanh(std::sqrt(2 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
    EXPECT_NEAR(out[i], ref, 1e-15 * (1 + std::abs(ref))) << x[i];  // a few ulps
  }
  EXPECT_EQ(out[0], 0.0);
  EXPECT_NEAR(out[1], 0.8411919906082768, 1e-15);  // GELU_tanh(1)
  // float: the tails are exact and finite where exp overflows or the sigmoid saturates.
  std::vector<float> xf = {100.0f, -100.0f, 1e30f, -1e30f}, f(4), d(4, 0.0f), ones(4, 1.0f);
  GeluForward(f.data(), xf.data(), 4);
  GeluBackward(d.data(), xf.data(), ones.data(), 4);
  EXPECT_EQ(f, (std::vector<float>{100.0f, -0.0f, 1e30f, -0.0f}));
  EXPECT_EQ(d, (std::vector<float>{1.0f, 0.0f, 1.0f, 0.0f}));
}

TEST(LayerOpsTest, ResidualAlias) {
  const size_t n = 100003;
  Vec a = Uniform(n, 30), b = Uniform(n, 31), out(n);
  ResidualForward(out.data(), a.data(), b.data(), n);
  ResidualForward(a.data(), a.data(), b.data(), n);  // out aliases a
  EXPECT_EQ(a, out);
}

INSTANTIATE_TEST_SUITE_P(Shapes, LayerOpsShapeTest, ::testing::Values(kSmall, kOdd, kOddSeq3),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------- every op, float vs double

// Runs every forward and backward in T on fixed inputs; results by name.
template <typename T>
std::map<std::string, std::vector<T>> RunAll(const Shape& s, int threads) {
  const OpOptions o{.threads = threads};
  const int B = s.B, seq = s.seq, C = s.C, NH = s.NH, V = s.V, N = s.N(), OC = s.OC();
  const size_t NC = size_t(N) * C;
  const auto tokens = Ids(N, V, 40), targets = Ids(N, V, 41);
  std::map<std::string, std::vector<T>> r;
  auto in = [&](uint32_t seed, size_t n, double lo = -1, double hi = 1) {
    return Cast<T>(Uniform(n, seed, lo, hi));
  };
  auto zeros = [](size_t n) { return std::vector<T>(n, T(0)); };

  const auto wte = in(42, size_t(V) * C), wpe = in(43, size_t(seq) * C), d_nc = in(44, NC);
  r["enc_out"] = zeros(NC);
  EncoderForward(r["enc_out"].data(), tokens.data(), wte.data(), wpe.data(), B, seq, C, o);
  r["enc_dwte"] = zeros(wte.size());
  r["enc_dwpe"] = zeros(wpe.size());
  EncoderBackward(r["enc_dwte"].data(), r["enc_dwpe"].data(), d_nc.data(), tokens.data(), B, seq,
                  C, o);

  const auto x = in(45, NC, -2, 2), lw = in(46, C), lb = in(47, C);
  r["ln_out"] = zeros(NC);
  r["ln_mean"] = zeros(N);
  r["ln_rstd"] = zeros(N);
  LayerNormForward(r["ln_out"].data(), r["ln_mean"].data(), r["ln_rstd"].data(), x.data(),
                   lw.data(), lb.data(), N, C, o);
  r["ln_dinp"] = zeros(NC);
  r["ln_dw"] = zeros(C);
  r["ln_db"] = zeros(C);
  LayerNormBackward(r["ln_dinp"].data(), r["ln_dw"].data(), r["ln_db"].data(), d_nc.data(),
                    x.data(), lw.data(), r["ln_mean"].data(), r["ln_rstd"].data(), N, C, o);

  const auto mw = in(48, size_t(OC) * C), mb = in(49, OC), d_mm = in(50, size_t(N) * OC);
  r["mm_out"] = zeros(size_t(N) * OC);
  MatmulForward(r["mm_out"].data(), x.data(), mw.data(), mb.data(), N, C, OC, o);
  r["mm_dinp"] = zeros(NC);
  r["mm_dw"] = zeros(mw.size());
  r["mm_db"] = zeros(OC);
  MatmulBackward(r["mm_dinp"].data(), r["mm_dw"].data(), r["mm_db"].data(), d_mm.data(), x.data(),
                 mw.data(), N, C, OC, o);

  const auto qkv = in(51, 3 * NC, -2, 2);
  r["att_out"] = zeros(NC);
  r["att_att"] = zeros(size_t(B) * NH * seq * seq);
  AttentionForward(r["att_out"].data(), r["att_att"].data(), qkv.data(), B, seq, C, NH, o);
  r["att_dqkv"] = zeros(3 * NC);
  std::vector<T> scratch(AttentionBackwardScratchElems(B, seq, C, NH));
  AttentionBackward(r["att_dqkv"].data(), scratch.data(), d_nc.data(), qkv.data(),
                    r["att_att"].data(), B, seq, C, NH, o);

  const auto g = in(52, 4 * NC, -5, 5), dg = in(53, 4 * NC);
  r["gelu_out"] = zeros(4 * NC);
  GeluForward(r["gelu_out"].data(), g.data(), 4 * NC, o);
  r["gelu_dinp"] = zeros(4 * NC);
  GeluBackward(r["gelu_dinp"].data(), g.data(), dg.data(), 4 * NC, o);
  r["res_out"] = zeros(4 * NC);
  ResidualForward(r["res_out"].data(), g.data(), dg.data(), 4 * NC, o);
  r["add"] = g;
  AddInPlace(r["add"].data(), dg.data(), 4 * NC, o);

  const auto logits = in(54, size_t(N) * V, -3, 3), dloss = in(55, N);
  r["ce_loss"] = zeros(N);
  r["ce_probs"] = zeros(logits.size());
  CrossEntropyForward(r["ce_loss"].data(), r["ce_probs"].data(), logits.data(), targets.data(), N,
                      V, o);
  r["ce_dlogits"] = zeros(logits.size());
  CrossEntropyBackward(r["ce_dlogits"].data(), r["ce_probs"].data(), targets.data(), dloss.data(),
                       N, V, o);

  r["sumsq"] = {T(SumSquares(g.data(), g.size(), o))};
  return r;
}

// float against double on the same (float-representable) inputs. fp32's unit roundoff is
// 6e-8; the longest chains here are sums of ~N = 128 terms (dweight, dbias, dwpe) and C = 96
// (layernorm, matmul), whose error is bounded by ~n·u·Σ|terms|, about 1e-5 of the buffer's
// largest magnitude; the elementwise results are within a few ulps of their own magnitude.
TEST(LayerOpsTest, FloatMatchesDouble) {
  for (const Shape& s : {kSmall, kOdd, kOddSeq3, kWide}) {
    ExpectFloatMatchesDouble(RunAll<float>(s, 0), RunAll<double>(s, 0), s.name);
  }
}

// Two runs give the same bits, and 1 and 2 oneTBB threads too (GEMMs included).
TEST(LayerOpsTest, Deterministic) {
  for (const Shape& s : {kSmall, kWide}) {
    const auto a = RunAll<float>(s, 2);
    ExpectSameBits(a, RunAll<float>(s, 2), "run to run");
    ExpectSameBits(a, RunAll<float>(s, 1), "2 threads against 1");
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
