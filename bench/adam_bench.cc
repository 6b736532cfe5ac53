// adam_bench: Google Benchmark of the CPU kernels (kernels/cpu) per SIMD variant and dtype
// combination, with bytes-per-second counters (bytes read + written, as `zinf bench-adam`
// counts them: 28 per element for an fp32 Adam step).
//
// Two sizes per case: 64K elements on one thread (in cache: the kernel's compute speed) and
// 16M elements on all cores (memory-bound: 448 MiB per fp32 step). Variants the CPU lacks are
// not registered. Example: build/bench/adam_bench --benchmark_filter='Adam/avx512_bf16'
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/grad_ops.h"
#include "kernels/cpu/memory_probe.h"

namespace zinf::kernels {
namespace {

constexpr size_t kMaxElems = size_t{16} << 20;

// Buffers of kMaxElems elements shared by every benchmark (allocated and first touched once):
// realistic values (no denormals), gradients in each type.
struct Buffers {
  float* param;
  float* exp_avg;  // fp32 or bf16 state
  float* exp_avg_sq;
  void* param16;
  float* scratch;  // accumulator, copy destination
  void* grad[3];   // indexed by DType: fp32, bf16, fp16
  Buffers() {
    param = Allocate();
    exp_avg = Allocate();
    exp_avg_sq = Allocate();
    param16 = Allocate();
    scratch = Allocate();
    for (void*& g : grad) g = Allocate();
    float* g32 = static_cast<float*>(grad[0]);
    for (size_t k = 0; k < kMaxElems; ++k) {
      param[k] = static_cast<float>(k % 1000) / 1000 - 0.5f;
      g32[k] = 1e-3f * (static_cast<float>(k % 997) / 498.5f - 1);
    }
    if (!CastFromF32(g32, grad[1], DType::kBf16, kMaxElems).ok()) std::abort();
    if (!CastFromF32(g32, grad[2], DType::kF16, kMaxElems).ok()) std::abort();
  }
  static float* Allocate() {
    auto* p = static_cast<float*>(std::aligned_alloc(64, kMaxElems * sizeof(float)));
    if (p == nullptr || !TouchPages(p, kMaxElems * sizeof(float)).ok()) std::abort();
    return p;
  }
};

Buffers& Shared() {
  static Buffers* b = new Buffers();
  return *b;
}

struct AdamCase {
  const char* name;
  DType grad;
  DType state;
  bool has_param16;
  DType param16;
  bool check_finite;
  bool stream_param16;
};

constexpr AdamCase kAdamCases[] = {
    {"fp32", DType::kF32, DType::kF32, false, DType::kBf16, false, false},
    {"grad_bf16", DType::kBf16, DType::kF32, false, DType::kBf16, false, false},
    {"grad_fp16", DType::kF16, DType::kF32, false, DType::kBf16, false, false},
    {"out_bf16", DType::kF32, DType::kF32, true, DType::kBf16, false, true},
    {"out_bf16_plain_stores", DType::kF32, DType::kF32, true, DType::kBf16, false, false},
    {"out_fp16", DType::kF32, DType::kF32, true, DType::kF16, false, true},
    {"state_bf16", DType::kF32, DType::kBf16, false, DType::kBf16, false, false},
    {"fp32_check_finite", DType::kF32, DType::kF32, false, DType::kBf16, true, false},
};

// state.range(0): elements; state.range(1): threads (0 = all cores).
void BM_Adam(benchmark::State& state, KernelVariant variant, AdamCase c) {
  Buffers& b = Shared();
  const size_t n = static_cast<size_t>(state.range(0));
  AdamBuffers ab;
  ab.param = b.param;
  ab.grad = b.grad[static_cast<int>(c.grad)];
  ab.grad_type = c.grad;
  ab.exp_avg = b.exp_avg;
  ab.exp_avg_sq = b.exp_avg_sq;
  ab.state_type = c.state;
  ab.param16_out = c.has_param16 ? b.param16 : nullptr;
  ab.param16_type = c.param16;
  ab.n = n;
  std::memset(ab.exp_avg, 0, n * 4);
  std::memset(ab.exp_avg_sq, 0, n * 4);
  AdamOptions o;
  o.variant = variant;
  o.threads = static_cast<int>(state.range(1));
  o.check_finite = c.check_finite;
  o.stream_param16 = c.stream_param16;
  AdamHyper h;
  h.adamw = true;
  h.weight_decay = 0.01f;
  for (auto _ : state) {
    Result<AdamStepInfo> r = AdamStep(h, ab, o);
    if (!r.ok()) {
      state.SkipWithError(r.status().ToString().c_str());
      break;
    }
    ++h.step;
  }
  state.SetBytesProcessed(
      static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) *
      static_cast<int64_t>(AdamBytesPerElement(c.grad, c.state, c.has_param16)));
  state.counters["ns_per_elem"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n) * 1e-9,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_AccumulateGrad(benchmark::State& state, KernelVariant variant, DType type) {
  Buffers& b = Shared();
  const size_t n = static_cast<size_t>(state.range(0));
  KernelOptions o;
  o.variant = variant;
  o.threads = static_cast<int>(state.range(1));
  for (auto _ : state) {
    Result<bool> r = AccumulateGrad(b.scratch, b.grad[static_cast<int>(type)], type, n, 1e-3f, o);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(n * (8 + DTypeSize(type))));
}

void BM_AllFinite(benchmark::State& state, KernelVariant variant) {
  Buffers& b = Shared();
  const size_t n = static_cast<size_t>(state.range(0));
  KernelOptions o;
  o.variant = variant;
  o.threads = static_cast<int>(state.range(1));
  for (auto _ : state) {
    Result<bool> r = AllFinite(b.grad[0], DType::kF32, n, o);
    benchmark::DoNotOptimize(r);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 4));
}

void BM_StreamingCopy(benchmark::State& state, KernelVariant variant) {
  Buffers& b = Shared();
  const size_t n = static_cast<size_t>(state.range(0));
  KernelOptions o;
  o.variant = variant;
  o.threads = static_cast<int>(state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(StreamingCopy(b.scratch, b.param, n, o));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 8));
}

