// src/train/planner.h — `zinf plan`: what a run of this config will hold in each tier, the NVMe
// bytes it moves per step, and the step time that follows from the machine's rates.
//
// Contract. PlanRun is arithmetic over the model, the config and the placement (no I/O):
// - bytes per tier and role: device (the one unit's 16-bit weights in use, the rest of the
//   budget for activations), pinned (the optimizer pipeline's slabs and gradient staging; the
//   rest caches 16-bit weights and gradients), host memory (optimizer state placed there),
//   NVMe (the optimizer state placed there, times its generations; the 16-bit weights' and
//   gradients' homes);
// - NVMe bytes per step: the state on NVMe read and written once; the new 16-bit weights
//   written home; and what the pinned cache cannot hold of the 16-bit weights and gradients,
//   read back (the shortfall), the part of it that is gradients also written (dirty);
// - time per step: compute as measured; Adam = state parameters x ns a parameter; with the
//   state on NVMe the optimizer step (the larger of Adam and its I/O: state read / read rate +
//   state and new 16-bit weights written / write rate) runs under the next step's first
//   forward, a quarter of one micro-batch's compute (2 of the 8 flops a parameter a token of
//   forward, recompute and backward), and backward waits for it: step = compute - forward +
//   max(forward, optimizer step), the state of the pipeline's first zinf.pipeline_depth + 1
//   units being read during the previous backward (not in the optimizer step's time); with
//   zinf.overlap_adam the optimizer step runs beside the last micro-batch's backward (the
//   other three quarters) instead: step = compute - backward + max(backward, optimizer step);
//   across ZeRO-1/2 ranks without overlap_adam it runs after backward, a unit at a time (each
//   unit's gather is a collective): step = compute + optimizer step, that step being its I/O
//   plus Adam (not overlapped); across ranks (ZeRO-1..3) nothing is read under backward;
//   with the state in memory Adam runs unit by unit under the next forward (with overlap_adam
//   beside the last backward) in the same way: step = compute - hidden + max(hidden, Adam), on
//   the host-emulated device (compute on the CPU Adam uses) hidden = 0. Every NVMe byte of the
//   step at those rates is a floor under it. The bound is the part that sets it.
// - the link (host <-> device): each micro-batch's forward fetches the 16-bit weights the
//   device cache does not hold (the first forward of a step all of them: they are new), its
//   backward fetches the blocks again less what the cache kept from the forward (whole blocks;
//   the cache keeps the units used soonest, and the embedding and final units always) and
//   hands every unit's 16-bit
//   gradient back. Each pass takes the larger of its compute (forward a quarter of a
//   micro-batch's, backward the rest) and its transfers (backward: the larger direction; the
//   link is full duplex), plus a block's share of the smaller (the pipeline's fill: the
//   forward's last unit computes after the last fetch, the backward's first hand-over waits
//   for the first unit's compute); that sum stands for the compute in the formulas above, and the
//   forward's pass is what hides the optimizer step. Without link rates it is the compute.
//   The bound names the link when it adds more than 1% to the compute ("link" when the link's
//   own time is the larger, else "compute and link").
//   ZeRO-3 across ranks copies each gathered unit to the device: every unit in each forward,
//   the blocks again in each backward; on the host-emulated device in series with the compute
//   (the thread that computes waits for each copy).
// - fits: the swap file against the free space of its file system and the state in memory
//   against zinf.budgets.host_bytes; when it does not fit, what would: 16-bit moments, a bigger
//   host budget, a second drive (its size).
// - across ranks (PlanInputs::world > 1, the config's ZeRO stage): every byte above is rank 0's
//   share (its chunks are the largest; sizing.h's RankShare), CommSentPerStep what it sends a
//   step; the time is the machine's: the ranks share its drive and cores (NVMe, Adam and, on
//   the host-emulated device, compute count world times), plus the collectives at
//   PlanRates::comm_gbps, not hidden; the fit checks every rank's swap file.
// The model is a first-order one: it ignores the first step (cold) and the prefetcher's
// timing; its error against measured steps is in docs/benchmarks.md.
//
// Thread-safety: plain functions over values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/config/config.h"
#include "src/train/model.h"
#include "src/train/placement.h"

