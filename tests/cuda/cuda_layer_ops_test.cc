// The CUDA ops (kernels/cuda/layer_ops.h) against the CPU ops (kernels/cpu/layer_ops.h) on
// random inputs. Every test needing a GPU skips when none answers (src/base/cuda_probe.h).
//
// Tolerances: |gpu - cpu| <= atol + rtol·|cpu| per element, stated per check:
// - exact (0, 0): encoder forward/backward (same additions in the same order), residual, add,
//   fill, scale, and the 16-bit conversions (compared bit for bit);
// - fp32 GEMMs (GemmPrecision::kFp32) and the non-GEMM ops: about 1e-5 relative, looser where
//   long sums meet cancellation (backward reductions over rows);
// - bf16 tensor cores (GemmPrecision::kBf16): each product carries up to 2^-8 relative error
//   from rounding both inputs, so the GEMM outputs get atol = 2^-7·sqrt(K)·max|a|·max|b| (a
//   statistical bound, ~6σ for random signs) and rtol 1e-2.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/grad_ops.h"
#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cuda/layer_ops.h"
#include "src/base/cuda_probe.h"

namespace zinf::kernels {
namespace {

namespace gpu = ::zinf::kernels::cuda;

struct Tol {
  double atol;
  double rtol;
};
constexpr Tol kExact{0.0, 0.0};

// Device copy of a host vector; reports CUDA failures as test failures.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(1, n) * sizeof(T)),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(ptr_, 0, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() { return ptr_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> RandomTokens(size_t n, int V, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// Expects |got - want| <= atol + rtol·|want| everywhere; reports the count and the worst.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, Tol tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double limit = tol.atol + tol.rtol * std::fabs(want[i]);
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    const bool ok = diff <= limit || got[i] == want[i] ||  // == covers equal infinities
                    (std::isnan(got[i]) && std::isnan(want[i]));
    if (ok) continue;
    ++bad;
    const double excess = std::isnan(diff) ? INFINITY : diff - limit;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements outside atol " << tol.atol << " + rtol " << tol.rtol
                     << "·|ref|; worst at " << worst << ": gpu " << got[worst] << " cpu "
                     << want[worst];
}

void ExpectBitwiseEqual(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

// The bf16 tensor-core GEMM bound of the file comment.
Tol Bf16GemmTol(int K, double max_a, double max_b) {
  return {std::ldexp(1.0, -7) * std::sqrt(static_cast<double>(K)) * max_a * max_b, 1e-2};
}

#define ZINF_EXPECT_OK(expr)                          \
  do {                                                \
    ::zinf::Status s_ = (expr);                       \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

class CudaLayerOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe probe = ProbeCuda();
    if (probe.device_count == 0) GTEST_SKIP() << "no GPU answers: " << probe.detail;
    auto handle = gpu::CublasHandle::Create(gpu::GemmPrecision::kFp32);
    ASSERT_TRUE(handle.ok()) << handle.status().ToString();
    cublas_ = std::move(*handle);
  }

  gpu::CublasHandle& cublas() { return *cublas_; }

  std::mt19937 rng_{20240611};
  std::unique_ptr<gpu::CublasHandle> cublas_;
};

// ---- Checks that need no GPU ---------------------------------------------------------------

TEST(CudaLayerOpsNoGpuTest, BadShapesAreRefusedBeforeAnyLaunch) {
  Status s = gpu::LayerNormForward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, -1, 4,
                                   nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("LayerNormForward"), std::string::npos) << s.ToString();
  s = gpu::EncoderForward(nullptr, nullptr, nullptr, nullptr, 2, -3, 8, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  s = gpu::CrossEntropyForward(nullptr, nullptr, nullptr, nullptr, 4, 0, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  // Empty shapes enqueue nothing and succeed, with or without a GPU.
  EXPECT_TRUE(gpu::GeluForward(nullptr, nullptr, 0, nullptr).ok());
}

TEST(CudaLayerOpsNoGpuTest, CublasHandleFailsCleanlyWithoutGpu) {
  const CudaProbe probe = ProbeCuda();
  if (probe.device_count > 0) GTEST_SKIP() << "a GPU answers: " << probe.detail;
  auto handle = gpu::CublasHandle::Create();
  EXPECT_FALSE(handle.ok());
  if (!handle.ok()) {
    EXPECT_NE(handle.status().message().find("cublasCreate"), std::string::npos)
        << handle.status().ToString();
  }
}

// ---- Embedding -------------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, EncoderMatchesCpuExactly) {
  const int B = 3, seq = 50, C = 200, V = 11;  // few tokens: many repeats in the backward
  const size_t N = static_cast<size_t>(B) * seq;
  auto tokens = RandomTokens(N, V, rng_);
  auto wte = Random(static_cast<size_t>(V) * C, rng_);
  auto wpe = Random(static_cast<size_t>(seq) * C, rng_);
  auto dout = Random(N * C, rng_);
  auto dwte = Random(wte.size(), rng_);  // non-zero: the backward accumulates
  auto dwpe = Random(wpe.size(), rng_);

  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_wte(wte), d_wpe(wpe), d_out(N * C), d_dout(dout), d_dwte(dwte),
      d_dwpe(dwpe);
  ZINF_EXPECT_OK(gpu::EncoderForward(d_out.get(), d_tokens.get(), d_wte.get(), d_wpe.get(), B,
                                     seq, C, nullptr));
  ZINF_EXPECT_OK(gpu::EncoderBackward(d_dwte.get(), d_dwpe.get(), d_dout.get(), d_tokens.get(),
                                      B, seq, C, nullptr));
  std::vector<float> out(N * C);
  cpu::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, seq, C);
  cpu::EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, seq, C);
  ExpectClose(d_out.ToHost(), out, kExact, "EncoderForward out");
  ExpectClose(d_dwte.ToHost(), dwte, kExact, "EncoderBackward dwte");
  ExpectClose(d_dwpe.ToHost(), dwpe, kExact, "EncoderBackward dwpe");
}

