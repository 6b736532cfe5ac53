#include "src/train/planner.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "offload/optimizer_pipeline.h"
#include "src/base/units.h"
#include "src/ckpt/manifest.h"
#include "src/train/sizing.h"

namespace zinf::train {

namespace {

uint64_t Page(uint64_t b) { return (b + 4095) / 4096 * 4096; }

// What the parts of PlanRun share: the run's homes, rank 0's share of every unit and the sums
// over the units.
struct PlanContext {
  const Config& c;
  const PlanInputs& in;
  const StatePlacement& placement;
  bool state_nvme = false, params_nvme = false, swap = false;
  RankShare share;
  uint64_t grad_elem = 2;  // bytes of a gradient element in the host tier
  uint64_t p16_elems = 0, grad_elems = 0, derived_elems = 0;
  uint64_t max_state = 0, max_p16 = 0, max_grad = 0, max_per = 0;
  std::vector<uint64_t> state_n;  // each unit's optimizer-state elements (this rank's)
  unsigned slabs = 1;             // the optimizer pipeline's
  uint64_t p16_bytes = 0, grad_bytes = 0;
  uint64_t spare = 0;  // one copy in transfer per size: not cache
  uint64_t fixed = 0;  // the pinned memory outside the cache
};

// Across ranks: rank 0's share of every unit (its chunks are the largest), as the executor
// partitions it (executor.h, sizing.h).
PlanContext Shares(const Config& c, const PlanInputs& in, const StatePlacement& placement,
                   Plan& p) {
  PlanContext x{.c = c, .in = in, .placement = placement};
  const Model& d = in.dims;
  x.state_nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  x.params_nvme = c.zero.offload_param.device == OffloadDevice::kNvme;
  x.swap = x.state_nvme || x.params_nvme;
  p.world = std::max<uint32_t>(1, in.world);
  p.stage = p.world > 1 ? c.Stage() : 0;
  x.share = {.world = p.world, .rank = 0, .optimizer = p.stage >= 1, .grads = p.stage >= 2,
             .params = p.stage >= 3};
  x.grad_elem = in.micro_batches == 1 && p.world == 1 ? 2 : 4;
  p.state_params = 0;
  x.state_n.resize(d.units());
  for (uint32_t u = 0; u < d.units(); ++u) {
    const UnitShare k = ShareOfUnit(d.UnitParams(u), x.share);
    x.state_n[u] = k.state;
    p.state_params += k.state;
    x.p16_elems += k.param16;
    x.grad_elems += k.grad;
    // As the executor derives them: state in memory, not partitioned across ranks.
    const bool state_in_memory =
        !x.state_nvme || (u < placement.in_memory.size() && placement.in_memory[u] != 0);
    if (x.swap && state_in_memory && !x.share.optimizer && !x.share.params) {
      x.derived_elems += k.param16;
    }
    x.max_state = std::max(x.max_state, k.state);
    x.max_p16 = std::max(x.max_p16, k.param16);
    x.max_grad = std::max(x.max_grad, k.grad);
    x.max_per = std::max(x.max_per, k.per);
  }
  x.slabs = c.zinf.pipeline_depth + 1;
  x.p16_bytes = 2 * x.p16_elems;
  x.grad_bytes = x.grad_elem * x.grad_elems;
  return x;
}

// What each tier holds: the pinned budget's parts, the state's homes, the swap file.
void PlanMemory(PlanContext& x, Plan& p) {
  const Config& c = x.c;
  const PlanInputs& in = x.in;
  const Model& d = in.dims;
  PlanBytes& b = p.bytes;
  const uint64_t max_n = d.MaxUnitParams();
  b.device_budget = in.device_budget;
  b.device_weights = 2 * max_n;
  b.pinned_budget = in.pinned_budget;
  b.pinned_slabs = x.state_nvme ? x.slabs * Page(offload::OptimizerPipeline::SlabBytes(
                                                x.max_state, in.align, MomentType(c)))
                                : 0;
  b.pinned_staging = x.grad_elem == 4 ? 2 * Page(2 * max_n) : 0;
  // ZeRO-3's gathered units: the one in use and the next (world chunks of the largest).
  b.pinned_gathered = x.share.params && p.world > 1 ? 2 * Page(2 * x.max_per * p.world) : 0;
  // One copy in transfer per size (the largest 16-bit weight and gradient shards) is not cache.
  x.spare = Page(2 * x.max_p16) + Page(x.grad_elem * x.max_grad);
  // Without a swap space the 16-bit weights and gradients are homed in pinned memory.
  b.pinned_homed = x.swap ? 0 : x.p16_bytes + x.grad_bytes;
  x.fixed = b.pinned_slabs + b.pinned_staging + b.pinned_gathered + x.spare + b.pinned_homed;
  b.pinned_cache = b.pinned_budget > x.fixed ? b.pinned_budget - x.fixed : 0;
  b.host_state = x.placement.memory_bytes;
  b.nvme_state = x.state_nvme ? x.placement.nvme_bytes : 0;
  b.nvme_state_all = b.nvme_state * in.state_generations;
  b.param16_derived = 2 * x.derived_elems;
  b.nvme_param16 = x.swap ? x.p16_bytes - b.param16_derived : 0;
  b.nvme_grads = x.swap ? x.grad_bytes : 0;
  b.param16_held = x.p16_bytes;
  b.grads_held = x.grad_bytes;
  b.cache_wanted = x.p16_bytes + x.grad_bytes;
  // The swap file as zinf train sizes it (this rank's share).
  if (x.swap) b.swap_file = SwapBytes(d, c, in.state_generations, x.placement.in_memory, x.share);
  if (p.world > 1) p.comm_sent_per_step = CommSentPerStep(d, p.stage, p.world, in.micro_batches);
}

// NVMe bytes per step.
void PlanNvmeBytes(const PlanContext& x, Plan& p) {
  if (!x.swap) return;
  const PlanBytes& b = p.bytes;
  const double shortfall =
      static_cast<double>(b.cache_wanted > b.pinned_cache ? b.cache_wanted - b.pinned_cache : 0);
  const double state = static_cast<double>(b.nvme_state);
  // The 16-bit weights are evicted clean (their home is current); what the cache lacks beyond
  // them is gradients, written dirty before they are read back.
  const double p16 = static_cast<double>(x.p16_bytes);
  const double dirty = std::max(0.0, shortfall - p16);
  // Of the 16-bit weights the cache lacks, the derived ones are cast again, not read.
  const double derived_share = p16 > 0 ? static_cast<double>(b.param16_derived) / p16 : 0.0;
  p.nvme_read_per_step = state + shortfall - std::min(shortfall, p16) * derived_share;
  p.nvme_write_per_step =
      state + (x.state_nvme ? static_cast<double>(b.nvme_param16) : 0) + dirty;
}

// The passes that hide the optimizer step: the first forward, or with overlap_adam the last
// backward.
struct Passes {
  double first_forward = 0, last_backward = 0;
};

// The link: what each pass fetches and hands back, and the passes' times with the compute.
Passes PlanLink(const PlanContext& x, const PlanRates& rates, Plan& p) {
  const PlanInputs& in = x.in;
  const Model& d = in.dims;
  PlanBytes& b = p.bytes;
  const double mbs = std::max<uint32_t>(1, in.micro_batches);
  const double per_mb = p.compute_seconds / mbs;
  const double all16 = 2.0 * static_cast<double>(p.params);
  b.device_cache = in.device_reserved < in.device_budget ? in.device_budget - in.device_reserved : 0;
  // What a pass after the first fetches: what the cache did not keep. ZeRO-3 across ranks
  // copies each gathered unit to the device after its gather: every unit in each forward and
  // the blocks again in each backward (the embedding's and the final unit's fp32 weights stay
  // on the device). On a GPU the copy overlaps the unit before's kernels; on the
  // host-emulated device the compute waits for it (its thread computes).
  const bool gathered = x.share.params && p.world > 1;
  const double blocks16 = 2.0 * static_cast<double>(p.params - d.UnitParams(0) -
                                                    d.UnitParams(d.units() - 1));
  // The device tier's slots come in size classes, each with room for at least one copy
  // beside the one in transfer: the embedding and final units (one shard each) stay, and
  // what the cache lacks is blocks, whole ones (the backward fetches only blocks: the
  // embedding's and the final unit's weights stay in the executor's buffers from the forward).
  const double block16 = 2.0 * static_cast<double>(d.UnitParams(std::min<uint32_t>(1, d.units() - 1)));
  double refetch = 0;
  if (!gathered && static_cast<double>(b.device_cache) < all16 && in.device_reserved > 0) {
    const double lack = all16 - static_cast<double>(b.device_cache);
    refetch = std::min(blocks16, std::ceil(lack / block16) * block16);
  }
  const double fwd_again = gathered ? all16 : refetch, bwd_fetch = gathered ? blocks16 : refetch;
  const double grads16 = all16;  // every unit's 16-bit gradient, each micro-batch
  p.h2d_per_step = all16 + (mbs - 1) * fwd_again + mbs * bwd_fetch;
  p.d2h_per_step = mbs * grads16;
  const double rh = rates.link_h2d_gbps * 1e9, rd = rates.link_d2h_gbps * 1e9;
  const bool link = rh > 0 && rd > 0;
  auto pass = [&](double compute, double h2d, double d2h) {
    if (!link) return compute;
    if (gathered && rates.compute_on_host) {  // the fetches in series with the compute
      p.link_seconds += std::max(h2d / rh, d2h / rd);
      return std::max(compute + h2d / rh, d2h / rd);
    }
    // A pipeline of a unit's transfer and its compute: the slower side, plus one unit's
    // share (a block's) of the faster side at the pass's start or end (the forward's last
    // unit computes after the last fetch; the backward's first hand-over waits for the
    // first unit's compute).
    const double t = std::max(h2d / rh, d2h / rd);
    p.link_seconds += t;
    return std::max(compute, t) + std::min(compute, t) / std::max<uint32_t>(1, d.layers());
  };
  const double fwd = 0.25 * per_mb, bwd = per_mb - fwd;
  Passes passes;
  passes.first_forward = pass(fwd, all16, 0);
  passes.last_backward = pass(bwd, bwd_fetch, grads16);
  p.compute_link_seconds = passes.first_forward + passes.last_backward;
  for (double m = 1; m < mbs; ++m) {
    p.compute_link_seconds += pass(fwd, fwd_again, 0) + pass(bwd, bwd_fetch, grads16);
  }
  return passes;
}

// The optimizer step with the state on NVMe: its time and what of it the passes hide.
void PlanNvmeOptimizer(const PlanContext& x, const PlanRates& rates, const Passes& passes,
                       const std::string& computed, Plan& p) {
  // The optimizer pipeline starts with the last micro-batch's backward. Without overlap_adam
  // its Adam waits for the end of backward (the clipping coefficient), the state of its first
  // slabs' units read meanwhile; it then runs under the next step's first forward (2 of the 8
  // flops a parameter a token of forward, recompute and backward, of one micro-batch), and
  // that step's backward waits for it. With overlap_adam it takes the units in backward order
  // beside that backward (the other 6 of the 8), each unit's Adam as its gradient is final,
  // and the next forward waits for it. Its time: the state's reads and writes and the new
  // 16-bit weights' writes, or Adam when slower (the pipeline overlaps the two).
  // Across ZeRO-1/2 ranks each unit's chunk steps after backward on the training thread, one
  // unit at a time (read, Adam, then write: the gather of its new weights is a collective):
  // nothing is hidden, overlapped or read ahead. ZeRO-3's step has no collective and runs
  // under the next forward as above, but starts after backward: nothing is read under it.
  const Model& d = x.in.dims;
  const double ranks = static_cast<double>(p.world);
  const double r = rates.read_gbps * 1e9 / ranks, w = rates.write_gbps * 1e9 / ranks;
  const double state = static_cast<double>(p.bytes.nvme_state);
  const bool overlap = x.c.zinf.overlap_adam;
  const bool after_backward = !overlap && x.share.optimizer && !x.share.params;
  const double hidden_under =
      after_backward ? 0.0 : overlap ? passes.last_backward : passes.first_forward;
  double read = state;
  if (!overlap && !x.share.optimizer) {
    // The first slabs' units (unit order), read under backward.
    const uint64_t per_param = StateBytesPerParam(x.c);
    double ahead = 0;
    for (uint32_t k = 0; k < std::min<uint32_t>(x.slabs, d.units()); ++k) {
      if (k >= x.placement.in_memory.size() || !x.placement.in_memory[k]) {
        ahead += static_cast<double>(per_param * x.state_n[k]);
      }
    }
    p.state_read_under_backward = std::min(ahead, state);
    read -= p.state_read_under_backward;
  }
  const double io =
      r > 0 && w > 0 ? read / r + (state + static_cast<double>(p.bytes.nvme_param16)) / w : 0.0;
  p.optimizer_seconds = after_backward ? io + p.adam_seconds : std::max(io, p.adam_seconds);
  p.step_seconds = p.compute_link_seconds - hidden_under + std::max(hidden_under, p.optimizer_seconds);
  p.bound = p.optimizer_seconds > hidden_under
                ? computed + (p.optimizer_seconds > p.adam_seconds ? " + the optimizer's NVMe I/O"
                                                                   : " + Adam")
                : computed;
}

// The optimizer step with the state in memory.
void PlanMemoryOptimizer(const PlanContext& x, const PlanRates& rates, const Passes& passes,
                         const std::string& computed, Plan& p) {
  // The state in memory. Without overlap_adam Adam runs unit by unit on its own thread under
  // the next step's first forward (which takes each unit's new weights as they are written)
  // and that step's backward waits for the rest; with it each unit's Adam runs on the training
  // thread during the last backward, beside the device's backward kernels. On the
  // host-emulated device compute shares the CPU with Adam: nothing hides.
  // With the 16-bit weights homed on NVMe the step runs after backward (not under the
  // forward: their writes go through the tier manager's slots), unless they are derived
  // from the master weights (not across ZeRO ranks): nothing is written then.
  const bool overlap = x.c.zinf.overlap_adam;
  const bool under_forward = !x.params_nvme || (!x.share.optimizer && !x.share.params);
  const double hidden_under = rates.compute_on_host ? 0.0
                              : overlap            ? passes.last_backward
                              : under_forward      ? passes.first_forward
                                                   : 0.0;
  p.optimizer_seconds = p.adam_seconds;
  p.step_seconds = p.compute_link_seconds - hidden_under + std::max(hidden_under, p.adam_seconds);
  p.bound = p.adam_seconds > hidden_under ? computed + " + Adam" : computed;
}

// Step time and its bound from the measured rates.
void PlanTime(const PlanContext& x, const PlanRates& rates, Plan& p) {
  // Ranks on one machine share its drive and its CPU: every rank's NVMe bytes pass the same
  // disk, every rank's Adam runs on the same cores, and on the host-emulated device so does
  // every rank's compute (the rates are one process's alone).
  const double ranks = static_cast<double>(p.world);
  if (rates.read_gbps > 0 && rates.write_gbps > 0) {
    p.nvme_seconds = ranks * (p.nvme_read_per_step / (rates.read_gbps * 1e9) +
                              p.nvme_write_per_step / (rates.write_gbps * 1e9));
  }
  p.adam_seconds =
      ranks * rates.adam_ns_per_param * 1e-9 * static_cast<double>(p.state_params);
  p.compute_seconds = rates.compute_seconds * (rates.compute_on_host ? ranks : 1.0);
  const Passes passes = PlanLink(x, rates, p);
  // The link is named in the bound when it adds more than 1% to the compute.
  const bool link_shows = p.compute_link_seconds > p.compute_seconds * 1.01;
  const std::string computed = !link_shows                          ? "compute"
                               : p.link_seconds >= p.compute_seconds ? "link"
                                                                     : "compute and link";
  if (p.world > 1 && rates.comm_gbps > 0) {
    p.comm_seconds = p.comm_sent_per_step / (rates.comm_gbps * 1e9);
  }
  if (x.state_nvme) {
    PlanNvmeOptimizer(x, rates, passes, computed, p);
  } else {
    PlanMemoryOptimizer(x, rates, passes, computed, p);
  }
  // Across ranks the collectives a step issues, first-order: not hidden (over loopback their
  // copies take the same cores as compute).
  if (p.comm_seconds > 0) {
    p.step_seconds += p.comm_seconds;
    p.bound += " + collectives";
  }
  // Every NVMe byte of the step (the 16-bit weights and gradients the cache lacks too) must
  // pass within it.
  if (p.nvme_seconds > p.step_seconds) {
    p.step_seconds = p.nvme_seconds;
    p.bound = "NVMe";
  }
}

// Does it fit? Across ranks every rank's swap file is on the same drives (rank 0's, the
// largest, times the ranks: an upper bound).
void PlanFit(const PlanContext& x, Plan& p) {
  const PlanInputs& in = x.in;
  const PlanBytes& b = p.bytes;
  const uint64_t all_swap = b.swap_file * p.world;
  if (x.swap && in.swap_free_bytes > 0 && all_swap > in.swap_free_bytes) {
    p.fits = false;
    p.problems.push_back(fmt::format(
        "the swap file{} {} ({} bytes{}) but its file system has {} ({} bytes) free",
        p.world > 1 ? "s need" : " needs", FormatBytesHuman(all_swap), all_swap,
        p.world > 1 ? fmt::format(", {} ranks of up to {}", p.world, b.swap_file) : "",
        FormatBytesHuman(in.swap_free_bytes), in.swap_free_bytes));
    if (MomentType(x.c) == kernels::DType::kF32 && x.state_nvme) {
      const uint64_t saved = b.nvme_state_all * p.world / 3;  // 12 -> 8 bytes a parameter
      p.suggestions.push_back(fmt::format(
          "16-bit moments (--optimizer-state-dtype bf16) save {} of swap file{}",
          FormatBytesHuman(saved), all_swap - saved <= in.swap_free_bytes ? ": it then fits" : ""));
    }
    const uint64_t lack = all_swap - in.swap_free_bytes;
    if (x.state_nvme) {
      p.suggestions.push_back(fmt::format(
          "a host budget (--host-budget) of {} more{} keeps that much optimizer state in memory "
          "instead (one generation of it; checkpoints keep {})",
          FormatBytesHuman(lack / p.world / std::max<uint32_t>(1, in.state_generations) + 1),
          p.world > 1 ? " a rank" : "", in.state_generations));
    }
    p.suggestions.push_back(fmt::format(
        "a second drive with {} free (zinf.stripe_paths) stripes the swap file over both",
        FormatBytesHuman(lack)));
  }
  if (b.pinned_budget < x.fixed) {
    p.fits = false;
    p.problems.push_back(fmt::format(
        "zinf.budgets.pinned_bytes {} ({} bytes) cannot hold the optimizer's slabs {}, the "
        "gradient staging {}, the gathered units (ZeRO-3) {}, one copy of the largest 16-bit "
        "weight and gradient shards {} and the shards homed there (no NVMe) {} ({} bytes in all)",
        FormatBytesHuman(b.pinned_budget), b.pinned_budget, FormatBytesHuman(b.pinned_slabs),
        FormatBytesHuman(b.pinned_staging), FormatBytesHuman(b.pinned_gathered),
        FormatBytesHuman(x.spare), FormatBytesHuman(b.pinned_homed), x.fixed));
    p.suggestions.push_back(
        fmt::format("--pinned-budget {} or more (or auto)", FormatBytesHuman(x.fixed)));
  }
  const std::optional<uint64_t>& host = x.c.zinf.budgets.host_bytes;
  if (host && b.host_state > *host) {
    p.fits = false;
    p.problems.push_back(fmt::format("{} of optimizer state in memory exceeds "
                                     "zinf.budgets.host_bytes {}",
                                     FormatBytesHuman(b.host_state), FormatBytesHuman(*host)));
  }
}

}  // namespace

Plan PlanRun(const Config& c, const PlanInputs& in, const StatePlacement& placement,
             const PlanRates& rates) {
  Plan p;
  p.params = in.dims.TotalParams();
  p.placement = placement;
  PlanContext x = Shares(c, in, placement, p);
  PlanMemory(x, p);
  PlanNvmeBytes(x, p);
  PlanTime(x, rates, p);
  PlanFit(x, p);
  return p;
}

double CommSentPerStep(const Model& d, int stage, uint32_t world, uint32_t micro_batches) {
  if (world < 2) return 0;
  const double others = world - 1, mb = std::max<uint32_t>(1, micro_batches);
  double sent = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    const uint64_t n = d.UnitParams(u);
    const ckpt::UnitChunk k = ckpt::ChunkOfUnit(n, world, 0);
    const double per = static_cast<double>(k.per);
    if (stage == 0) {
      // The all-reduce: every other rank's region out, then rank 0's summed region to each.
      const double mine = static_cast<double>(k.len);
      sent += 4 * ((static_cast<double>(n) - mine) + others * mine);
      continue;
    }
    const bool block = u > 0 && u + 1 < d.units();
    if (stage == 1) sent += 4 * others * per;         // the fp32 sums, once a step
    if (stage >= 2) sent += 2 * others * per * mb;    // each micro-batch's 16-bit gradient
    if (stage <= 2) sent += 2 * others * per;         // the new 16-bit weights, gathered
    if (stage == 3) sent += 2 * others * per * mb * (block ? 2 : 1);  // forward, backward
  }
  return sent;
}

