// The CUDA Backend (src/train/cuda_backend.h) against the CPU Backend: a tiny GPT-2 forward and
// backward (gpt.h's per-unit functions, driven on device buffers the way
// ResidentForwardBackward drives host ones), the loss and every parameter gradient compared;
// plus the factory's refusals, the shape checks, CrossEntropyBackward's per-row dloss buffer
// and the 16-bit conversions. Tests that need a GPU skip when none answers
// (src/base/cuda_probe.h); the factory's refusal of the host device, the device-side driver
// (run with the CPU backend on the host-emulated device) and the bf16 tolerance calibration run
// everywhere.
//
// Tolerances, per gradient tensor: |gpu - cpu| <= atol + rtol·|cpu| per element with atol a
// fraction of max|cpu| over the tensor (gradients near zero come out of cancellations), and
// ||gpu - cpu||₂ / ||cpu||₂ over the tensor:
// - exact fp32 GEMMs (GemmPrecision::kFp32): the two sides differ by summation order and
//   expf/tanhf ulps, ~1e-6 relative per op, compounding through ~20 ops: atol 1e-4·max, rtol 1e-3,
//   relative L2 1e-4, loss 1e-5 relative (two orders of magnitude of margin);
// - bf16 tensor cores (kBf16, the default): every GEMM input is rounded to 8 significant bits,
//   ~2e-3 relative per GEMM output (random-sign products), compounding through the chain of
//   GEMMs of a forward and a backward. Emulated on the CPU (linear-layer GEMM inputs rounded to
//   bf16, Bf16TolerancesHoldForBf16RoundedGemmInputs below) this model's gradients come out at
//   ≤ 5e-3 relative L2 and ≤ 6e-3·max per element, the loss at 1e-6: atol 1e-1·max, rtol 1e-1,
//   relative L2 5e-2, loss 1e-3 relative (about 10x margin for the attention GEMMs the
//   emulation leaves in fp32; loose: they catch a wrong term or buffer, not rounding).
// - bit for bit: the 16-bit conversions, a kF32 Widen, and two runs of the same model on the GPU.
#include "src/train/cuda_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cast.h"
#include "src/base/cuda_probe.h"
#include "src/base/device.h"
#include "src/train/backend_factory.h"
#include "src/train/cpu_backend.h"
#include "src/train/gpt.h"
#include "src/train/model.h"

namespace zinf::train {
namespace {

namespace gpu = ::zinf::kernels::cuda;
constexpr uint64_t kMiB = 1 << 20;

const GptDims kDims{.L = 2, .C = 64, .NH = 4, .V = 96, .seq = 32};
constexpr int kB = 2, kT = 32;

#define ZINF_EXPECT_OK(expr)                                   \
  do {                                                         \
    ::zinf::Status s_ = (expr);                                \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.ToString();    \
  } while (0)
#define ZINF_ASSERT_OK(expr)                                   \
  do {                                                         \
    ::zinf::Status s_ = (expr);                                \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString();    \
  } while (0)

// Device allocations of one test, freed (after the stream drains) when it goes.
class DeviceBuffers {
 public:
  DeviceBuffers(Device& device, Stream* stream) : device_(device), stream_(stream) {}
  ~DeviceBuffers() {
    device_.StreamSynchronize(stream_).IgnoreError();
    for (void* p : ptrs_) device_.Free(p).IgnoreError();
  }
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;