// ---- LayerNorm -------------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, LayerNormMatchesCpu) {
  for (const int C : {768, 100}) {
    SCOPED_TRACE("C=" + std::to_string(C));
    const int N = 70;
    auto inp = Random(static_cast<size_t>(N) * C, rng_, -3.0f, 3.0f);
    auto weight = Random(C, rng_, 0.5f, 1.5f);
    auto bias = Random(C, rng_);
    auto dout = Random(inp.size(), rng_);
    auto dinp = Random(inp.size(), rng_);
    auto dweight = Random(C, rng_);
    auto dbias = Random(C, rng_);

    DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(inp.size()), d_mean(N),
        d_rstd(N), d_dout(dout), d_dinp(dinp), d_dw(dweight), d_db(dbias);
    ZINF_EXPECT_OK(gpu::LayerNormForward(d_out.get(), d_mean.get(), d_rstd.get(), d_inp.get(),
                                         d_w.get(), d_b.get(), N, C, nullptr));
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                          bias.data(), N, C);
    ExpectClose(d_out.ToHost(), out, {1e-5, 1e-5}, "LayerNormForward out");
    ExpectClose(d_mean.ToHost(), mean, {1e-6, 1e-5}, "LayerNormForward mean");
    ExpectClose(d_rstd.ToHost(), rstd, {1e-6, 1e-5}, "LayerNormForward rstd");

    // Backward from the CPU's saved statistics, so only the backward is compared.
    DeviceBuffer<float> d_mean_ref(mean), d_rstd_ref(rstd);
    ZINF_EXPECT_OK(gpu::LayerNormBackward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(),
                                          d_inp.get(), d_w.get(), d_mean_ref.get(),
                                          d_rstd_ref.get(), N, C, nullptr));
    cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                           weight.data(), mean.data(), rstd.data(), N, C);
    ExpectClose(d_dinp.ToHost(), dinp, {2e-5, 1e-4}, "LayerNormBackward dinp");
    ExpectClose(d_dw.ToHost(), dweight, {1e-4, 1e-4}, "LayerNormBackward dweight");
    ExpectClose(d_db.ToHost(), dbias, {1e-4, 1e-4}, "LayerNormBackward dbias");
  }
}