nlohmann::json Plan::ToJson() const {
  nlohmann::json j;
  j["params"] = params;
  j["world"] = world;
  j["stage"] = stage;
  j["state_params"] = state_params;
  j["placement"] = {{"how", placement.how},
                    {"memory_bytes", placement.memory_bytes},
                    {"nvme_bytes", placement.nvme_bytes},
                    {"in_memory", placement.in_memory}};
  j["bytes"] = {{"device",
                 {{"budget", bytes.device_budget},
                  {"weights", bytes.device_weights},
                  {"cache", bytes.device_cache}}},
                {"pinned",
                 {{"budget", bytes.pinned_budget},
                  {"optimizer_slabs", bytes.pinned_slabs},
                  {"gradient_staging", bytes.pinned_staging},
                  {"homed", bytes.pinned_homed},
                  {"gathered_units", bytes.pinned_gathered},
                  {"cache", bytes.pinned_cache},
                  {"cache_wanted", bytes.cache_wanted}}},
                {"host", {{"optimizer_state", bytes.host_state}}},
                {"held",
                 {{"param16", bytes.param16_held}, {"gradients", bytes.grads_held}}},
                {"nvme",
                 {{"optimizer_state", bytes.nvme_state},
                  {"optimizer_state_all_generations", bytes.nvme_state_all},
                  {"param16", bytes.nvme_param16},
                  {"param16_derived_from_memory", bytes.param16_derived},
                  {"gradients", bytes.nvme_grads},
                  {"swap_file", bytes.swap_file}}}};
  j["nvme_read_bytes_per_step"] = nvme_read_per_step;
  j["optimizer_state_read_under_backward_bytes"] = state_read_under_backward;
  j["nvme_write_bytes_per_step"] = nvme_write_per_step;
  if (world > 1) j["comm_sent_bytes_per_step"] = comm_sent_per_step;
  j["h2d_bytes_per_step"] = h2d_per_step;
  j["d2h_bytes_per_step"] = d2h_per_step;
  j["seconds"] = {{"nvme", nvme_seconds},
                  {"collectives", comm_seconds},
                  {"adam", adam_seconds},
                  {"optimizer", optimizer_seconds},
                  {"compute", compute_seconds},
                  {"link", link_seconds},
                  {"compute_with_link", compute_link_seconds},
                  {"step", step_seconds}};
  j["bound"] = bound;
  j["fits"] = fits;
  j["problems"] = problems;
  j["suggestions"] = suggestions;
  return j;
}