  template <typename T>
  Result<T*> Alloc(uint64_t n) {
    ZINF_ASSIGN_OR_RETURN(void* p, device_.Allocate(std::max<uint64_t>(n, 1) * sizeof(T)));
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  // A device copy of `host`, complete on return.
  template <typename T>
  Result<T*> Upload(const std::vector<T>& host) {
    ZINF_ASSIGN_OR_RETURN(T * p, Alloc<T>(host.size()));
    ZINF_RETURN_IF_ERROR(device_.CopyToDevice(stream_, p, host.data(), host.size() * sizeof(T)));
    ZINF_RETURN_IF_ERROR(device_.StreamSynchronize(stream_));
    return p;
  }
  // n elements at p, after the work enqueued on the stream so far.
  template <typename T>
  Result<std::vector<T>> Download(const T* p, uint64_t n) {
    std::vector<T> host(n);
    ZINF_RETURN_IF_ERROR(device_.CopyToHost(stream_, host.data(), p, n * sizeof(T)));
    ZINF_RETURN_IF_ERROR(device_.StreamSynchronize(stream_));
    return host;
  }

 private:
  Device& device_;
  Stream* stream_;
  std::vector<void*> ptrs_;
};

// Weights (GPT-2 init plus noise, so that LayerNorm weights and biases are not special cases)
// and the token streams.
struct ModelInputs {
  std::vector<std::vector<float>> params;
  std::vector<int32_t> tokens, targets;
};

ModelInputs MakeInputs(const GptDims& d, int B, int seq, uint64_t seed) {
  ModelInputs m;
  for (uint32_t u = 0; u < d.units(); ++u) {
    std::vector<float> w(d.UnitParams(u));
    InitUnit(d, u, seed, w.data());
    std::mt19937_64 rng(seed + u);
    std::normal_distribution<float> noise(0.0f, 0.02f);
    for (float& x : w) x += noise(rng);
    m.params.push_back(std::move(w));
  }
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int i = 0; i < B * seq; ++i) {
    m.tokens.push_back(static_cast<int32_t>(rng() % d.V));
    m.targets.push_back(static_cast<int32_t>(rng() % d.V));
  }
  return m;
}

struct Outcome {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // per unit
};

// The reference: ResidentForwardBackward on the CPU backend.
Result<Outcome> RunOnCpu(const GptDims& d, const ModelInputs& m, int B, int seq, float scale) {
  auto be = MakeCpuBackend<float>();
  Outcome out;
  std::vector<const float*> p;
  std::vector<float*> g;
  for (const auto& w : m.params) {
    p.push_back(w.data());
    out.grads.emplace_back(w.size(), 0.0f);
  }
  for (auto& x : out.grads) g.push_back(x.data());
  ZINF_ASSIGN_OR_RETURN(out.loss, ResidentForwardBackward<float>(*be, d, p, g, m.tokens.data(),
                                                                 m.targets.data(), B, seq, scale));
  return out;
}

// ResidentForwardBackward's sequence of calls, on device buffers.
Result<Outcome> RunOnDevice(Backend<float>& be, Device& device, Stream* stream, const GptDims& d,
                            const ModelInputs& m, int B, int seq, float scale) {
  DeviceBuffers bufs(device, stream);
  const uint64_t N = static_cast<uint64_t>(B) * seq, NC = N * d.C;
  std::vector<const float*> params;
  std::vector<float*> grads;
  for (uint32_t u = 0; u < d.units(); ++u) {
    ZINF_ASSIGN_OR_RETURN(float* w, bufs.Upload(m.params[u]));
    ZINF_ASSIGN_OR_RETURN(float* g, bufs.Alloc<float>(d.UnitParams(u)));
    ZINF_RETURN_IF_ERROR(be.Zero(g, d.UnitParams(u)));
    params.push_back(w);
    grads.push_back(g);
  }
  ZINF_ASSIGN_OR_RETURN(const int32_t* tokens, bufs.Upload(m.tokens));
  ZINF_ASSIGN_OR_RETURN(const int32_t* targets, bufs.Upload(m.targets));
  ZINF_ASSIGN_OR_RETURN(float* xs, bufs.Alloc<float>(NC * (d.L + 1)));
  ZINF_ASSIGN_OR_RETURN(float* acts, bufs.Alloc<float>(BlockActsElems(d, B, seq)));
  ZINF_ASSIGN_OR_RETURN(float* head, bufs.Alloc<float>(HeadActsElems(d, B, seq)));
  ZINF_ASSIGN_OR_RETURN(float* dres, bufs.Alloc<float>(NC));
  ZINF_ASSIGN_OR_RETURN(
      float* scratch,
      bufs.Alloc<float>(
          BlockGradScratchElems(d, B, seq, be.AttentionScratchElems(B, seq, d.C, d.NH))));
  auto x = [&](int l) { return xs + NC * l; };
  const BlockActs<float> a = ViewBlockActs(acts, d, B, seq);
  const HeadActs<float> h = ViewHeadActs(head, d, B, seq);
  const EmbeddingView<const float> emb = ViewEmbedding(params[0], d);
  const FinalView<const float> fin = ViewFinal(params[d.final_unit()], d);

  ZINF_RETURN_IF_ERROR(EmbeddingForward(be, d, emb, tokens, x(0), B, seq));
  for (int l = 0; l < d.L; ++l) {
    ZINF_RETURN_IF_ERROR(
        BlockForward(be, d, ViewBlock(params[l + 1], d), x(l), x(l + 1), a, scratch, B, seq));
  }
  ZINF_RETURN_IF_ERROR(HeadForward(be, d, fin, emb.wte, x(d.L), targets, h, B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  ZINF_ASSIGN_OR_RETURN(std::vector<float> losses, bufs.Download(h.losses, N));
  Outcome out;
  for (float l : losses) out.loss += static_cast<double>(l);
  out.loss /= static_cast<double>(N);

  EmbeddingView<float> demb = ViewEmbedding(grads[0], d);
  ZINF_RETURN_IF_ERROR(HeadBackward(be, d, fin, ViewFinal(grads[d.final_unit()], d), emb.wte,
                                    demb.wte, x(d.L), targets, h, dres, scale, B, seq));
  for (int l = d.L - 1; l >= 0; --l) {
    const BlockView<const float> w = ViewBlock(params[l + 1], d);
    ZINF_RETURN_IF_ERROR(BlockForward(be, d, w, x(l), x(l + 1), a, scratch, B, seq));
    ZINF_RETURN_IF_ERROR(
        BlockBackward(be, d, w, ViewBlock(grads[l + 1], d), x(l), a, dres, scratch, B, seq));
  }
  ZINF_RETURN_IF_ERROR(EmbeddingBackward(be, d, demb, tokens, dres, B, seq));
  ZINF_RETURN_IF_ERROR(be.Synchronize());
  for (uint32_t u = 0; u < d.units(); ++u) {
    ZINF_ASSIGN_OR_RETURN(std::vector<float> g, bufs.Download(grads[u], d.UnitParams(u)));
    out.grads.push_back(std::move(g));
  }
  return out;
}

struct Tol {
  double atol_of_max;  // atol = atol_of_max · max|cpu| over the tensor
  double rtol;
  double rel_l2;       // bound on ||gpu - cpu|| / ||cpu|| over the tensor
  double loss_rtol;
};
constexpr Tol kFp32Tol{1e-4, 1e-3, 1e-4, 1e-5};
constexpr Tol kBf16Tol{1e-1, 1e-1, 5e-2, 1e-3};

// Every tensor of every unit (by its nanoGPT name), and the loss.
void ExpectOutcomesClose(const GptDims& d, const Outcome& got, const Outcome& want, Tol tol) {
  EXPECT_NEAR(got.loss, want.loss, tol.loss_rtol * std::fabs(want.loss));
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (uint32_t u = 0; u < d.units(); ++u) {
    ASSERT_EQ(got.grads[u].size(), want.grads[u].size()) << d.UnitName(u);
    for (const TensorInfo& t : UnitTensors(d, u)) {
      const float* g = got.grads[u].data() + t.offset;
      const float* w = want.grads[u].data() + t.offset;
      double max_abs = 0, diff2 = 0, ref2 = 0;
      for (uint64_t i = 0; i < t.elems; ++i) max_abs = std::max(max_abs, std::fabs(double{w[i]}));
      const double atol = tol.atol_of_max * max_abs;
      uint64_t bad = 0, worst = 0;
      double worst_excess = -1;
      for (uint64_t i = 0; i < t.elems; ++i) {
        const double diff = std::fabs(static_cast<double>(g[i]) - w[i]);
        diff2 += diff * diff;
        ref2 += static_cast<double>(w[i]) * w[i];
        const double excess = diff - (atol + tol.rtol * std::fabs(double{w[i]}));
        if (!(excess <= 0)) {  // NaN counts as bad
          ++bad;
          const double e = std::isnan(excess) ? std::numeric_limits<double>::infinity() : excess;
          if (e > worst_excess) {
            worst_excess = e;
            worst = i;
          }
        }
      }
      EXPECT_GT(max_abs, 0.0) << t.name << ": the reference gradient is all zero";
      EXPECT_EQ(bad, 0u) << t.name << ": " << bad << " of " << t.elems << " outside atol "
                         << atol << " + rtol " << tol.rtol << "·|cpu|; worst at " << worst
                         << ": gpu " << g[worst] << " cpu " << w[worst];
      const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
      EXPECT_LE(rel, tol.rel_l2) << t.name << ": relative L2 error";
    }
  }
}

// ---- Checks that need no GPU ---------------------------------------------------------------

TEST(CudaBackendFactoryTest, RefusesTheHostDevice) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.budget_bytes = kMiB;
  auto device = MakeHostDevice(o);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream("compute");
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto be = MakeCudaBackend(**device, *stream);
  ASSERT_FALSE(be.ok());
  EXPECT_EQ(be.status().code(), StatusCode::kInvalidArgument) << be.status().ToString();
  EXPECT_NE(be.status().message().find("MakeCudaBackend"), std::string::npos)
      << be.status().ToString();
  // The factory keeps the host device on the CPU backend.
  auto cpu = MakeBackend(**device, *stream, 1);
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  EXPECT_EQ((*cpu)->name(), "cpu");
}

// The device-side driver itself, on the host-emulated device with the CPU backend: the same
// calls as ResidentForwardBackward, so the same bits.
TEST(CudaBackendDriverTest, DeviceDriverMatchesResidentForwardBackward) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.budget_bytes = 64 * kMiB;
  o.require_pinned_host = false;
  auto device = MakeHostDevice(o);
  ASSERT_TRUE(device.ok()) << device.status().ToString();
  auto stream = (*device)->CreateStream("compute");
  ASSERT_TRUE(stream.ok()) << stream.status().ToString();
  auto be = MakeCpuBackend<float>();
  const ModelInputs m = MakeInputs(kDims, kB, kT, 13);
  auto want = RunOnCpu(kDims, m, kB, kT, 4.0f);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = RunOnDevice(*be, **device, *stream, kDims, m, kB, kT, 4.0f);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectOutcomesClose(kDims, *got, *want, {0, 0, 0, 0});
}

// A CPU backend whose linear-layer GEMMs see their inputs rounded to bf16, as tensor cores do
// (the attention's GEMMs stay fp32, so this underestimates the GPU's rounding somewhat): the
// bf16 tolerances must hold against it, with room to spare.
class Bf16GemmInputs final : public Backend<float> {
 public:
  Bf16GemmInputs() : be_(MakeCpuBackend<float>()) {}
  std::string_view name() const override { return "cpu-bf16-gemm-inputs"; }
  Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int B, int seq, int C) override {
    return be_->EncoderForward(out, tokens, wte, wpe, B, seq, C);
  }
  Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                         int B, int seq, int C) override {
    return be_->EncoderBackward(dwte, dwpe, dout, tokens, B, seq, C);
  }
  Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int N, int C) override {
    return be_->LayerNormForward(out, mean, rstd, inp, weight, bias, N, C);
  }
  Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C) override {
    return be_->LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
  }
  Status MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                       int N, int C, int OC) override {
    auto i = Round(inp, static_cast<size_t>(N) * C);
    auto w = Round(weight, static_cast<size_t>(OC) * C);
    return be_->MatmulForward(out, i.data(), w.data(), bias, N, C, OC);
  }
  Status MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) override {
    auto d = Round(dout, static_cast<size_t>(N) * OC);
    auto i = Round(inp, static_cast<size_t>(N) * C);
    auto w = Round(weight, static_cast<size_t>(OC) * C);
    // dbias sums the unrounded dout (a plain reduction kernel on the GPU).
    if (dbias != nullptr) {
      for (int r = 0; r < N; ++r) {
        for (int o = 0; o < OC; ++o) dbias[o] += dout[static_cast<size_t>(r) * OC + o];
      }
    }
    return be_->MatmulBackward(dinp, dweight, nullptr, d.data(), i.data(), w.data(), N, C, OC);
  }
  size_t AttentionScratchElems(int B, int seq, int C, int NH) const override {
    return be_->AttentionScratchElems(B, seq, C, NH);
  }
  Status AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B,
                          int seq, int C, int NH) override {
    return be_->AttentionForward(out, att, scratch, qkv, B, seq, C, NH);
  }
  Status AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                           const float* att, int B, int seq, int C, int NH) override {
    return be_->AttentionBackward(dqkv, scratch, dout, qkv, att, B, seq, C, NH);
  }
  Status GeluForward(float* out, const float* inp, size_t n) override {
    return be_->GeluForward(out, inp, n);
  }
  Status GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override {
    return be_->GeluBackward(dinp, inp, dout, n);
  }
  Status ResidualForward(float* out, const float* a, const float* b, size_t n) override {
    return be_->ResidualForward(out, a, b, n);
  }
  Status AddInPlace(float* dst, const float* src, size_t n) override {
    return be_->AddInPlace(dst, src, n);
  }
  Status CrossEntropyForward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V) override {
    return be_->CrossEntropyForward(losses, probs, logits, targets, N, V);
  }
  Status CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                              float dloss_each, int N, int V) override {
    return be_->CrossEntropyBackward(dlogits, probs, targets, dloss_each, N, V);
  }
  Status Zero(float* x, size_t n) override { return be_->Zero(x, n); }
  Status Widen(float* out, const void* in, kernels::DType type, size_t n) override {
    return be_->Widen(out, in, type, n);
  }
  Status Narrow(void* out, const float* in, kernels::DType type, size_t n) override {
    return be_->Narrow(out, in, type, n);
  }
  Status Synchronize() override { return be_->Synchronize(); }
  bool RunsOnCallingThread() const override { return be_->RunsOnCallingThread(); }

 private:
  static std::vector<float> Round(const float* x, size_t n) {
    std::vector<uint16_t> half(n);
    std::vector<float> out(n);
    kernels::CastFromF32(x, half.data(), kernels::DType::kBf16, n).IgnoreError();
    kernels::CastToF32(half.data(), kernels::DType::kBf16, out.data(), n).IgnoreError();
    return out;
  }
  std::unique_ptr<Backend<float>> be_;
};

