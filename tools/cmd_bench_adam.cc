// `zinf bench-adam`: times the CPU Adam step (kernels/cpu/adam.h) over N elements and, in the
// same run and on buffers of the same size, two memory probes: a STREAM triad and a copy with
// non-temporal stores (the memory's practical traffic limit). GB/s count bytes read plus
// written (28 per element for an fp32 step); ratio = adam_gbps / copy_gbps.
//
// Method: every buffer is first touched in parallel by the same thread arena that runs the
// kernels; then each iteration runs, for each kernel in turn (Adam step, copy, triad, finite
// scan), one untimed and one timed call; medians over the iterations are reported.
#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/cast.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/grad_ops.h"
#include "kernels/cpu/memory_probe.h"
#include "kernels/cpu/parallel.h"
#include "src/base/units.h"
#include "src/base/host_info.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

using kernels::DType;

struct BenchAdamArgs {
  std::string elements = "64M";
  std::string threads = "0";
  std::string variant = "auto";
  std::string grad = "fp32";
  std::string param16 = "none";
  std::string state = "fp32";
  std::string state_rounding = "nearest";
  std::string iters = "7";
  std::string chunk = "32K";
  bool check_finite = false;
  std::string stream_param16 = "on";
  bool no_huge_pages = false;
  bool no_baseline = false;
  bool json = false;
};

struct Config {
  std::vector<size_t> sizes;  // --elements: one run per size
  size_t n = 0;               // the size being run
  int threads = 0;
  kernels::KernelVariant variant = kernels::KernelVariant::kAuto;
  DType grad = DType::kF32;
  bool has_param16 = false;
  DType param16 = DType::kBf16;
  DType state = DType::kF32;
  bool stochastic_state = false;
  int iters = 7;
  size_t chunk = kernels::kDefaultChunkElems;
  bool stream_param16 = true;
};

// 2 MiB-aligned memory (transparent huge pages requested unless --no-huge-pages), freed with
// std::free.
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, FreeDeleter>;
constexpr size_t kHugePage = size_t{2} << 20;