std::string FormatPlan(const Plan& p, const Model& d) {
  const PlanBytes& b = p.bytes;
  auto h = [](uint64_t v) { return FormatBytesHuman(v); };
  std::string s;
  s += fmt::format("model: {} parameters ({} units)\n", p.params, d.units());
  if (p.world > 1) {
    s += fmt::format("ranks  : {} on this machine, ZeRO stage {}; rank 0 (the largest chunks) "
                     "below: state of {} parameters, 16-bit weights {}, gradients {}; sends {} "
                     "a step\n",
                     p.world, p.stage, p.state_params, h(b.param16_held), h(b.grads_held),
                     h(static_cast<uint64_t>(p.comm_sent_per_step)));
  }
  s += fmt::format("optimizer state: {}\n", p.placement.Describe(d));
  s += fmt::format("device : budget {}; 16-bit weights of the unit in use {}{}\n",
                   h(b.device_budget), h(b.device_weights),
                   b.device_cache > 0 ? fmt::format(", cache for 16-bit weights {}", h(b.device_cache))
                                      : std::string());
  if (b.pinned_homed > 0) {
    s += fmt::format("pinned : budget {}; 16-bit weights and gradients homed there {}, gradient "
                     "staging {}\n",
                     h(b.pinned_budget), h(b.pinned_homed), h(b.pinned_staging));
  } else {
    s += fmt::format("pinned : budget {}; optimizer slabs {}, gradient staging {}, cache {} for "
                     "{} of 16-bit weights and gradients\n",
                     h(b.pinned_budget), h(b.pinned_slabs), h(b.pinned_staging),
                     h(b.pinned_cache), h(b.cache_wanted));
  }
  s += fmt::format("host   : optimizer state {}\n", h(b.host_state));
  if (b.param16_derived > 0) {
    s += fmt::format("host   : 16-bit weights {} cast from the master weights in memory when "
                     "loaded (not on NVMe; the swap file keeps their extents, never written)\n",
                     h(b.param16_derived));
  }
  s += fmt::format("nvme   : optimizer state {} (x{} generations: {}), 16-bit weights {}, "
                   "gradients {}; swap file {}\n",
                   h(b.nvme_state), b.nvme_state > 0 && b.nvme_state_all > b.nvme_state
                                        ? b.nvme_state_all / std::max<uint64_t>(1, b.nvme_state)
                                        : 1,
                   h(b.nvme_state_all), h(b.nvme_param16), h(b.nvme_grads), h(b.swap_file));
  s += fmt::format("per step: NVMe read {}, written {} ({:.2f} / {:.2f} bytes a parameter)\n",
                   h(static_cast<uint64_t>(p.nvme_read_per_step)),
                   h(static_cast<uint64_t>(p.nvme_write_per_step)),
                   p.nvme_read_per_step / static_cast<double>(p.params),
                   p.nvme_write_per_step / static_cast<double>(p.params));
  s += fmt::format("per step: to the device {}, back {}\n",
                   h(static_cast<uint64_t>(p.h2d_per_step)), h(static_cast<uint64_t>(p.d2h_per_step)));
  s += fmt::format("time   : step {:.2f} s, bound by {} (compute {:.2f} s; {}optimizer step {:.2f} "
                   "s, the larger of Adam {:.2f} s and its NVMe I/O; all of the step's NVMe I/O "
                   "{:.2f} s{})\n",
                   p.step_seconds, p.bound, p.compute_seconds,
                   p.link_seconds > 0 ? fmt::format("link {:.2f} s, with the compute {:.2f} s; ",
                                                    p.link_seconds, p.compute_link_seconds)
                                      : std::string("link not counted; "),
                   p.optimizer_seconds,
                   p.adam_seconds, p.nvme_seconds,
                   p.world > 1 ? fmt::format("; collectives {:.2f} s{}", p.comm_seconds,
                                             p.comm_seconds > 0 ? "" : " (no --comm-gbps)")
                               : "");
  if (!p.fits) {
    s += "does not fit:\n";
    for (const auto& x : p.problems) s += "  " + x + "\n";
    for (const auto& x : p.suggestions) s += "  would fit with: " + x + "\n";
  }
  return s;
}

}  // namespace zinf::train
