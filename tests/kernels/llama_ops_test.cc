// Tests of kernels/cpu/llama_ops.h: every backward against central finite differences (double),
// forwards against naive references (grouped-query attention against the same attention with
// the key/value heads repeated, as HF's repeat_kv does; RoPE against rotate_half written out),
// the rope frequencies (default and llama3) and their refusals, float against double, and
// determinism run to run and across thread counts. The comparison with PyTorch is in
// llama_ops_torch_test.cc.
#include "kernels/cpu/llama_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numbers>
#include <ostream>
#include <string>
#include <vector>

#include "tests/kernels/grad_check.h"

namespace zinf::kernels::cpu {
namespace {

struct Shape {
  const char* name;
  int B, seq, H, KV, d, I;
  int N() const { return B * seq; }
  int W() const { return (H + 2 * KV) * d; }  // a qkv row
  int C() const { return H * d + 3; }         // an RMSNorm width that is no multiple of 8
};
void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

constexpr Shape kGqa{"Gqa", 2, 5, 4, 2, 4, 6};      // two query heads a key/value head
constexpr Shape kMqa{"Mqa", 1, 4, 3, 1, 6, 5};      // one key/value head for all
constexpr Shape kMha{"Mha", 2, 3, 2, 2, 2, 3};      // as many as query heads (GPT-2's case)
constexpr Shape kOne{"OnePosition", 3, 1, 2, 1, 4, 2};
constexpr Shape kWide{"Wide", 3, 24, 8, 2, 16, 40};  // several chunks of every split

// Rope tables for the shape (theta 10000), in T.
template <typename T>
void Tables(const Shape& s, std::vector<T>* cos, std::vector<T>* sin) {
  auto inv = RopeInvFreq(s.d, 10000.0, {});
  ASSERT_TRUE(inv.ok());
  cos->resize(size_t(s.seq) * s.d / 2);
  sin->resize(cos->size());
  RopeTables(cos->data(), sin->data(), *inv, s.seq);
}

class LlamaOpsShapeTest : public ::testing::TestWithParam<Shape> {};

TEST_P(LlamaOpsShapeTest, RmsNormGradient) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C();
  GradCase c{{Uniform(size_t(N) * C, 1, -2, 2), Uniform(C, 2, 0.5, 1.5)},
             [&](const Buffers& in) {
               Vec out(size_t(N) * C), rstd(N);
               RmsNormForward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, 1e-5);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               Vec out(size_t(N) * C), rstd(N);
               RmsNormForward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, 1e-5);
               RmsNormBackward(g[0].data(), g[1].data(), dout.data(), in[0].data(), in[1].data(),
                               rstd.data(), N, C);
             }};
  CheckGradients(c, 3);
}

TEST_P(LlamaOpsShapeTest, RopeGradient) {
  const Shape s = GetParam();
  Vec cos, sin;
  Tables(s, &cos, &sin);
  GradCase c{{Uniform(size_t(s.N()) * s.W(), 4)},
             [&](const Buffers& in) {
               Vec qkv = in[0];
               RopeForward(qkv.data(), cos.data(), sin.data(), s.B, s.seq, s.H, s.KV, s.d);
               return qkv;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               // RopeBackward rotates in place: accumulate its result as the other ops do.
               Vec d = dout;
               RopeBackward(d.data(), cos.data(), sin.data(), s.B, s.seq, s.H, s.KV, s.d);
               for (size_t i = 0; i < d.size(); ++i) g[0][i] += d[i];
             }};
  CheckGradients(c, 5);
}

TEST_P(LlamaOpsShapeTest, AttentionGradient) {
  const Shape s = GetParam();
  const size_t out_n = size_t(s.N()) * s.H * s.d, att_n = size_t(s.B) * s.H * s.seq * s.seq;
  GradCase c{{Uniform(size_t(s.N()) * s.W(), 6, -2, 2)},
             [&](const Buffers& in) {
               Vec out(out_n), att(att_n);
               CausalAttentionForward(out.data(), att.data(), in[0].data(), s.B, s.seq, s.H,
                                      s.KV, s.d);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               Vec out(out_n), att(att_n);
               CausalAttentionForward(out.data(), att.data(), in[0].data(), s.B, s.seq, s.H,
                                      s.KV, s.d);
               Vec scratch(CausalAttentionScratchElems(s.B, s.seq, s.KV), 1e300);
               CausalAttentionBackward(g[0].data(), scratch.data(), dout.data(), in[0].data(),
                                       att.data(), s.B, s.seq, s.H, s.KV, s.d);
             }};
  CheckGradients(c, 7);
}