// ---- Linear ----------------------------------------------------------------------------------

struct MatmulCase {
  int N, C, OC;
  bool bias;
};

void RunMatmul(gpu::CublasHandle& cublas, std::mt19937& rng, const MatmulCase& mc, Tol fwd_tol,
               Tol dinp_tol, Tol dweight_tol, Tol dbias_tol) {
  const int N = mc.N, C = mc.C, OC = mc.OC;
  auto inp = Random(static_cast<size_t>(N) * C, rng);
  auto weight = Random(static_cast<size_t>(OC) * C, rng);
  auto bias = Random(OC, rng);
  auto dout = Random(static_cast<size_t>(N) * OC, rng);
  auto dinp = Random(inp.size(), rng);
  auto dweight = Random(weight.size(), rng);
  auto dbias = Random(OC, rng);
  const float* bias_h = mc.bias ? bias.data() : nullptr;

  DeviceBuffer<float> d_inp(inp), d_w(weight), d_b(bias), d_out(static_cast<size_t>(N) * OC),
      d_dout(dout), d_dinp(dinp), d_dw(dweight), d_db(dbias);
  ZINF_EXPECT_OK(gpu::MatmulForward(d_out.get(), d_inp.get(), d_w.get(),
                                    mc.bias ? d_b.get() : nullptr, N, C, OC, cublas, nullptr));
  ZINF_EXPECT_OK(gpu::MatmulBackward(d_dinp.get(), d_dw.get(), d_db.get(), d_dout.get(),
                                     d_inp.get(), d_w.get(), N, C, OC, cublas, nullptr));
  std::vector<float> out(static_cast<size_t>(N) * OC);
  cpu::MatmulForward(out.data(), inp.data(), weight.data(), bias_h, N, C, OC);
  cpu::MatmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                      weight.data(), N, C, OC);
  ExpectClose(d_out.ToHost(), out, fwd_tol, "MatmulForward out");
  ExpectClose(d_dinp.ToHost(), dinp, dinp_tol, "MatmulBackward dinp");
  ExpectClose(d_dw.ToHost(), dweight, dweight_tol, "MatmulBackward dweight");
  ExpectClose(d_db.ToHost(), dbias, dbias_tol, "MatmulBackward dbias");
}

TEST_F(CudaLayerOpsTest, MatmulMatchesCpuInFp32) {
  for (const MatmulCase& mc : {MatmulCase{96, 160, 200, true}, MatmulCase{33, 77, 50, false}}) {
    SCOPED_TRACE("N=" + std::to_string(mc.N) + " C=" + std::to_string(mc.C));
    RunMatmul(cublas(), rng_, mc, {1e-4, 1e-4}, {1e-4, 1e-4}, {1e-4, 1e-4}, {1e-4, 1e-4});
  }
}

TEST_F(CudaLayerOpsTest, MatmulMatchesCpuWithBf16TensorCores) {
  cublas().set_precision(gpu::GemmPrecision::kBf16);
  const MatmulCase mc{128, 256, 192, true};
  // Inputs in [-1, 1]. K: out sums over C, dinp over OC, dweight over N.
  RunMatmul(cublas(), rng_, mc, Bf16GemmTol(mc.C, 1, 1), Bf16GemmTol(mc.OC, 1, 1),
            Bf16GemmTol(mc.N, 1, 1), {1e-4, 1e-4});
}