namespace zinf::train {

struct PlanRates {
  double read_gbps = 0, write_gbps = 0;  // the swap directories together, 10^9 B/s
  double comm_gbps = 0;                  // a rank's collectives, bytes sent a second (0: none)
  double adam_ns_per_param = 0;          // CPU Adam over state in memory (the moment type)
  double compute_seconds = 0;            // forward + backward of a step (all micro-batches)
  // The host-device link, bytes a second each way (0: not counted): the 16-bit weights fetched
  // to the device and the 16-bit gradients handed back.
  double link_h2d_gbps = 0, link_d2h_gbps = 0;
  bool compute_on_host = true;           // the host-emulated device: compute shares the CPU
  std::string source;                    // where the rates came from, in words
};

struct PlanBytes {
  // Device
  uint64_t device_budget = 0, device_weights = 0;
  // What the budget keeps of the 16-bit weights between uses: the budget less the executor's
  // and the backend's buffers (PlanInputs::device_reserved).
  uint64_t device_cache = 0;
  // Pinned
  uint64_t pinned_budget = 0, pinned_slabs = 0, pinned_staging = 0, pinned_cache = 0;
  uint64_t pinned_homed = 0;  // 16-bit weights and gradients homed there (no NVMe)
  uint64_t pinned_gathered = 0;  // ZeRO-3: the gathered units (two of the largest)
  // The 16-bit weight and gradient shards this rank holds (its chunks across ranks).
  uint64_t param16_held = 0, grads_held = 0;
  // Host memory (plain) and NVMe, by role
  uint64_t host_state = 0;
  uint64_t nvme_state = 0;       // one generation
  uint64_t nvme_state_all = 0;   // every generation (checkpoints)
  uint64_t nvme_param16 = 0, nvme_grads = 0;
  // 16-bit weights cast from master weights in memory when loaded (never on NVMe): the units
  // whose state is in memory, unless ZeRO partitions the state (executor.h, Param16Derived).
  uint64_t param16_derived = 0;
  uint64_t swap_file = 0;        // the swap file's size
  // 16-bit weights and gradients the pinned cache should hold for a step without re-reads.
  uint64_t cache_wanted = 0;
};

struct Plan {
  uint64_t params = 0;
  uint64_t state_params = 0;  // this rank's: its chunks across ranks
  uint32_t world = 1;         // ranks on this machine
  int stage = 0;              // ZeRO stage across ranks (0 with one rank)
  double comm_sent_per_step = 0, comm_seconds = 0;  // a rank's collectives (world > 1)
  StatePlacement placement;
  PlanBytes bytes;
  double nvme_read_per_step = 0, nvme_write_per_step = 0;
  double nvme_seconds = 0, adam_seconds = 0, compute_seconds = 0, step_seconds = 0;
  double optimizer_seconds = 0;  // the optimizer step: Adam, or its NVMe I/O when slower
  // The link: bytes to and from the device a step, the link's own time (its passes back to
  // back) and the compute with it (each pass the larger of its compute and its transfers).
  double h2d_per_step = 0, d2h_per_step = 0;
  double link_seconds = 0, compute_link_seconds = 0;
  // Without overlap_adam: the state of the pipeline's first units, read during the last
  // backward (outside the optimizer step's time). With it the whole step runs beside backward.
  double state_read_under_backward = 0;
  std::string bound;  // what sets the step: "compute", "compute + the optimizer's NVMe I/O", ...
  bool fits = true;
  std::vector<std::string> problems;     // why it does not fit, with the numbers
  std::vector<std::string> suggestions;  // what would make it fit
  nlohmann::json ToJson() const;
};

struct PlanInputs {
  Model dims;
  uint32_t world = 1;  // ranks on this machine (zinf launch --nproc), partitioned by the stage
  int batch = 1, seq = 1;
  uint32_t micro_batches = 1;
  uint64_t pinned_budget = 0, device_budget = 0;
  // The device bytes beside the 16-bit weights: the executor's buffers (DeviceBufferBytes) and
  // the backend's. 0: unknown (no fetch beyond the first forward's is counted).
  uint64_t device_reserved = 0;
  uint32_t state_generations = 1;
  uint64_t swap_free_bytes = 0;  // 0: unknown (not checked)
  uint64_t align = 4096;         // the swap file's O_DIRECT alignment
};

Plan PlanRun(const Config& c, const PlanInputs& in, const StatePlacement& placement,
             const PlanRates& rates);

// The bytes rank 0 sends a step across `world` ranks at `stage` (p2p_communicator.h's
// algorithms, chunks padded as ckpt::ChunkOfUnit): stage 0 all-reduces every unit's fp32
// gradient; stage 1 reduce-scatters it once a step and all-gathers the new 16-bit weights;
// stage 2 reduce-scatters each micro-batch's 16-bit gradient and all-gathers the weights;
// stage 3 reduce-scatters as stage 2 and all-gathers every unit's 16-bit weights before each
// micro-batch's forward and the blocks' before its backward. Not counted: the step's few small
// collectives (the losses, the finiteness agreement).
double CommSentPerStep(const Model& d, int stage, uint32_t world, uint32_t micro_batches);

// The plan as text: bytes per tier and role, NVMe bytes per step, the time with its bound, and
// what does not fit.
std::string FormatPlan(const Plan& p, const Model& d);

}  // namespace zinf::train
