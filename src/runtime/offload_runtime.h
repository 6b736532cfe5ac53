// src/runtime/offload_runtime.h — the offload machinery built from one Config.
//
// Contract: MakeOffloadRuntime reads the config's aio block (engine, block size, queue depth,
// posix threads), the budgets (device, pinned), the swap directories (zinf.stripe_paths, else
// the offload nvme_path), the stripe unit, the prefetch depth and the in-flight limit, and builds
// in order: the device (CUDA when built with it and a GPU answers, else the host-emulated one),
// the device arena (the whole device budget, reserved once: src/base/device_arena.h), the
// pinned pool, the I/O engine and swap file (only when something is offloaded to NVMe), and
// the tier manager. Every refusal names the config field it comes from. Budgets left "auto":
// the device budget is AutoDeviceBudget() (1 GiB, on the host-emulated device and on CUDA);
// the pinned budget AutoPinnedCap() (zinf train sizes it from the run's needs before, within
// that cap).
//
// Thread-safety: the runtime's parts are as thread-safe as each says; building is one call.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "io/engine.h"
#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "offload/tier_manager.h"
#include "src/base/device.h"
#include "src/base/device_arena.h"
#include "src/base/trace.h"
#include "src/config/config.h"

namespace zinf {

struct OffloadRuntime {
  // Declared so that destruction runs tiers, swap, engine, pool, arena, device.
  std::unique_ptr<Device> device;
  std::unique_ptr<DeviceArena> arena;  // every device buffer comes from here
  std::unique_ptr<offload::PinnedPool> pool;
  std::unique_ptr<io::Engine> engine;         // null when nothing is homed on NVMe
  std::unique_ptr<offload::SwapSpace> swap;   // null when nothing is homed on NVMe
  std::unique_ptr<offload::TierManager> tiers;
};

struct RuntimeOptions {
  uint64_t swap_bytes = 0;  // capacity of the swap file when NVMe is used (> 0 then)
  // Whether to build the I/O engine and swap file; unset: UsesNvme(config). The embedding
  // engine sets it from the homes its caller registered.
  std::optional<bool> use_nvme;
  // Whether zinf.model is what will run (Config::Validate's model rules); the embedding engine
  // pages its caller's tensors and sets false.
  bool model_rules = true;
  Tracer* tracer = nullptr;
  DeviceKind device_kind = DeviceKind::kAuto;  // `zinf train --device`
  int cuda_ordinal = 0;                         // which GPU (a rank's: LOCAL_RANK's)
  // The tier manager writes dirty host copies of NVMe-homed shards home as they are released
  // (TierManagerOptions::write_behind); the embedding engine sets it from zinf.write_behind.
  bool write_behind = false;
  double h2d_gbps = 0;  // host-emulated device: link rate per direction (0 = memcpy speed)
  // Checkpoints naming extents of the swap file: it outlives the process (keep), and a resume
  // reopens it with its contents (reuse; io/swap_file.h keep_contents).
  bool keep_swap_files = false;
  bool reuse_swap_files = false;
  // Tests: wraps the I/O backend (io::EngineOptions::wrap_backend), e.g. to inject faults.
  std::function<std::unique_ptr<io::Backend>(std::unique_ptr<io::Backend>)> wrap_backend;
};

// The device budget of a config that leaves zinf.budgets.device_bytes unset or "auto": 1 GiB.
// The one place that number lives (the runtime, zinf train's host-memory sizing and zinf plan
// all read it here).
uint64_t AutoDeviceBudget();

// The device budget `config` gives, else AutoDeviceBudget().
uint64_t DeviceBudgetOf(const Config& config);

// The most pinned memory an automatic budget takes: a quarter of the memory available now, at
// most 2 GiB.
uint64_t AutoPinnedCap();

Result<io::EngineOptions> EngineOptionsFromConfig(const Config& config);
// Whether any state is offloaded to NVMe (offload_param or offload_optimizer device "nvme").
bool UsesNvme(const Config& config);
Result<std::unique_ptr<OffloadRuntime>> MakeOffloadRuntime(const Config& config,
                                                           const RuntimeOptions& options);

}  // namespace zinf