void BM_Triad(benchmark::State& state, KernelVariant variant) {
  Buffers& b = Shared();
  const size_t n = static_cast<size_t>(state.range(0));
  KernelOptions o;
  o.variant = variant;
  o.threads = static_cast<int>(state.range(1));
  for (auto _ : state) {
    benchmark::DoNotOptimize(Triad(b.scratch, b.param, b.exp_avg, 0.5f, n, o));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n * 12));
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->Args({64 << 10, 1});
  b->Args({static_cast<int64_t>(kMaxElems), 0});
  b->ArgNames({"elems", "threads"});
  b->Unit(benchmark::kMillisecond);
  b->UseRealTime();  // the work runs on other threads too
}

void RegisterAll() {
  for (KernelVariant v : {KernelVariant::kScalar, KernelVariant::kAvx2, KernelVariant::kAvx512,
                          KernelVariant::kAvx512Bf16}) {
    if (!VariantSupported(v, DetectCpuFeatures())) continue;
    const std::string vn(VariantName(v));
    for (const AdamCase& c : kAdamCases) {
      Sizes(benchmark::RegisterBenchmark(("Adam/" + vn + "/" + c.name).c_str(), BM_Adam, v, c));
    }
    for (DType t : {DType::kF32, DType::kBf16}) {
      Sizes(benchmark::RegisterBenchmark(
          ("AccumulateGrad/" + vn + "/" + std::string(DTypeName(t))).c_str(), BM_AccumulateGrad, v,
          t));
    }
    Sizes(benchmark::RegisterBenchmark(("AllFinite/" + vn).c_str(), BM_AllFinite, v));
    Sizes(benchmark::RegisterBenchmark(("StreamingCopy/" + vn).c_str(), BM_StreamingCopy, v));
    Sizes(benchmark::RegisterBenchmark(("Triad/" + vn).c_str(), BM_Triad, v));
  }
}

}  // namespace
}  // namespace zinf::kernels

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  zinf::kernels::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
