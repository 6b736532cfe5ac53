#include "src/runtime/offload_runtime.h"

#include <fstream>
#include <string>

#include <fmt/format.h>

#include "src/base/host_info.h"

namespace zinf {
namespace {

constexpr uint64_t kAutoDeviceBudget = 1ull << 30;
constexpr uint64_t kAutoPinnedCap = 2ull << 30;

}  // namespace

uint64_t AutoDeviceBudget() { return kAutoDeviceBudget; }

uint64_t DeviceBudgetOf(const Config& c) {
  return c.zinf.budgets.device_bytes.value_or(AutoDeviceBudget());
}

uint64_t AutoPinnedCap() { return std::min<uint64_t>(kAutoPinnedCap, MemAvailableBytes() / 4); }

bool UsesNvme(const Config& c) {
  return c.zero.offload_param.device == OffloadDevice::kNvme ||
         c.zero.offload_optimizer.device == OffloadDevice::kNvme;
}

Result<io::EngineOptions> EngineOptionsFromConfig(const Config& c) {
  io::EngineOptions o;
  auto kind = io::ParseEngineKind(c.aio.engine);
  if (!kind.ok()) return kind.status().WithContext(c.source + ": aio.engine");
  o.kind = *kind;
  o.block_size = c.aio.block_size;
  o.queue_depth = c.aio.queue_depth;
  o.posix_threads = c.aio.intra_op_parallelism > 1 ? c.aio.intra_op_parallelism : 0;
  return o;
}

Result<std::unique_ptr<OffloadRuntime>> MakeOffloadRuntime(const Config& c,
                                                           const RuntimeOptions& options) {
  ZINF_RETURN_IF_ERROR(c.Validate(options.model_rules));
  auto rt = std::make_unique<OffloadRuntime>();
  DeviceOptions dopt;
  dopt.budget_bytes = DeviceBudgetOf(c);
  dopt.kind = options.device_kind;
  dopt.cuda_ordinal = options.cuda_ordinal;
  dopt.copy_gbps = options.h2d_gbps;
  auto device = MakeDevice(dopt);
  if (!device.ok()) return device.status().WithContext(c.source + ": zinf.budgets.device_bytes");
  rt->device = std::move(device).value();
  auto arena = DeviceArena::Create(*rt->device);
  if (!arena.ok()) return arena.status().WithContext(c.source + ": zinf.budgets.device_bytes");
  rt->arena = std::move(arena).value();

  uint64_t pinned = c.zinf.budgets.pinned_bytes.value_or(AutoPinnedCap());
  auto pool = offload::PinnedPool::Create({.budget_bytes = pinned});
  if (!pool.ok()) return pool.status().WithContext(c.source + ": zinf.budgets.pinned_bytes");
  rt->pool = std::move(pool).value();

  if (options.use_nvme.value_or(UsesNvme(c))) {
    if (c.SwapDir().empty() && c.zinf.stripe_paths.empty()) {
      return InvalidArgument(c.source + ": NVMe offload needs a directory for its swap file: "
                             "zinf.swap_dir, zinf.stripe_paths or an offload nvme_path");
    }
    if (options.swap_bytes == 0) {
      return InvalidArgument("MakeOffloadRuntime: NVMe offload needs a swap size > 0");
    }
    std::vector<std::string> dirs = c.zinf.stripe_paths;
    if (dirs.empty()) dirs.push_back(c.SwapDir());
    ZINF_ASSIGN_OR_RETURN(io::EngineOptions eo, EngineOptionsFromConfig(c));
    eo.wrap_backend = options.wrap_backend;
    auto engine = io::Engine::Create(eo);
    if (!engine.ok()) return engine.status().WithContext(c.source + ": aio");
    rt->engine = std::move(engine).value();
    auto swap = offload::SwapSpace::Create(
        *rt->engine, {.dirs = dirs, .size = options.swap_bytes,
                      .stripe_bytes = c.zinf.stripe_bytes,
                      .remove_on_close = !options.keep_swap_files,
                      .keep_contents = options.reuse_swap_files});
    if (!swap.ok()) {
      return swap.status().WithContext(c.source + (c.zinf.stripe_paths.empty()
                                                       ? ": the offload nvme_path"
                                                       : ": zinf.stripe_paths"));
    }
    rt->swap = std::move(swap).value();
  }
  offload::TierManagerOptions to;
  to.prefetch = c.zinf.prefetch_depth > 0;
  to.prefetch_units = c.zinf.prefetch_depth;
  to.max_inflight_bytes = c.zinf.max_inflight_bytes;
  to.tracer = options.tracer;
  to.write_behind = options.write_behind;
  to.eviction_policy = c.zinf.eviction_policy;
  if (auto policy = offload::MakeEvictionPolicy(to.eviction_policy); !policy.ok()) {
    return policy.status().WithContext(c.source + ": zinf.eviction_policy");
  }
  ZINF_ASSIGN_OR_RETURN(rt->tiers, offload::TierManager::Create(*rt->arena, *rt->pool,
                                                                rt->swap.get(), to));
  return rt;
}

}  // namespace zinf