Result<Buffer> Allocate(size_t bytes, bool huge_pages) {
  const size_t rounded = std::max(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) {
    return ResourceExhausted(
        fmt::format("cannot allocate {} for a benchmark buffer", FormatBytesHuman(rounded)));
  }
  // Advisory: fewer TLB misses when transparent huge pages are in madvise mode.
  madvise(p, rounded, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return Buffer(static_cast<unsigned char*>(p));
}

Result<Config> ParseConfig(const BenchAdamArgs& a) {
  Config c;
  size_t from = 0;
  while (from <= a.elements.size()) {
    const size_t comma = std::min(a.elements.find(',', from), a.elements.size());
    const std::string one = a.elements.substr(from, comma - from);
    Result<uint64_t> n = ParseBytes(one);
    if (!n.ok()) return n.status().WithContext("--elements '" + a.elements + "'");
    if (*n == 0) return InvalidArgument("--elements '" + a.elements + "': sizes must be > 0");
    c.sizes.push_back(*n);
    from = comma + 1;
  }
  Result<std::vector<uint64_t>> threads = ParseUintList(a.threads);
  if (!threads.ok() || threads->size() != 1 || (*threads)[0] > 4096) {
    return InvalidArgument("--threads '" + a.threads + "': expected one count (0 = all cores)");
  }
  c.threads = static_cast<int>((*threads)[0]);
  Result<kernels::KernelVariant> variant = kernels::ParseVariant(a.variant);
  if (!variant.ok()) return variant.status().WithContext("--variant");
  c.variant = *variant;
  if (!kernels::ParseDType(a.grad, &c.grad)) {
    return InvalidArgument("--grad '" + a.grad + "': expected fp32, bf16 or fp16");
  }
  if (a.param16 != "none") {
    if (!kernels::ParseDType(a.param16, &c.param16) || c.param16 == DType::kF32) {
      return InvalidArgument("--param16 '" + a.param16 + "': expected none, bf16 or fp16");
    }
    c.has_param16 = true;
  }
  if (!kernels::ParseDType(a.state, &c.state) || c.state == DType::kF16) {
    return InvalidArgument("--state '" + a.state + "': expected fp32 or bf16");
  }
  if (a.state_rounding != "nearest" && a.state_rounding != "stochastic") {
    return InvalidArgument("--state-rounding '" + a.state_rounding +
                           "': expected nearest or stochastic");
  }
  c.stochastic_state = a.state_rounding == "stochastic";
  Result<std::vector<uint64_t>> iters = ParseUintList(a.iters);
  if (!iters.ok() || iters->size() != 1 || (*iters)[0] < 1 || (*iters)[0] > 100000) {
    return InvalidArgument("--iters '" + a.iters + "': expected a count >= 1");
  }
  c.iters = static_cast<int>((*iters)[0]);
  Result<uint64_t> chunk = ParseBytes(a.chunk);
  if (!chunk.ok()) return chunk.status().WithContext("--chunk");
  if (*chunk == 0) return InvalidArgument("--chunk must be > 0 elements");
  c.chunk = *chunk;
  if (a.stream_param16 != "on" && a.stream_param16 != "off") {
    return InvalidArgument("--stream-param16 '" + a.stream_param16 + "': expected on or off");
  }
  c.stream_param16 = a.stream_param16 == "on";
  return c;
}

template <typename F>
double Seconds(F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A deterministic value in [-1, 1) from an index (a cheap integer hash).
float Pattern(uint64_t i, uint64_t salt) {
  uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ salt;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  return static_cast<float>(static_cast<int32_t>(x >> 32)) * (1.0f / 2147483648.0f);
}

// Calls per timed sample: enough that a sample of a small size lasts milliseconds (16M
// elements' worth), so the clock's resolution does not matter and each call's fixed cost (the
// threads' dispatch) is counted as often as a framework stepping many small tensors pays it.
size_t CallsPerSample(size_t n) {
  return std::clamp<size_t>((size_t{16} << 20) / n, 1, 100000);
}

struct SizeResult {
  size_t n = 0;
  double adam_ns_per_element = 0, adam_gbps = 0, copy_gbps = 0;
};

// The benchmark's buffers, each touched by the kernels' threads; a pointer is nullptr where its
// allocation failed.
struct Buffers {
  std::vector<Buffer> owned;
  float* param = nullptr;
  void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* param16 = nullptr;
  float* probe_a = nullptr;
  float* probe_b = nullptr;
  float* probe_c = nullptr;
  float* grad32 = nullptr;
  void* exp_avg32 = nullptr;
  void* exp_avg_sq32 = nullptr;
};

Status AllocateBuffers(const BenchAdamArgs& a, const Config& c,
                       const kernels::KernelOptions& kopt, bool with_baseline, Buffers& bufs) {
  const size_t n = c.n;
  auto buffer = [&](size_t bytes) -> unsigned char* {
    Result<Buffer> b = Allocate(bytes, !a.no_huge_pages);
    if (!b.ok()) return nullptr;
    if (!kernels::TouchPages(b->get(), bytes, kopt).ok()) return nullptr;
    bufs.owned.push_back(std::move(*b));
    return bufs.owned.back().get();
  };
  bufs.param = reinterpret_cast<float*>(buffer(n * 4));
  bufs.grad = buffer(n * kernels::DTypeSize(c.grad));
  bufs.exp_avg = buffer(n * kernels::DTypeSize(c.state));
  bufs.exp_avg_sq = buffer(n * kernels::DTypeSize(c.state));
  bufs.param16 = c.has_param16 ? buffer(n * 2) : nullptr;
  bufs.probe_a = reinterpret_cast<float*>(buffer(n * 4));
  bufs.probe_b = reinterpret_cast<float*>(buffer(n * 4));
  bufs.probe_c = reinterpret_cast<float*>(buffer(n * 4));
  // The baseline shares param, and the gradients and state when they are fp32.
  const bool own_grad32 = with_baseline && c.grad != DType::kF32;
  const bool own_state32 = with_baseline && c.state != DType::kF32;
  bufs.grad32 = own_grad32 ? reinterpret_cast<float*>(buffer(n * 4))
                           : reinterpret_cast<float*>(bufs.grad);
  bufs.exp_avg32 = own_state32 ? buffer(n * 4) : bufs.exp_avg;
  bufs.exp_avg_sq32 = own_state32 ? buffer(n * 4) : bufs.exp_avg_sq;
  const void* all[] = {bufs.param,   bufs.grad,    bufs.exp_avg, bufs.exp_avg_sq,
                       bufs.probe_a, bufs.probe_b, bufs.probe_c, bufs.grad32,
                       bufs.exp_avg32, bufs.exp_avg_sq32};
  for (const void* p : all) {
    if (p == nullptr) {
      return ResourceExhausted(fmt::format("cannot allocate the buffers for {} elements "
                                           "(about {} each)",
                                           n, FormatBytesHuman(n * 4)));
    }
  }
  if (c.has_param16 && bufs.param16 == nullptr) {
    return ResourceExhausted("cannot allocate the param16 buffer");
  }
  return Status::Ok();
}

Status FillBuffers(const Config& c, const kernels::KernelOptions& kopt, bool with_baseline,
                   const Buffers& b) {
  const size_t n = c.n;
  // Parameters ~ [-1, 1), gradients ~ 1e-3 * [-1, 1), state zero (TouchPages wrote zeros).
  kernels::ParallelForChunks(n, {c.threads, c.chunk}, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      b.param[i] = Pattern(i, 1);
      b.probe_a[i] = 1e-3f * Pattern(i, 4);
      b.probe_b[i] = Pattern(i, 2);
      b.probe_c[i] = Pattern(i, 3);
    }
  });
  // Gradients: the fp32 pattern (in probe_a for now) copied or rounded to each buffer.
  const bool own_grad32 = with_baseline && c.grad != DType::kF32;
  if (c.grad != DType::kF32) {
    ZINF_RETURN_IF_ERROR(kernels::CastFromF32(b.probe_a, b.grad, c.grad, n, kopt));
  }
  if (c.grad == DType::kF32 || own_grad32) {
    ZINF_RETURN_IF_ERROR(kernels::StreamingCopy(b.grad32, b.probe_a, n, kopt));
  }
  return Status::Ok();
}