TEST(CudaBackendDriverTest, Bf16TolerancesHoldForBf16RoundedGemmInputs) {
  const ModelInputs m = MakeInputs(kDims, kB, kT, 12);
  auto want = RunOnCpu(kDims, m, kB, kT, 1024.0f);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  Bf16GemmInputs be;
  Outcome got;
  std::vector<const float*> p;
  std::vector<float*> g;
  for (const auto& w : m.params) {
    p.push_back(w.data());
    got.grads.emplace_back(w.size(), 0.0f);
  }
  for (auto& x : got.grads) g.push_back(x.data());
  auto loss = ResidentForwardBackward<float>(be, kDims, p, g, m.tokens.data(), m.targets.data(),
                                             kB, kT, 1024.0f);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  got.loss = *loss;
  // Half the GPU's tolerances: the GPU also rounds the attention's GEMM inputs.
  const Tol half{kBf16Tol.atol_of_max / 2, kBf16Tol.rtol / 2, kBf16Tol.rel_l2 / 2,
                 kBf16Tol.loss_rtol / 2};
  ExpectOutcomesClose(kDims, got, *want, half);
}

// ---- On a GPU --------------------------------------------------------------------------------

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe probe = ProbeCuda();
    if (probe.device_count == 0) GTEST_SKIP() << "no GPU answers: " << probe.detail;
    DeviceOptions o;
    o.kind = DeviceKind::kCuda;
    o.budget_bytes = 256 * kMiB;
    o.require_pinned_host = false;  // the test copies from std::vector
    auto device = MakeCudaDevice(o);
    ASSERT_TRUE(device.ok()) << device.status().ToString();
    device_ = std::move(device).value();
    auto stream = device_->CreateStream("compute");
    ASSERT_TRUE(stream.ok()) << stream.status().ToString();
    compute_ = *stream;
  }

  std::unique_ptr<Backend<float>> MakeOrFail(gpu::GemmPrecision precision) {
    auto be = MakeCudaBackend(*device_, compute_, precision);
    EXPECT_TRUE(be.ok()) << be.status().ToString();
    return be.ok() ? std::move(be).value() : nullptr;
  }

  std::unique_ptr<Device> device_;
  Stream* compute_ = nullptr;
};