TEST_P(LlamaOpsShapeTest, SwiGluGradient) {
  const Shape s = GetParam();
  const int N = s.N(), I = s.I;
  GradCase c{{Uniform(size_t(N) * 2 * I, 8, -4, 4)},
             [&](const Buffers& in) {
               Vec out(size_t(N) * I);
               SwiGluForward(out.data(), in[0].data(), N, I);
               return out;
             },
             [&](const Buffers& in, const Vec& dout, Buffers& g) {
               SwiGluBackward(g[0].data(), dout.data(), in[0].data(), N, I);
             }};
  CheckGradients(c, 9);
}

// Grouped-query attention equals the same attention on q, k, v with each key/value head
// repeated H/KV times (query head h reads key/value head h / (H/KV)), probabilities included.
TEST_P(LlamaOpsShapeTest, GroupedQueryAttentionIsRepeatedKeyValueHeads) {
  const Shape s = GetParam();
  const int N = s.N(), H = s.H, KV = s.KV, d = s.d, rep = H / KV;
  const Vec qkv = Uniform(size_t(N) * s.W(), 10, -2, 2);
  Vec full(size_t(N) * 3 * H * d);
  for (int r = 0; r < N; ++r) {
    const double* src = qkv.data() + size_t(r) * s.W();
    double* dst = full.data() + size_t(r) * 3 * H * d;
    std::memcpy(dst, src, sizeof(double) * H * d);  // q
    for (int h = 0; h < H; ++h) {
      const int g = h / rep;
      std::memcpy(dst + (H + h) * d, src + (H + g) * d, sizeof(double) * d);       // k
      std::memcpy(dst + (2 * H + h) * d, src + (H + KV + g) * d, sizeof(double) * d);  // v
    }
  }
  const size_t out_n = size_t(N) * H * d, att_n = size_t(s.B) * H * s.seq * s.seq;
  Vec out(out_n), att(att_n), out_full(out_n), att_full(att_n);
  CausalAttentionForward(out.data(), att.data(), qkv.data(), s.B, s.seq, H, KV, d);
  CausalAttentionForward(out_full.data(), att_full.data(), full.data(), s.B, s.seq, H, H, d);
  for (size_t i = 0; i < out_n; ++i) ASSERT_EQ(out[i], out_full[i]) << i;
  for (size_t i = 0; i < att_n; ++i) ASSERT_EQ(att[i], att_full[i]) << i;
  // Causal: nothing above the diagonal, rows of probabilities that sum to 1.
  for (size_t row = 0; row < size_t(s.B) * H * s.seq; ++row) {
    const int t = int(row % s.seq);
    double sum = 0;
    for (int t2 = 0; t2 < s.seq; ++t2) {
      const double p = att[row * s.seq + t2];
      if (t2 > t) {
        ASSERT_EQ(p, 0.0);
      }
      sum += p;
    }
    ASSERT_NEAR(sum, 1.0, 1e-12);
  }
}

// x' = x·cos + rotate_half(x)·sin with rotate_half(x) = (−x[d/2:], x[:d/2]) and the angle
// position · theta^(−2i/d) for both elements i and i + d/2; v untouched.
TEST_P(LlamaOpsShapeTest, RopeIsRotateHalf) {
  const Shape s = GetParam();
  Vec cos, sin;
  Tables(s, &cos, &sin);
  const Vec x = Uniform(size_t(s.N()) * s.W(), 11);
  Vec y = x;
  RopeForward(y.data(), cos.data(), sin.data(), s.B, s.seq, s.H, s.KV, s.d);
  const int half = s.d / 2;
  for (int r = 0; r < s.N(); ++r) {
    const int pos = r % s.seq;
    for (int j = 0; j < s.H + 2 * s.KV; ++j) {
      const double* xh = x.data() + size_t(r) * s.W() + j * s.d;
      const double* yh = y.data() + size_t(r) * s.W() + j * s.d;
      for (int i = 0; i < s.d; ++i) {
        if (j >= s.H + s.KV) {  // v
          ASSERT_EQ(yh[i], xh[i]);
          continue;
        }
        const int k = i % half;
        const double angle = pos * std::pow(10000.0, -2.0 * k / s.d);
        const double rot = i < half ? -xh[i + half] : xh[i - half];
        // The tables hold float32 angles and values (as HF's): a few float ulps of |x|.
        ASSERT_NEAR(yh[i], xh[i] * std::cos(angle) + rot * std::sin(angle),
                    (1 + pos) * 4e-7)
            << "row " << r << " head " << j << " element " << i;
      }
    }
  }
}