// Per-call seconds of each kernel, one sample per iteration.
struct Timings {
  std::vector<double> adam, base, rel, copy, triad, scan;
};

Status TimeKernels(const Config& c, const kernels::KernelOptions& kopt,
                   const kernels::AdamOptions& aopt, const Buffers& b, bool with_baseline,
                   size_t calls, Timings& t) {
  const size_t n = c.n;
  kernels::AdamBuffers ab;
  ab.param = b.param;
  ab.grad = b.grad;
  ab.grad_type = c.grad;
  ab.exp_avg = b.exp_avg;
  ab.exp_avg_sq = b.exp_avg_sq;
  ab.state_type = c.state;
  ab.stochastic_state = c.stochastic_state;
  ab.state_seed = 1;
  ab.param16_out = b.param16;
  ab.param16_type = c.param16;
  ab.n = n;
  kernels::AdamBuffers base = ab;
  base.grad = b.grad32;
  base.grad_type = DType::kF32;
  base.exp_avg = b.exp_avg32;
  base.exp_avg_sq = b.exp_avg_sq32;
  base.state_type = DType::kF32;
  base.param16_out = nullptr;
  kernels::AdamOptions base_opt = aopt;
  base_opt.check_finite = false;
  kernels::AdamHyper hyper;  // torch.optim.Adam's defaults; the cost is the same for AdamW

  Status error;
  auto step = [&](const kernels::AdamBuffers& buffers, const kernels::AdamOptions& options) {
    Result<kernels::AdamStepInfo> r = kernels::AdamStep(hyper, buffers, options);
    if (!r.ok()) error = r.status();
    ++hyper.step;
  };
  auto adam_step = [&] { step(ab, aopt); };
  auto baseline_step = [&] { step(base, base_opt); };
  auto copy = [&] {
    if (Status s = kernels::StreamingCopy(b.probe_a, b.probe_b, n, kopt); !s.ok()) error = s;
  };
  auto triad = [&] {
    if (Status s = kernels::Triad(b.probe_a, b.probe_b, b.probe_c, 0.5f, n, kopt); !s.ok()) {
      error = s;
    }
  };
  auto scan = [&] {
    Result<bool> r = kernels::AllFinite(b.grad, c.grad, n, kopt);
    if (!r.ok()) error = r.status();
  };

  // Each timed run follows an untimed run of the same kernel, so every kernel is measured in
  // its own steady state (for example, the copy does not pay for writing back the dirty lines
  // an Adam step left in the caches), and the kernels alternate so that a disturbance on this
  // shared machine hits all of them alike.
  auto timed = [calls](auto& f) {
    f();
    return Seconds([&] {
             for (size_t r = 0; r < calls; ++r) f();
           }) /
           static_cast<double>(calls);
  };
  for (int k = 0; k < c.iters; ++k) {
    t.adam.push_back(timed(adam_step));
    if (with_baseline) {
      t.base.push_back(timed(baseline_step));
      t.rel.push_back(t.adam.back() / t.base.back());
    }
    t.copy.push_back(timed(copy));
    t.triad.push_back(timed(triad));
    t.scan.push_back(timed(scan));
    if (!error.ok()) return error;
  }
  return Status::Ok();
}