TEST_F(CudaBackendTest, FactoryGivesTheCudaBackendAndRefusesBadStreams) {
  auto be = MakeBackend(*device_, compute_, 1);
  ASSERT_TRUE(be.ok()) << be.status().ToString();
  EXPECT_EQ((*be)->name(), "cuda");

  auto none = MakeCudaBackend(*device_, nullptr);
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument) << none.status().ToString();

  DeviceOptions ho;
  ho.kind = DeviceKind::kHost;
  ho.budget_bytes = kMiB;
  auto host = MakeHostDevice(ho);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  auto foreign = (*host)->CreateStream("foreign");
  ASSERT_TRUE(foreign.ok());
  auto other = MakeCudaBackend(*device_, *foreign);
  EXPECT_EQ(other.status().code(), StatusCode::kInvalidArgument) << other.status().ToString();
}

TEST_F(CudaBackendTest, BadShapesAreRefusedNamingTheOp) {
  auto be = MakeOrFail(gpu::GemmPrecision::kBf16);
  ASSERT_NE(be, nullptr);
  Status s = be->MatmulForward(nullptr, nullptr, nullptr, nullptr, 0, 4, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("MatmulForward"), std::string::npos) << s.ToString();
  s = be->AttentionForward(nullptr, nullptr, nullptr, nullptr, 1, 4, 10, 4);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("AttentionForward"), std::string::npos) << s.ToString();
  s = be->CrossEntropyBackward(nullptr, nullptr, nullptr, 1.0f, 4, -1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("CrossEntropyBackward"), std::string::npos) << s.ToString();
  // Nothing was enqueued, so the stream is clean.
  ZINF_EXPECT_OK(be->Synchronize());
}

