// src/train/placement.h — where each unit's optimizer state lives (zinf train --placement).
//
// Contract. With zero_optimization.offload_optimizer.device "nvme", each unit's optimizer state
// (fp32 master weights and the two moments: 12 bytes a parameter, 8 with bf16 moments) has its
// home either on NVMe or in plain host memory (ExecutorOptions::state_in_memory). The choice:
// - "auto" (the default): the units that fit in zinf.budgets.host_bytes go to memory, taken
//   from the last unit back (the optimizer step updates units in order: the NVMe units' reads
//   start at once and the units in memory are updated while the last writes drain). Without
//   zinf.budgets.host_bytes nothing goes to memory (the config said NVMe).
// - "nvme": every unit on NVMe, whatever zinf.budgets.host_bytes says.
// - a JSON file: {"optimizer_state": {"<unit name>": "memory" | "nvme", ...}}; units not named
//   stay on NVMe. Unit names are Model::UnitName's ("embedding", "block0" or "layer0".., "final").
// A resume (`recorded`: the units the checkpoint's run kept in memory) takes the checkpoint's
// placement under "auto": the swap file's layout follows it.
// Refused, naming the file, key or value and what was expected: an unknown unit or home, a
// file that does not parse, state in memory beyond zinf.budgets.host_bytes or beyond the
// machine's available memory (both with the numbers), a placement file when the optimizer
// state is not on NVMe. With offload_optimizer.device "cpu" / "none" every unit is in memory
// and "auto" / "nvme" change nothing.
// Bytes are this rank's: `state_elems(u)` gives the elements of unit u's state it holds.
// Across ranks (ZeRO-1/2/3) each rank places its own chunks: zinf.budgets.host_bytes is per
// rank (N ranks on one machine may use N times it; each checks only its own against the
// machine's available memory), and with a budget near a unit's boundary the ranks' placements
// may differ (rank 0's chunks are the largest). Training is the same bits either way.
//
// Thread-safety: plain functions over values.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/config/config.h"
#include "src/train/model.h"
#include "zinf/status.h"

namespace zinf::train {

struct StatePlacement {
  std::vector<char> in_memory;  // per unit
  uint64_t memory_bytes = 0;    // of state in host memory
  uint64_t nvme_bytes = 0;      // of state on NVMe (one generation)
  std::string how;              // "auto", "nvme", or the file's path
  // "block20..block31, final in memory (1.2 GiB); 22 units on NVMe (3.4 GiB)" and the like.
  std::string Describe(const Model& d) const;
};

// `placement`: "auto", "nvme" or a file's path; `state_bytes_per_param`: 12 or 8;
// `available_bytes`: what the machine can still give (MemAvailable less the pinned budget).
Result<StatePlacement> PlaceOptimizerState(const Model& d, const Config& c,
                                           const std::string& placement,
                                           uint64_t state_bytes_per_param,
                                           const std::function<uint64_t(uint32_t)>& state_elems,
                                           uint64_t available_bytes,
                                           const std::vector<std::string>* recorded = nullptr);

}  // namespace zinf::train