// The medians and the rates derived from them.
struct Rates {
  size_t adam_bpe = 0;
  double adam_s = 0, copy_s = 0, triad_s = 0, scan_s = 0;
  double adam_gbps = 0, copy_gbps = 0, triad_gbps = 0, scan_gbps = 0;
};

Rates ComputeRates(const Config& c, const Timings& t) {
  Rates r;
  r.adam_bpe = kernels::AdamBytesPerElement(c.grad, c.state, c.has_param16);
  r.adam_s = Median(t.adam);
  r.copy_s = Median(t.copy);
  r.triad_s = Median(t.triad);
  r.scan_s = Median(t.scan);
  const double nd = static_cast<double>(c.n);
  r.adam_gbps = r.adam_bpe * nd / r.adam_s / 1e9;
  r.copy_gbps = 8 * nd / r.copy_s / 1e9;
  r.triad_gbps = 12 * nd / r.triad_s / 1e9;
  r.scan_gbps = kernels::DTypeSize(c.grad) * nd / r.scan_s / 1e9;
  return r;
}

std::string Param16Name(const Config& c) {
  return c.has_param16 ? std::string(kernels::DTypeName(c.param16)) : "none";
}

void PrintSizeJson(const BenchAdamArgs& a, const Config& c, kernels::KernelVariant variant,
                   size_t calls, bool with_baseline, const Timings& t, const Rates& r) {
  const size_t n = c.n;
  const double nd = static_cast<double>(n);
  nlohmann::json j;
  j["variant"] = std::string(kernels::VariantName(variant));
  j["elements"] = n;
  j["threads"] = kernels::ResolveThreads(c.threads);
  j["grad"] = std::string(kernels::DTypeName(c.grad));
  j["state"] = std::string(kernels::DTypeName(c.state));
  j["state_rounding"] = c.stochastic_state ? "stochastic" : "nearest";
  j["param16"] = Param16Name(c);
  j["stream_param16"] = c.stream_param16;
  j["huge_pages"] = !a.no_huge_pages;
  j["check_finite"] = a.check_finite;
  j["iters"] = c.iters;
  j["calls_per_sample"] = calls;
  j["chunk_elems"] = c.chunk;
  j["bytes_per_element"] = r.adam_bpe;
  j["adam_ms"] = r.adam_s * 1e3;
  j["adam_gbps"] = r.adam_gbps;
  j["ns_per_element"] = r.adam_s * 1e9 / nd;
  j["copy_gbps"] = r.copy_gbps;
  j["triad_gbps"] = r.triad_gbps;
  j["ratio"] = r.adam_gbps / r.copy_gbps;
  if (with_baseline) {
    // The plain fp32 step timed interleaved with this one; vs_baseline = median over the
    // iterations of (this step's time / the baseline's time).
    j["baseline_ms"] = Median(t.base) * 1e3;
    j["vs_baseline"] = Median(t.rel);
  }
  j["finite_scan_ms"] = r.scan_s * 1e3;
  j["finite_scan_gbps"] = r.scan_gbps;
  // What check_finite costs relative to a step without it.
  j["finite_scan_fraction"] = r.scan_s / (a.check_finite ? r.adam_s - r.scan_s : r.adam_s);
  j["cpu_features"] = kernels::DescribeCpuFeatures(kernels::DetectCpuFeatures());
  fmt::print("{}\n", j.dump());
}