TEST_F(CudaBackendTest, ScratchHoldsForwardAndBackward) {
  auto be = MakeOrFail(gpu::GemmPrecision::kBf16);
  ASSERT_NE(be, nullptr);
  for (auto [B, seq, C, NH] : {std::array{2, 32, 64, 4}, std::array{1, 1, 8, 8},
                               std::array{4, 1024, 768, 12}}) {
    const size_t elems = be->AttentionScratchElems(B, seq, C, NH);
    EXPECT_GE(elems, gpu::AttentionForwardScratchElems(B, seq, C, NH));
    EXPECT_GE(elems, gpu::AttentionBackwardScratchElems(B, seq, C, NH));
  }
}

// The whole tiny model, exact fp32 GEMMs: tight against the CPU.
TEST_F(CudaBackendTest, TinyGptMatchesCpuWithFp32Gemms) {
  auto be = MakeOrFail(gpu::GemmPrecision::kFp32);
  ASSERT_NE(be, nullptr);
  const ModelInputs m = MakeInputs(kDims, kB, kT, 11);
  auto want = RunOnCpu(kDims, m, kB, kT, 1.0f);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = RunOnDevice(*be, *device_, compute_, kDims, m, kB, kT, 1.0f);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_GT(want->loss, 0.5 * std::log(static_cast<double>(kDims.V)));
  ExpectOutcomesClose(kDims, *got, *want, kFp32Tol);
}