TEST_F(CudaLayerOpsTest, MatmulBackwardSkipsNullGradients) {
  const int N = 16, C = 24, OC = 40;
  auto inp = Random(static_cast<size_t>(N) * C, rng_);
  auto weight = Random(static_cast<size_t>(OC) * C, rng_);
  auto dout = Random(static_cast<size_t>(N) * OC, rng_);
  std::vector<float> dweight(weight.size(), 0.0f);
  DeviceBuffer<float> d_inp(inp), d_w(weight), d_dout(dout), d_dw(dweight);
  ZINF_EXPECT_OK(gpu::MatmulBackward(nullptr, d_dw.get(), nullptr, d_dout.get(), d_inp.get(),
                                     d_w.get(), N, C, OC, cublas(), nullptr));
  cpu::MatmulBackward<float>(nullptr, dweight.data(), nullptr, dout.data(), inp.data(),
                             weight.data(), N, C, OC);
  ExpectClose(d_dw.ToHost(), dweight, {1e-5, 1e-5}, "MatmulBackward dweight only");
}

// ---- Attention -------------------------------------------------------------------------------

struct AttentionResult {
  std::vector<float> out, att, dqkv;
};

AttentionResult RunGpuAttention(gpu::CublasHandle& cublas, const std::vector<float>& qkv,
                                const std::vector<float>& dout, const std::vector<float>& dqkv0,
                                int B, int seq, int C, int NH) {
  const size_t n = static_cast<size_t>(B) * seq * C;
  const size_t att_n = static_cast<size_t>(B) * NH * seq * seq;
  DeviceBuffer<float> d_qkv(qkv), d_out(n), d_dout(dout), d_dqkv(dqkv0);
  DeviceBuffer<float> d_att(std::vector<float>(att_n, 7.0f));  // garbage above the diagonal
  DeviceBuffer<float> fwd_scratch(gpu::AttentionForwardScratchElems(B, seq, C, NH));
  DeviceBuffer<float> bwd_scratch(gpu::AttentionBackwardScratchElems(B, seq, C, NH));
  ZINF_EXPECT_OK(gpu::AttentionForward(d_out.get(), d_att.get(), fwd_scratch.get(), d_qkv.get(),
                                       B, seq, C, NH, cublas, nullptr));
  ZINF_EXPECT_OK(gpu::AttentionBackward(d_dqkv.get(), bwd_scratch.get(), d_dout.get(),
                                        d_qkv.get(), d_att.get(), B, seq, C, NH, cublas,
                                        nullptr));
  return {d_out.ToHost(), d_att.ToHost(), d_dqkv.ToHost()};
}

void RunAttentionCase(gpu::CublasHandle& cublas, std::mt19937& rng, int B, int seq, int C,
                      int NH, Tol out_tol, Tol att_tol, Tol dqkv_tol) {
  const size_t n = static_cast<size_t>(B) * seq * C;
  auto qkv = Random(3 * n, rng, -2.0f, 2.0f);
  auto dout = Random(n, rng);
  auto dqkv = Random(3 * n, rng);
  AttentionResult got = RunGpuAttention(cublas, qkv, dout, dqkv, B, seq, C, NH);

  std::vector<float> out(n), att(static_cast<size_t>(B) * NH * seq * seq);
  std::vector<float> scratch(cpu::AttentionBackwardScratchElems(B, seq, C, NH));
  cpu::AttentionForward(out.data(), att.data(), qkv.data(), B, seq, C, NH);
  cpu::AttentionBackward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B,
                         seq, C, NH);
  ExpectClose(got.out, out, out_tol, "AttentionForward out");
  ExpectClose(got.att, att, att_tol, "AttentionForward att");
  ExpectClose(got.dqkv, dqkv, dqkv_tol, "AttentionBackward dqkv");
}

TEST_F(CudaLayerOpsTest, AttentionMatchesCpuInFp32) {
  RunAttentionCase(cublas(), rng_, 2, 64, 96, 4, {1e-5, 1e-4}, {1e-6, 1e-4}, {1e-4, 1e-3});
  RunAttentionCase(cublas(), rng_, 1, 37, 40, 2, {1e-5, 1e-4}, {1e-6, 1e-4}, {1e-4, 1e-3});
}

