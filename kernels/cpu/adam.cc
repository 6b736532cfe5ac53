#include "kernels/cpu/adam.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"

namespace zinf::kernels {
namespace {

using internal::ElementAt;

Status CheckRange(const char* name, float value, bool ok, const char* expected) {
  if (std::isfinite(value) && ok) return Status::Ok();
  return InvalidArgument(fmt::format("Adam hyper-parameter {} = {}: expected a finite value {}",
                                     name, value, expected));
}

bool KnownDType(DType t) { return t == DType::kF32 || t == DType::kBf16 || t == DType::kF16; }

Status Validate(const AdamHyper& h, const AdamBuffers& b) {
  ZINF_RETURN_IF_ERROR(CheckRange("lr", h.lr, h.lr >= 0, ">= 0"));
  ZINF_RETURN_IF_ERROR(CheckRange("beta1", h.beta1, h.beta1 >= 0 && h.beta1 < 1, "in [0, 1)"));
  ZINF_RETURN_IF_ERROR(CheckRange("beta2", h.beta2, h.beta2 >= 0 && h.beta2 < 1, "in [0, 1)"));
  ZINF_RETURN_IF_ERROR(CheckRange("eps", h.eps, h.eps >= 0, ">= 0"));
  ZINF_RETURN_IF_ERROR(CheckRange("weight_decay", h.weight_decay, h.weight_decay >= 0, ">= 0"));
  ZINF_RETURN_IF_ERROR(CheckRange("grad_scale", h.grad_scale, true, ""));
  if (h.step < 1) {
    return InvalidArgument("Adam step = " + std::to_string(h.step) +
                           ": steps are 1-based (the first step is 1)");
  }
  if (!KnownDType(b.grad_type)) return InvalidArgument("Adam grad_type is not fp32, bf16 or fp16");
  if (b.state_type != DType::kF32 && b.state_type != DType::kBf16) {
    return InvalidArgument("Adam state_type " + std::string(DTypeName(b.state_type)) +
                           " is not supported: use fp32 or bf16");
  }
  if (b.param16_out != nullptr &&
      (b.param16_type != DType::kBf16 && b.param16_type != DType::kF16)) {
    return InvalidArgument(
        "Adam param16_type must be bf16 or fp16 (param itself is the fp32 copy)");
  }
  if (b.n == 0) return Status::Ok();
  if (b.param == nullptr) return InvalidArgument("Adam param is null with n > 0");
  if (b.grad == nullptr) return InvalidArgument("Adam grad is null with n > 0");
  if (b.exp_avg == nullptr) return InvalidArgument("Adam exp_avg is null with n > 0");
  if (b.exp_avg_sq == nullptr) return InvalidArgument("Adam exp_avg_sq is null with n > 0");
  return Status::Ok();
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

internal::AdamCoeffs MakeCoeffs(const AdamHyper& h, uint64_t state_seed) {
  const double beta1 = h.beta1, beta2 = h.beta2, t = static_cast<double>(h.step);
  const double bc1 = h.bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bc2 = h.bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  internal::AdamCoeffs c;
  c.beta1 = h.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.beta2 = h.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.neg_step_size = static_cast<float>(-static_cast<double>(h.lr) / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = h.eps;
  c.decay = h.adamw ? static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay) : 1.0f;
  c.l2 = h.adamw ? 0.0f : h.weight_decay;
  c.grad_scale = h.grad_scale;
  const uint64_t s = SplitMix64(state_seed);
  c.seed_m = static_cast<uint32_t>(s);
  c.seed_v = static_cast<uint32_t>(s >> 32);
  return c;
}

// A tensor of fewer chunks than threads would run on fewer threads than it could: such a tensor
// is cut into one piece per thread instead, of at least kMinSplitElems (64-aligned, so aligned
// buffers stay aligned). Frameworks step many small tensors (biases, norms, small layers):
// measured on 2 threads against DeepSpeed's OpenMP step (bench/adam_vs_deepspeed), 16K and
// 32K elements ran ~15-30% faster split in two than on the calling thread alone; below ~8K a
// second thread's wake-up costs more than it saves.
constexpr size_t kMinSplitElems = size_t{8} << 10;

size_t ChunkFor(size_t n, int threads, size_t chunk) {
  if (threads < 2 || n >= chunk * static_cast<size_t>(threads)) return chunk;
  size_t per = (n + threads - 1) / static_cast<size_t>(threads);
  per = std::max((per + 63) / 64 * 64, kMinSplitElems);
  return std::min(per, chunk);
}

// The kernel's view of a tensor's types, and of its elements [lo, hi).
internal::AdamLayout LayoutOf(const AdamBuffers& b, const AdamOptions& o) {
  internal::AdamLayout layout;
  layout.grad_type = b.grad_type;
  layout.state_type = b.state_type;
  layout.stochastic_state = b.stochastic_state && b.state_type == DType::kBf16;
  layout.has_param16 = b.param16_out != nullptr;
  layout.param16_type = b.param16_type;
  layout.stream_param16 = o.stream_param16;
  return layout;
}

internal::AdamChunk ChunkOf(const AdamBuffers& b, size_t lo, size_t hi) {
  internal::AdamChunk chunk;
  chunk.param = b.param + lo;
  chunk.grad = ElementAt(b.grad, b.grad_type, lo);
  chunk.exp_avg = ElementAt(b.exp_avg, b.state_type, lo);
  chunk.exp_avg_sq = ElementAt(b.exp_avg_sq, b.state_type, lo);
  chunk.param16 = b.param16_out != nullptr ? ElementAt(b.param16_out, b.param16_type, lo)
                                           : nullptr;
  chunk.n = hi - lo;
  chunk.first = b.state_index_base + lo;
  return chunk;
}

}  // namespace

uint64_t StateRoundingSeed(uint64_t run_seed, int64_t step, uint64_t tensor) {
  return SplitMix64(SplitMix64(SplitMix64(run_seed) ^ static_cast<uint64_t>(step)) ^ tensor);
}

size_t AdamBytesPerElement(DType grad_type, DType state_type, bool has_param16) {
  // param read + write, grad read, m and v read + write, 16-bit copy written.
  return 2 * sizeof(float) + DTypeSize(grad_type) + 4 * DTypeSize(state_type) +
         (has_param16 ? 2 : 0);
}

Result<AdamStepInfo> AdamStep(const AdamHyper& hyper, const AdamBuffers& b,
                              const AdamOptions& options) {
  ZINF_RETURN_IF_ERROR(Validate(hyper, b));
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  d.parallel.observer = options.observer;
  d.parallel.chunk_elems = ChunkFor(b.n, d.parallel.threads, d.parallel.chunk_elems);
  AdamStepInfo info;
  info.variant = d.variant;
  info.threads = d.parallel.threads;
  if (b.n == 0) return info;
  if (options.check_finite && !internal::ParallelAllFinite(d, b.grad, b.grad_type, b.n)) {
    info.found_nonfinite = true;
    return info;
  }
  const internal::AdamCoeffs coeffs = MakeCoeffs(hyper, b.state_seed);
  const internal::AdamLayout layout = LayoutOf(b, options);
  const internal::VariantKernels& k = *d.kernels;
  ParallelForChunks(b.n, d.parallel, [&](size_t begin, size_t end) {
    k.adam(coeffs, layout, ChunkOf(b, begin, end));
  });
  return info;
}

Result<AdamStepInfo> AdamStepMany(std::span<const AdamHyper> hypers,
                                  std::span<const AdamBuffers> buffers,
                                  const AdamOptions& options) {
  if (hypers.size() != buffers.size()) {
    return InvalidArgument(fmt::format("AdamStepMany: {} hyper-parameter sets for {} tensors",
                                       hypers.size(), buffers.size()));
  }
  // Each tensor's first element in the one range, on a 64-element boundary.
  std::vector<size_t> start(buffers.size() + 1, 0);
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (Status s = Validate(hypers[i], buffers[i]); !s.ok())
      return Status(s.code(), fmt::format("tensor {}: {}", i, s.message()));
    start[i + 1] = start[i] + (buffers[i].n + 63) / 64 * 64;
  }
  const size_t total = start.back();
  ZINF_ASSIGN_OR_RETURN(
      internal::Dispatch d,
      internal::ResolveDispatch(options.variant, options.threads, options.chunk_elems));
  d.parallel.observer = options.observer;
  d.parallel.chunk_elems = ChunkFor(total, d.parallel.threads, d.parallel.chunk_elems);
  AdamStepInfo info;
  info.variant = d.variant;
  info.threads = d.parallel.threads;
  if (total == 0) return info;
  if (options.check_finite) {
    for (const AdamBuffers& b : buffers) {
      if (b.n > 0 && !internal::ParallelAllFinite(d, b.grad, b.grad_type, b.n)) {
        info.found_nonfinite = true;
        return info;
      }
    }
  }
  std::vector<internal::AdamCoeffs> coeffs(buffers.size());
  std::vector<internal::AdamLayout> layouts(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    coeffs[i] = MakeCoeffs(hypers[i], buffers[i].state_seed);
    layouts[i] = LayoutOf(buffers[i], options);
  }
  const internal::VariantKernels& k = *d.kernels;
  ParallelForChunks(total, d.parallel, [&](size_t begin, size_t end) {
    // The last tensor starting at or before `begin`, then every one starting before `end`.
    size_t i = size_t(std::upper_bound(start.begin(), start.end() - 1, begin) - start.begin()) - 1;
    for (; i < buffers.size() && start[i] < end; ++i) {
      const AdamBuffers& b = buffers[i];
      const size_t lo = std::max(begin, start[i]) - start[i];
      const size_t hi = std::min(end - start[i], b.n);
      if (lo >= hi) continue;  // the padding after tensor i
      k.adam(coeffs[i], layouts[i], ChunkOf(b, lo, hi));
    }
  });
  return info;
}

}  // namespace zinf::kernels