// The default bf16 tensor cores: loose against the CPU, bit for bit run to run, and a loss
// scale reaches every gradient.
TEST_F(CudaBackendTest, TinyGptMatchesCpuWithBf16GemmsAndIsDeterministic) {
  auto be = MakeOrFail(gpu::GemmPrecision::kBf16);
  ASSERT_NE(be, nullptr);
  const ModelInputs m = MakeInputs(kDims, kB, kT, 12);
  const float scale = 1024.0f;
  auto want = RunOnCpu(kDims, m, kB, kT, scale);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = RunOnDevice(*be, *device_, compute_, kDims, m, kB, kT, scale);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectOutcomesClose(kDims, *got, *want, kBf16Tol);

  auto again = RunOnDevice(*be, *device_, compute_, kDims, m, kB, kT, scale);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(std::bit_cast<uint64_t>(again->loss), std::bit_cast<uint64_t>(got->loss));
  for (uint32_t u = 0; u < kDims.units(); ++u) {
    ASSERT_EQ(again->grads[u].size(), got->grads[u].size());
    EXPECT_EQ(std::memcmp(again->grads[u].data(), got->grads[u].data(),
                          got->grads[u].size() * sizeof(float)),
              0)
        << kDims.UnitName(u) << ": two runs differ";
  }
}