TEST_F(CudaLayerOpsTest, AttentionMatchesCpuWithBf16TensorCores) {
  cublas().set_precision(gpu::GemmPrecision::kBf16);
  // hs = 32: q·kᵀ of |q|,|k| <= 2 sums 32 products; errors then pass through the softmax.
  RunAttentionCase(cublas(), rng_, 2, 64, 128, 4, {3e-2, 2e-2}, {1e-2, 5e-2}, {5e-2, 5e-2});
}

// ---- Elementwise -----------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, GeluMatchesCpu) {
  const size_t n = 10007;
  auto inp = Random(n, rng_, -6.0f, 6.0f);
  auto dout = Random(n, rng_);
  auto dinp = Random(n, rng_);
  DeviceBuffer<float> d_inp(inp), d_out(n), d_dout(dout), d_dinp(dinp);
  ZINF_EXPECT_OK(gpu::GeluForward(d_out.get(), d_inp.get(), n, nullptr));
  ZINF_EXPECT_OK(gpu::GeluBackward(d_dinp.get(), d_inp.get(), d_dout.get(), n, nullptr));
  std::vector<float> out(n);
  cpu::GeluForward(out.data(), inp.data(), n);
  cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  ExpectClose(d_out.ToHost(), out, {1e-6, 1e-5}, "GeluForward");
  ExpectClose(d_dinp.ToHost(), dinp, {1e-6, 1e-5}, "GeluBackward");
}

TEST_F(CudaLayerOpsTest, ResidualAddFillScaleAreExact) {
  const size_t n = 5001;
  auto a = Random(n, rng_);
  auto b = Random(n, rng_);
  DeviceBuffer<float> d_a(a), d_b(b), d_out(n), d_x(a);
  ZINF_EXPECT_OK(gpu::ResidualForward(d_out.get(), d_a.get(), d_b.get(), n, nullptr));
  ZINF_EXPECT_OK(gpu::ResidualForward(d_a.get(), d_a.get(), d_b.get(), n, nullptr));  // aliased
  ZINF_EXPECT_OK(gpu::AddInPlace(d_b.get(), d_out.get(), n, nullptr));
  ZINF_EXPECT_OK(gpu::Scale(d_x.get(), -0.375f, n, nullptr));
  std::vector<float> out(n), sum_again(b);
  cpu::ResidualForward(out.data(), a.data(), b.data(), n);
  cpu::AddInPlace(sum_again.data(), out.data(), n);
  std::vector<float> scaled(a);
  for (float& v : scaled) v *= -0.375f;
  ExpectClose(d_out.ToHost(), out, kExact, "ResidualForward");
  ExpectClose(d_a.ToHost(), out, kExact, "ResidualForward aliased");
  ExpectClose(d_b.ToHost(), sum_again, kExact, "AddInPlace");
  ExpectClose(d_x.ToHost(), scaled, kExact, "Scale");
  ZINF_EXPECT_OK(gpu::Fill(d_x.get(), 2.5f, n, nullptr));
  ExpectClose(d_x.ToHost(), std::vector<float>(n, 2.5f), kExact, "Fill");
}