void PrintSizeTable(const BenchAdamArgs& a, const Config& c, kernels::KernelVariant variant,
                    size_t calls, bool with_baseline, const Timings& t, const Rates& r) {
  const size_t n = c.n;
  const double nd = static_cast<double>(n);
  fmt::print(
      "zinf bench-adam: {} elements ({}), {} threads, variant {}, grad {}, state {}{}, "
      "param16 {}{}{}; medians of {} iterations{}\n",
      n, FormatBytesShort(n), kernels::ResolveThreads(c.threads),
      std::string(kernels::VariantName(variant)), kernels::DTypeName(c.grad),
      kernels::DTypeName(c.state),
      c.state == DType::kBf16 ? (c.stochastic_state ? " (stochastic)" : " (nearest)") : "",
      Param16Name(c),
      c.has_param16 && c.stream_param16 ? " (streaming stores)" : "",
      a.check_finite ? ", check_finite on" : "", c.iters,
      calls > 1 ? fmt::format(" of {} calls each (times per call)", calls) : "");
  fmt::print("  {:<22} {:>6} B/elem {:>8.2f} GB/s {:>8.3f} ns/elem {:>9.2f} ms\n", "adam step",
             r.adam_bpe, r.adam_gbps, r.adam_s * 1e9 / nd, r.adam_s * 1e3);
  fmt::print("  {:<22} {:>6} B/elem {:>8.2f} GB/s {:>8.3f} ns/elem {:>9.2f} ms\n",
             "copy (streaming)", 8, r.copy_gbps, r.copy_s * 1e9 / nd, r.copy_s * 1e3);
  fmt::print("  {:<22} {:>6} B/elem {:>8.2f} GB/s {:>8.3f} ns/elem {:>9.2f} ms\n", "triad", 12,
             r.triad_gbps, r.triad_s * 1e9 / nd, r.triad_s * 1e3);
  fmt::print("  {:<22} {:>6} B/elem {:>8.2f} GB/s {:>8.3f} ns/elem {:>9.2f} ms\n",
             "finite scan (grad)", kernels::DTypeSize(c.grad), r.scan_gbps,
             r.scan_s * 1e9 / nd, r.scan_s * 1e3);
  if (with_baseline) {
    fmt::print("  {:<22} {:>6} B/elem {:>8.2f} GB/s {:>8.3f} ns/elem {:>9.2f} ms\n",
               "baseline fp32 step", 28, 28 * nd / Median(t.base) / 1e9, Median(t.base) * 1e9 / nd,
               Median(t.base) * 1e3);
    fmt::print("  this step / baseline (paired per iteration): {:.3f}\n", Median(t.rel));
  }
  fmt::print("  ratio adam/copy {:.3f}; check_finite costs {:.1f}% of a step\n",
             r.adam_gbps / r.copy_gbps,
             100 * r.scan_s / (a.check_finite ? r.adam_s - r.scan_s : r.adam_s));
}

int RunSize(const BenchAdamArgs& a, const Config& c, kernels::KernelVariant resolved,
            std::vector<SizeResult>* results) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf bench-adam: {}\n", s.ToString());
    return code;
  };
  kernels::KernelOptions kopt;
  kopt.variant = resolved;
  kopt.threads = c.threads;
  kopt.chunk_elems = c.chunk;
  kernels::AdamOptions aopt;
  aopt.variant = resolved;
  aopt.threads = c.threads;
  aopt.chunk_elems = c.chunk;
  aopt.check_finite = a.check_finite;
  aopt.stream_param16 = c.stream_param16;

  const size_t calls = CallsPerSample(c.n);
  // The baseline is the plain fp32 step (fp32 gradients and state, no 16-bit copy, no
  // pre-scan). When the configured step differs from it, both run interleaved in this process
  // so that the ratio of their times is measured under the same conditions.
  const bool plain =
      c.grad == DType::kF32 && c.state == DType::kF32 && !c.has_param16 && !a.check_finite;
  const bool with_baseline = !plain && !a.no_baseline;
  Buffers bufs;
  if (Status s = AllocateBuffers(a, c, kopt, with_baseline, bufs); !s.ok()) return fail(s, 1);
  if (Status s = FillBuffers(c, kopt, with_baseline, bufs); !s.ok()) return fail(s, 1);
  Timings t;
  if (Status s = TimeKernels(c, kopt, aopt, bufs, with_baseline, calls, t); !s.ok()) {
    return fail(s, 1);
  }
  const Rates r = ComputeRates(c, t);
  if (a.json) {
    PrintSizeJson(a, c, resolved, calls, with_baseline, t, r);
    return 0;
  }
  PrintSizeTable(a, c, resolved, calls, with_baseline, t, r);
  const double nd = static_cast<double>(c.n);
  results->push_back({c.n, r.adam_s * 1e9 / nd, r.adam_gbps, r.copy_gbps});
  return 0;
}

