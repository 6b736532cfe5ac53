// src/train/sizing.h — what a run sizes from its config before anything is allocated: the Adam
// moments' type, the optimizer state's bytes a parameter, the swap file's capacity and the
// automatic pinned budget. `zinf train` (trainer.cc) and `zinf plan` (planner.cc, cmd_plan.cc)
// both call these, so the plan cannot drift from what the run then does.
//
// Contract.
// - MomentType: zinf.optimizer_state_dtype ("bf16" -> bf16, else fp32).
// - StateBytesPerParam: fp32 master weights and two moments (12 bytes, or 8 with bf16 moments).
// - SwapBytes: this rank's share (`share`, the executor's partition rule) of every unit's
//   16-bit weights (2 bytes an element: the unit, or its chunk with ZeRO-3) and gradient (4: the
//   unit, padded to world chunks with ZeRO-1, its chunk with ZeRO-2 and 3) and, for the units
//   whose optimizer state is on NVMe (`state_in_memory[u]` false or absent), `generations`
//   copies of that state (the unit, or its chunk with ZeRO-1 and up); each extent rounded up to
//   the stripe unit (SwapSpace aligns extents to it) plus an O_DIRECT block. One rank (the
//   default share): the whole model, 6 bytes a parameter beside the state.
// - AutoPinnedBudget: the pinned budget of a run whose config leaves zinf.budgets.pinned_bytes
//   unset: what the run wants (PinnedBytesWanted), at least one aio.block_size when it uses
//   NVMe (what the config's check asks of any budget), at most AutoPinnedCap() (a quarter of
//   the memory available now, at most 2 GiB). With the budget set, that budget.
//
// - AutoHostBytes: zinf.budgets.host_bytes "auto": the memory available beside the pinned
//   budget, the device budget (host memory on the host-emulated device; counted on a GPU too)
//   and a reserve of 2 GiB (the process, the corpus, the page cache's floor), in whole GiB;
//   0 when under 1 GiB would be left. Given `available` (MemAvailable) so the plan and the run
//   agree on the same reading.
//
// Thread-safety: plain functions over values (AutoPinnedBudget reads /proc/meminfo).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "src/config/config.h"
#include "src/train/executor.h"
#include "src/train/model.h"

namespace zinf::train {

kernels::DType MomentType(const Config& c);
uint64_t StateBytesPerParam(const Config& c);
// What one rank holds of each unit across ranks (ExecutorOptions::partition_*, over the ranks
// the state is partitioned among): rank `rank` of `world` takes ckpt::ChunkOfUnit's chunk.
struct RankShare {
  uint32_t world = 1, rank = 0;
  bool optimizer = false, grads = false, params = false;  // ZeRO-1, 2, 3
};
// The elements of a unit of n parameters this rank holds: its state, its 16-bit weights and
// its gradient (ZeRO-1: the unit padded to world chunks), and the chunk length `per`.
struct UnitShare {
  uint64_t state = 0, param16 = 0, grad = 0, per = 0;
};
UnitShare ShareOfUnit(uint64_t n, const RankShare& share);
uint64_t SwapBytes(const Model& d, const Config& c, uint32_t generations,
                   const std::vector<char>& state_in_memory, const RankShare& share = {});
uint64_t AutoPinnedBudget(const Model& d, const Config& c, const ExecutorOptions& eo);
uint64_t AutoHostBytes(uint64_t available, uint64_t pinned_budget, uint64_t device_budget);

}  // namespace zinf::train