// ---- Loss ------------------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, CrossEntropyMatchesCpu) {
  const int N = 12, V = 1003;
  auto logits = Random(static_cast<size_t>(N) * V, rng_, -8.0f, 8.0f);
  auto targets = RandomTokens(N, V, rng_);
  auto dloss = Random(N, rng_, 0.01f, 0.2f);
  auto dlogits = Random(logits.size(), rng_);
  DeviceBuffer<float> d_logits(logits), d_probs(logits.size()), d_losses(N), d_dloss(dloss),
      d_dlogits(dlogits), d_inplace(logits), d_losses2(N);
  DeviceBuffer<int32_t> d_targets(targets);
  ZINF_EXPECT_OK(gpu::CrossEntropyForward(d_losses.get(), d_probs.get(), d_logits.get(),
                                          d_targets.get(), N, V, nullptr));
  ZINF_EXPECT_OK(gpu::CrossEntropyForward(d_losses2.get(), d_inplace.get(), d_inplace.get(),
                                          d_targets.get(), N, V, nullptr));
  ZINF_EXPECT_OK(gpu::CrossEntropyBackward(d_dlogits.get(), d_probs.get(), d_targets.get(),
                                           d_dloss.get(), N, V, nullptr));
  std::vector<float> probs(logits.size()), losses(N);
  cpu::CrossEntropyForward(losses.data(), probs.data(), logits.data(), targets.data(), N, V);
  cpu::CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), dloss.data(), N, V);
  ExpectClose(d_losses.ToHost(), losses, {1e-5, 1e-5}, "CrossEntropyForward losses");
  ExpectClose(d_probs.ToHost(), probs, {1e-8, 1e-5}, "CrossEntropyForward probs");
  ExpectClose(d_losses2.ToHost(), losses, {1e-5, 1e-5}, "CrossEntropyForward losses in place");
  ExpectClose(d_inplace.ToHost(), probs, {1e-8, 1e-5}, "CrossEntropyForward probs in place");
  ExpectClose(d_dlogits.ToHost(), dlogits, {1e-7, 1e-5}, "CrossEntropyBackward dlogits");
}

// ---- Utilities -------------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, SumSquaresMatchesCpuAndRepeatsBitForBit) {
  const size_t n = 1234567;
  auto x = Random(n, rng_, -3.0f, 3.0f);
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<double> d_out(3), scratch(gpu::SumSquaresScratchElems());
  ZINF_EXPECT_OK(gpu::SumSquares(d_out.get(), scratch.get(), d_x.get(), n, false, nullptr));
  ZINF_EXPECT_OK(gpu::SumSquares(d_out.get() + 1, scratch.get(), d_x.get(), n, false, nullptr));
  ZINF_EXPECT_OK(gpu::SumSquares(d_out.get() + 2, scratch.get(), d_x.get(), n, false, nullptr));
  ZINF_EXPECT_OK(gpu::SumSquares(d_out.get() + 2, scratch.get(), d_x.get(), 1000, true, nullptr));
  const std::vector<double> got = d_out.ToHost();
  const double want = cpu::SumSquares(x.data(), n);
  const double want_head = cpu::SumSquares(x.data(), 1000);
  EXPECT_NEAR(got[0], want, 1e-12 * want);
  EXPECT_EQ(std::memcmp(&got[0], &got[1], sizeof(double)), 0) << "not deterministic";
  EXPECT_NEAR(got[2], want + want_head, 1e-12 * want);
}