int RunBenchAdam(const BenchAdamArgs& a) {
  Result<Config> parsed = ParseConfig(a);
  if (!parsed.ok()) {
    fmt::print(stderr, "zinf bench-adam: {}\n", parsed.status().ToString());
    return 2;
  }
  Config c = *parsed;
  Result<kernels::KernelVariant> variant = kernels::ResolveVariant(c.variant);
  if (!variant.ok()) {
    fmt::print(stderr, "zinf bench-adam: {}\n", variant.status().ToString());
    return 2;
  }
  std::vector<SizeResult> results;
  for (size_t n : c.sizes) {
    c.n = n;
    if (int rc = RunSize(a, c, *variant, &results); rc != 0) return rc;
  }
  if (results.size() > 1 && !a.json) {
    fmt::print("size sweep (adam step, per call):\n  {:>12} {:>10} {:>10} {:>10}\n", "elements",
               "ns/elem", "GB/s", "copy GB/s");
    for (const SizeResult& r : results) {
      fmt::print("  {:>12} {:>10.3f} {:>10.2f} {:>10.2f}\n", FormatBytesShort(r.n),
                 r.adam_ns_per_element, r.adam_gbps, r.copy_gbps);
    }
  }
  return 0;
}

}  // namespace

void RegisterBenchAdam(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchAdamArgs>();
  auto* cmd = app.add_subcommand(
      "bench-adam",
      "Time the CPU Adam step against the memory's streaming-copy and triad bandwidth");
  cmd->add_option("--elements", args->elements,
                  "Elements per buffer (suffixes K, M, G: 2^10...); a comma-separated list runs "
                  "each size (a sweep)")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Threads (0 = all cores)")->capture_default_str();
  cmd->add_option("--variant", args->variant, "auto, scalar, avx2, avx512 or avx512_bf16")
      ->capture_default_str();
  cmd->add_option("--grad", args->grad, "Gradient type: fp32, bf16 or fp16")->capture_default_str();
  cmd->add_option("--param16", args->param16, "16-bit copy of the new weights: none, bf16, fp16")
      ->capture_default_str();
  cmd->add_option("--state-rounding", args->state_rounding,
                  "bf16 state: rounded to nearest or stochastically")
      ->capture_default_str();
  cmd->add_option("--state", args->state, "exp_avg / exp_avg_sq type: fp32 or bf16")
      ->capture_default_str();
  cmd->add_option("--iters", args->iters, "Timed iterations (medians reported)")
      ->capture_default_str();
  cmd->add_option("--chunk", args->chunk, "Elements per parallel chunk")->capture_default_str();
  cmd->add_flag("--check-finite", args->check_finite,
                "Include the inf/NaN pre-scan of the gradients in the timed step");
  cmd->add_option("--stream-param16", args->stream_param16,
                  "Non-temporal stores for the 16-bit weight copy: on or off")
      ->capture_default_str();
  cmd->add_flag("--no-huge-pages", args->no_huge_pages,
                "Ask for 4 KiB pages (MADV_NOHUGEPAGE) instead of transparent huge pages");
  cmd->add_flag("--no-baseline", args->no_baseline,
                "Do not also time the plain fp32 step (when the options differ from it)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args, &exit_code] { exit_code = RunBenchAdam(*args); });
}

}  // namespace zinf::tools