// The per-row dloss buffer: grown when N grows, refilled when the value or N changes, reused
// otherwise. Every call accumulates into dlogits, on both sides.
TEST_F(CudaBackendTest, CrossEntropyBackwardTracksDlossAndRows) {
  auto be = MakeOrFail(gpu::GemmPrecision::kBf16);
  ASSERT_NE(be, nullptr);
  auto cpu = MakeCpuBackend<float>({.threads = 1});
  constexpr int kMaxN = 70, kV = 33;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> probs(kMaxN * kV), dlogits(kMaxN * kV);
  for (float& p : probs) p = unit(rng);
  for (float& g : dlogits) g = unit(rng) - 0.5f;
  std::vector<int32_t> targets(kMaxN);
  for (int32_t& t : targets) t = static_cast<int32_t>(rng() % kV);

  DeviceBuffers bufs(*device_, compute_);
  auto d_probs = bufs.Upload(probs);
  auto d_dlogits = bufs.Upload(dlogits);
  auto d_targets = bufs.Upload(targets);
  ASSERT_TRUE(d_probs.ok() && d_dlogits.ok() && d_targets.ok());
  const struct {
    int n;
    float dloss;
  } calls[] = {{3, 0.5f}, {kMaxN, 0.25f}, {3, 0.25f}, {kMaxN, 0.25f},
               {5, -2.0f}, {kMaxN, -2.0f}, {kMaxN, -0.0f}, {kMaxN, 1.0f / 3.0f}};
  for (const auto& c : calls) {
    ZINF_ASSERT_OK(be->CrossEntropyBackward(*d_dlogits, *d_probs, *d_targets, c.dloss, c.n, kV));
    ZINF_ASSERT_OK(
        cpu->CrossEntropyBackward(dlogits.data(), probs.data(), targets.data(), c.dloss, c.n, kV));
  }
  ZINF_ASSERT_OK(be->Synchronize());
  auto got = bufs.Download(static_cast<const float*>(*d_dlogits), dlogits.size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  size_t bad = 0;
  for (size_t i = 0; i < dlogits.size(); ++i) {
    // The same formula; FMA contraction on the GPU may round each call's update differently:
    // at most an ulp of the running sum (|sum| <= 6 here, ulp 5e-7) per call, 8 calls.
    if (!(std::fabs((*got)[i] - dlogits[i]) <= 1e-5f + 1e-5f * std::fabs(dlogits[i]))) ++bad;
  }
  EXPECT_EQ(bad, 0u);
}

TEST_F(CudaBackendTest, WidenAndNarrowMatchTheCpuCastsBitForBit) {
  auto be = MakeOrFail(gpu::GemmPrecision::kBf16);
  ASSERT_NE(be, nullptr);
  constexpr size_t kN = 4099;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(kN);
  for (float& v : x) v = normal(rng);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = std::numeric_limits<float>::infinity();
  x[3] = -std::numeric_limits<float>::infinity();
  x[4] = 1e-30f;        // underflows in fp16
  x[5] = 70000.0f;      // overflows in fp16
  x[6] = 1.00390625f;   // 1 + 2^-8: a bf16 tie, rounds to even
  DeviceBuffers bufs(*device_, compute_);
  auto d_x = bufs.Upload(x);
  ASSERT_TRUE(d_x.ok()) << d_x.status().ToString();

  for (kernels::DType type : {kernels::DType::kBf16, kernels::DType::kF16}) {
    SCOPED_TRACE(std::string(kernels::DTypeName(type)));
    std::vector<uint16_t> want16(kN);
    ZINF_ASSERT_OK(kernels::CastFromF32(x.data(), want16.data(), type, kN));
    std::vector<float> want32(kN);
    ZINF_ASSERT_OK(kernels::CastToF32(want16.data(), type, want32.data(), kN));

    auto d16 = bufs.Alloc<uint16_t>(kN);
    auto d32 = bufs.Alloc<float>(kN);
    ASSERT_TRUE(d16.ok() && d32.ok());
    ZINF_ASSERT_OK(be->Narrow(*d16, *d_x, type, kN));
    ZINF_ASSERT_OK(be->Widen(*d32, *d16, type, kN));
    ZINF_ASSERT_OK(be->Synchronize());
    auto got16 = bufs.Download(static_cast<const uint16_t*>(*d16), kN);
    auto got32 = bufs.Download(static_cast<const float*>(*d32), kN);
    ASSERT_TRUE(got16.ok() && got32.ok());
    EXPECT_EQ(std::memcmp(got16->data(), want16.data(), kN * sizeof(uint16_t)), 0);
    EXPECT_EQ(std::memcmp(got32->data(), want32.data(), kN * sizeof(float)), 0);
  }

  // fp32 "widening" is a device-to-device copy; fp32 is no narrowing target.
  auto copy = bufs.Alloc<float>(kN);
  ASSERT_TRUE(copy.ok());
  ZINF_ASSERT_OK(be->Widen(*copy, *d_x, kernels::DType::kF32, kN));
  ZINF_ASSERT_OK(be->Zero(*d_x, 7));  // after the copy, in stream order
  ZINF_ASSERT_OK(be->Synchronize());
  auto got = bufs.Download(static_cast<const float*>(*copy), kN);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::memcmp(got->data(), x.data(), kN * sizeof(float)), 0);
  auto zeroed = bufs.Download(static_cast<const float*>(*d_x), 8);
  ASSERT_TRUE(zeroed.ok());
  for (int i = 0; i < 7; ++i) EXPECT_EQ(std::bit_cast<uint32_t>((*zeroed)[i]), 0u) << i;
  EXPECT_EQ((*zeroed)[7], x[7]);
  Status s = be->Narrow(*copy, *d_x, kernels::DType::kF32, kN);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("Narrow"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace zinf::train