TEST_F(CudaLayerOpsTest, ConversionsMatchCpuBitForBit) {
  // Every 16-bit pattern to float.
  std::vector<uint16_t> halves(65536);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i);
  DeviceBuffer<uint16_t> d_halves(halves);
  DeviceBuffer<float> d_from_bf16(halves.size()), d_from_f16(halves.size());
  ZINF_EXPECT_OK(gpu::Bf16ToFloat(d_from_bf16.get(), d_halves.get(), halves.size(), nullptr));
  ZINF_EXPECT_OK(gpu::Fp16ToFloat(d_from_f16.get(), d_halves.get(), halves.size(), nullptr));
  std::vector<float> bf16_ref(halves.size()), f16_ref(halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    bf16_ref[i] = Bf16ToFloat(halves[i]);
    f16_ref[i] = F16ToFloat(halves[i]);
  }
  ExpectBitwiseEqual(d_from_bf16.ToHost(), bf16_ref, "Bf16ToFloat");
  ExpectBitwiseEqual(d_from_f16.ToHost(), f16_ref, "Fp16ToFloat");

  // Specials, ties, denormals and random bit patterns to 16 bits.
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffa00001u, 0x3f808000u, 0x3f818000u, 0x00000001u,
                                0x387fe000u, 0x33000000u, 0x33000001u, 0x477ff000u, 0x477fefffu,
                                0x7f7fffffu, 0x3effff00u};
  std::uniform_int_distribution<uint32_t> any;
  while (bits.size() < 200000) bits.push_back(any(rng_));
  std::vector<float> floats(bits.size());
  std::memcpy(floats.data(), bits.data(), bits.size() * sizeof(float));
  DeviceBuffer<float> d_floats(floats);
  DeviceBuffer<uint16_t> d_bf16(floats.size()), d_f16(floats.size());
  ZINF_EXPECT_OK(gpu::FloatToBf16(d_bf16.get(), d_floats.get(), floats.size(), nullptr));
  ZINF_EXPECT_OK(gpu::FloatToFp16(d_f16.get(), d_floats.get(), floats.size(), nullptr));
  const std::vector<uint16_t> got_bf16 = d_bf16.ToHost(), got_f16 = d_f16.ToHost();
  size_t bad_bf16 = 0, bad_f16 = 0;
  for (size_t i = 0; i < floats.size(); ++i) {
    bad_bf16 += got_bf16[i] != FloatToBf16(floats[i]);
    bad_f16 += got_f16[i] != FloatToF16(floats[i]);
  }
  EXPECT_EQ(bad_bf16, 0u) << "FloatToBf16 differs from kernels/cpu/half_convert.h";
  EXPECT_EQ(bad_f16, 0u) << "FloatToFp16 differs from kernels/cpu/half_convert.h";
  // A NaN stays a NaN.
  EXPECT_EQ(got_bf16[5] & 0x7f80u, 0x7f80u);
  EXPECT_NE(got_bf16[5] & 0x7fu, 0u);
}

// ---- Determinism -----------------------------------------------------------------------------

TEST_F(CudaLayerOpsTest, BackwardOpsRepeatBitForBit) {
  const int B = 2, seq = 48, C = 64, NH = 4, V = 9;
  const size_t n = static_cast<size_t>(B) * seq * C;
  auto qkv = Random(3 * n, rng_);
  auto dout = Random(n, rng_);
  auto dqkv = Random(3 * n, rng_);
  const AttentionResult first = RunGpuAttention(cublas(), qkv, dout, dqkv, B, seq, C, NH);
  const AttentionResult second = RunGpuAttention(cublas(), qkv, dout, dqkv, B, seq, C, NH);
  ExpectBitwiseEqual(first.dqkv, second.dqkv, "AttentionBackward twice");

  auto tokens = RandomTokens(static_cast<size_t>(B) * seq, V, rng_);
  DeviceBuffer<int32_t> d_tokens(tokens);
  DeviceBuffer<float> d_dout(dout);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    DeviceBuffer<float> dwte(static_cast<size_t>(V) * C), dwpe(static_cast<size_t>(seq) * C);
    DeviceBuffer<float> dinp(n), dw(C), db(C), mean(std::vector<float>(B * seq, 0.1f)),
        rstd(std::vector<float>(B * seq, 1.3f)), w(std::vector<float>(C, 0.9f));
    ZINF_EXPECT_OK(gpu::EncoderBackward(dwte.get(), dwpe.get(), d_dout.get(), d_tokens.get(), B,
                                        seq, C, nullptr));
    ZINF_EXPECT_OK(gpu::LayerNormBackward(dinp.get(), dw.get(), db.get(), d_dout.get(),
                                          d_dout.get(), w.get(), mean.get(), rstd.get(), B * seq,
                                          C, nullptr));
    std::vector<float> all = dwte.ToHost();
    for (const auto& part : {dwpe.ToHost(), dinp.ToHost(), dw.ToHost(), db.ToHost()}) {
      all.insert(all.end(), part.begin(), part.end());
    }
    runs.push_back(std::move(all));
  }
  ExpectBitwiseEqual(runs[0], runs[1], "EncoderBackward + LayerNormBackward twice");
}

}  // namespace
}  // namespace zinf::kernels