TEST_P(LlamaOpsShapeTest, RmsNormForwardMatchesNaive) {
  const Shape s = GetParam();
  const int N = s.N(), C = s.C();
  const Vec x = Uniform(size_t(N) * C, 12, -3, 3), w = Uniform(C, 13);
  Vec out(x.size()), rstd(N);
  RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  for (int r = 0; r < N; ++r) {
    double ms = 0;
    for (int i = 0; i < C; ++i) ms += x[r * C + i] * x[r * C + i];
    const double inv = 1 / std::sqrt(ms / C + 1e-6);
    ASSERT_NEAR(rstd[r], inv, 1e-14 * inv);
    for (int i = 0; i < C; ++i)
      ASSERT_NEAR(out[r * C + i], x[r * C + i] * inv * w[i], 1e-13) << r << "," << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, LlamaOpsShapeTest,
                         ::testing::Values(kGqa, kMqa, kMha, kOne),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------- rope frequencies

TEST(RopeInvFreqTest, DefaultIsThetaToTheMinusTwoIOverD) {
  for (double theta : {10000.0, 500000.0}) {
    auto inv = RopeInvFreq(128, theta, {});
    ASSERT_TRUE(inv.ok());
    ASSERT_EQ(inv->size(), 64u);
    for (size_t i = 0; i < inv->size(); ++i) {
      const double want = std::pow(theta, -2.0 * double(i) / 128);
      ASSERT_NEAR((*inv)[i], want, 2e-7 * want) << i;  // float32, as HF's buffer
    }
  }
}

// Llama 3.1's scaling (factor 8, low 1, high 4, original 8192, theta 500000, d 128): the
// wavelengths below 8192/4 keep their frequency, those above 8192 are divided by 8, and those
// between are interpolated: (1 − s)·f/8 + s·f with s = (8192/wavelength − 1)/(4 − 1).
TEST(RopeInvFreqTest, Llama3ScalingByWavelength) {
  const RopeScaling sc{.kind = "llama3", .factor = 8, .low_freq_factor = 1,
                       .high_freq_factor = 4, .original_max_position_embeddings = 8192};
  auto base = RopeInvFreq(128, 500000.0, {});
  auto scaled = RopeInvFreq(128, 500000.0, sc);
  ASSERT_TRUE(base.ok() && scaled.ok());
  int high = 0, low = 0, medium = 0;
  for (size_t i = 0; i < base->size(); ++i) {
    const double f = (*base)[i], wavelen = 2 * std::numbers::pi / f;
    double want;
    if (wavelen < 8192.0 / 4) {
      want = f;
      ++high;
    } else if (wavelen > 8192.0) {
      want = f / 8;
      ++low;
    } else {
      const double sm = (8192.0 / wavelen - 1) / 3;
      want = (1 - sm) * f / 8 + sm * f;
      ++medium;
    }
    ASSERT_NEAR((*scaled)[i], want, 1e-6 * want) << i;
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(RopeInvFreqTest, RefusesWhatItCannotCompute) {
  RopeScaling yarn;
  yarn.kind = "yarn";
  auto r = RopeInvFreq(64, 10000.0, yarn);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("\"yarn\""), std::string::npos) << r.status().message();
  EXPECT_FALSE(RopeInvFreq(63, 10000.0, {}).ok());
  EXPECT_FALSE(RopeInvFreq(0, 10000.0, {}).ok());
  EXPECT_FALSE(RopeInvFreq(64, 0.0, {}).ok());
  EXPECT_FALSE(RopeInvFreq(64, std::nan(""), {}).ok());
  RopeScaling bad{.kind = "llama3", .factor = 8, .low_freq_factor = 4, .high_freq_factor = 1};
  EXPECT_FALSE(RopeInvFreq(64, 10000.0, bad).ok());
}

// ---------------------------------------------------------------- every op, float vs double

template <typename T>
std::map<std::string, std::vector<T>> RunAll(const Shape& s, int threads) {
  const OpOptions o{.threads = threads};
  const int N = s.N(), C = s.C(), W = s.W(), I = s.I;
  std::map<std::string, std::vector<T>> r;
  auto in = [&](uint32_t seed, size_t n, double lo = -1, double hi = 1) {
    const Vec v = Uniform(n, seed, lo, hi);
    return std::vector<T>(v.begin(), v.end());
  };
  auto zeros = [](size_t n) { return std::vector<T>(n, T(0)); };

  const auto x = in(20, size_t(N) * C, -2, 2), w = in(21, C), dx = in(22, size_t(N) * C);
  r["rms_out"] = zeros(x.size());
  r["rms_rstd"] = zeros(N);
  RmsNormForward(r["rms_out"].data(), r["rms_rstd"].data(), x.data(), w.data(), N, C, 1e-5, o);
  r["rms_dinp"] = zeros(x.size());
  r["rms_dw"] = zeros(C);
  RmsNormBackward(r["rms_dinp"].data(), r["rms_dw"].data(), dx.data(), x.data(), w.data(),
                  r["rms_rstd"].data(), N, C, o);

  std::vector<T> cos, sin;
  Tables(s, &cos, &sin);
  r["rope"] = in(23, size_t(N) * W, -2, 2);
  RopeForward(r["rope"].data(), cos.data(), sin.data(), s.B, s.seq, s.H, s.KV, s.d, o);
  r["rope_back"] = in(24, size_t(N) * W);
  RopeBackward(r["rope_back"].data(), cos.data(), sin.data(), s.B, s.seq, s.H, s.KV, s.d, o);

  const size_t out_n = size_t(N) * s.H * s.d;
  const auto dout = in(25, out_n);
  r["att_out"] = zeros(out_n);
  r["att_att"] = zeros(size_t(s.B) * s.H * s.seq * s.seq);
  CausalAttentionForward(r["att_out"].data(), r["att_att"].data(), r["rope"].data(), s.B, s.seq,
                         s.H, s.KV, s.d, o);
  r["att_dqkv"] = zeros(size_t(N) * W);
  std::vector<T> scratch(CausalAttentionScratchElems(s.B, s.seq, s.KV));
  CausalAttentionBackward(r["att_dqkv"].data(), scratch.data(), dout.data(), r["rope"].data(),
                          r["att_att"].data(), s.B, s.seq, s.H, s.KV, s.d, o);

  const auto gu = in(26, size_t(N) * 2 * I, -5, 5), dm = in(27, size_t(N) * I);
  r["swiglu_out"] = zeros(size_t(N) * I);
  SwiGluForward(r["swiglu_out"].data(), gu.data(), N, I, o);
  r["swiglu_dgu"] = zeros(gu.size());
  SwiGluBackward(r["swiglu_dgu"].data(), dm.data(), gu.data(), N, I, o);
  return r;
}

// float against double on the same inputs: the longest sums are over C (RMSNorm), d and seq
// (attention) and N (dweight), about 1e-5 of the buffer's largest magnitude in float32.
TEST(LlamaOpsTest, FloatMatchesDouble) {
  for (const Shape& s : {kGqa, kMqa, kMha, kOne, kWide}) {
    ExpectFloatMatchesDouble(RunAll<float>(s, 0), RunAll<double>(s, 0), s.name);
  }
}

// Two runs give the same bits, and 1 and 2 oneTBB threads too.
TEST(LlamaOpsTest, Deterministic) {
  for (const Shape& s : {kGqa, kWide}) {
    const auto a = RunAll<float>(s, 2);
    ExpectSameBits(a, RunAll<float>(s, 2), "run to run");
    ExpectSameBits(a, RunAll<float>(s, 1), "2 threads against 1");
  }
}

}  // namespace
}  // namespace zinf::kernels::cpu
