// offload/optimizer_pipeline.h — the optimizer step over state homed on NVMe, pipelined.
//
// Contract: Step() runs Adam/AdamW over units whose fp32 master weights, exp_avg and exp_avg_sq
// live in a SwapSpace, with `depth` pinned slabs in rotation: while the CPU Adam updates unit
// i in its slab, the reads of units i+1 .. i+depth-1 are in flight and the write-back of the
// units before is draining. The moment the last write of a slab completes, the reads of the
// unit that slab serves next are submitted (from the engine's reaper thread), so the disk never
// waits for the CPU. Each unit's new 16-bit parameters (bf16 or fp16, written by the same Adam
// pass) go to their own extent. Every read and write is checked; on any I/O error Step waits for
// what is in flight and returns the first error — units written before it hold new state,
// units after it old state (the caller restores from a checkpoint; a later generation scheme
// makes this atomic).
//
// Gradients come from host memory: a plain pointer, or a gradient shard (grad_type) of a
// TierManager (what GradAccumulator fills; it may have spilled to NVMe), acquired in the host
// tier one unit ahead of its update and released after it. Non-finite gradients must be detected before Step
// (AccumulateGrad reports them for free); Step does not skip.
//
// Thread-safety: one Step at a time per pipeline. The pipeline starts the engine's reaper.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <array>
#include <optional>
#include <span>
#include <vector>

#include "kernels/cpu/adam.h"
#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "offload/tier_manager.h"
#include "src/base/trace.h"
#include "zinf/status.h"

namespace zinf::offload {

// The optimizer state of one unit, by role: fp32 master weights, and the two Adam moments in
// the moment type (fp32, or bf16: zinf.optimizer_state_dtype, kernels/cpu/adam.h).
enum StateRole : int { kMasterState = 0, kExpAvgState = 1, kExpAvgSqState = 2 };
inline constexpr int kStateRoles = 3;
// Each role's name in manifests, exports and messages (nanoGPT's / PyTorch Adam's names).
inline constexpr const char* kStateRoleNames[kStateRoles] = {"master", "exp_avg", "exp_avg_sq"};
using StateHashes = std::array<uint64_t, kStateRoles>;  // xxHash64 of each role's bytes

// A role's element type: fp32 for the master weights, `moments` for exp_avg and exp_avg_sq.
inline kernels::DType StateRoleType(int role, kernels::DType moments) {
  return role == kMasterState ? kernels::DType::kF32 : moments;
}
// The bytes of n elements of a role.
inline uint64_t StateRoleBytes(int role, uint64_t n, kernels::DType moments) {
  return n * kernels::DTypeSize(StateRoleType(role, moments));
}

struct OptimizerUnit {
  uint64_t n = 0;                        // elements
  // In the swap space, read: master 4n bytes (fp32); exp_avg and exp_avg_sq n elements of the
  // pipeline's moment type each (StateRoleBytes).
  Extent master, exp_avg, exp_avg_sq;
  // Where the new state is written; bytes == 0: where it was read (in place). A checkpoint's
  // extents stay untouched while the next step writes the other generation.
  Extent master_out, exp_avg_out, exp_avg_sq_out;
  Extent param16;                        // 2n bytes; bytes == 0: no 16-bit copy written home
  // The state in host memory instead (zinf.budgets.host_bytes: a unit whose home is memory):
  // master (fp32), exp_avg and exp_avg_sq (the moment type), all three or none. Adam updates
  // them in place; nothing of them is read or written, so the unit costs the disk only its
  // param16 write, and its slab holds only the 16-bit copy. The state extents above (and
  // their outputs) must then be empty. StepHashing neither checks nor computes their hashes.
  std::array<void*, kStateRoles> in_memory{};
  // Without a param16 extent: compute the 16-bit copy all the same, for on_unit_updated only
  // (ZeRO-1 gathers a unit's chunks before anything is written home; a unit whose 16-bit
  // weights are derived from its master in memory has them installed in the host tier). A
  // Step without on_unit_updated computes none (Adam writes 2 bytes a parameter less).
  bool param16_to_caller = false;
  const void* grad = nullptr;            // (n) host memory, grad_type; or:
  std::optional<ShardId> grad_shard;     // gradient shard (grad_shard_n grad_type values, of
                                         // which the first n are read) of the pipeline's
                                         // TierManager
  uint64_t grad_shard_n = 0;             // 0: n; more: a ZeRO chunk padded to equal chunks
  kernels::DType grad_type = kernels::DType::kF32;
  // bf16 moments rounded stochastically: the unit's stream (kernels::StateRoundingSeed's
  // tensor), stable across steps and runs, and the index of this state's first element in the
  // unit (a ZeRO chunk draws what the whole unit's step draws there).
  uint64_t rounding_stream = 0;
  uint64_t rounding_index_base = 0;
};

struct OptimizerPipelineOptions {
  // Pinned slabs in rotation: 1 = serial (read, update, write, next), 3 = one unit read ahead
  // and one written behind (the config's zinf.pipeline_depth + 1).
  unsigned depth = 3;
  kernels::AdamOptions adam;
  kernels::DType param16_type = kernels::DType::kBf16;
  kernels::DType moment_type = kernels::DType::kF32;  // of exp_avg and exp_avg_sq: fp32 or bf16
  // bf16 moments: rounded stochastically (kernels/cpu/adam.h) from the run's seed, else to
  // nearest even.
  bool stochastic_moments = false;
  uint64_t rounding_seed = 0;
  Tracer* tracer = nullptr;  // spans on tracks "nvme read", "nvme write", "adam" when set
  TierManager* grads = nullptr;  // REQUIRED when units name a grad_shard
  // Acquire gradient shards outside the tier manager's step order (AcquireMode::kReadUntraced):
  // for a Step that runs on its own thread beside the next forward.
  bool untraced_grads = false;
};

// Integrity of one Step's state, unit by unit (indexes of the units span).
struct StepHashing {
  // Each unit's state as read must have these hashes (DataLoss naming the unit, the role, the
  // extent and both hashes otherwise, before anything of that unit is written). Empty: no check.
  std::vector<StateHashes> expected;
  // Fill `written` with the hashes of each unit's new state (computed before its writes; left
  // zero for a unit whose state is in memory).
  bool compute = false;
  std::vector<StateHashes> written;
};

struct OptimizerStepStats {
  unsigned units = 0;
  double seconds = 0;
  double adam_seconds = 0;       // CPU busy in Adam
  double read_wait_seconds = 0;  // CPU idle waiting for a unit's reads (the stall)
  double hash_seconds = 0;       // checking and computing StepHashing's xxHash64
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

class OptimizerPipeline {
 public:
  // Takes `depth` slabs sized for max_unit_elems from the pool; refuses with the numbers when
  // they do not fit in the pool's budget.
  static Result<std::unique_ptr<OptimizerPipeline>> Create(SwapSpace& swap, PinnedPool& pool,
                                                           uint64_t max_unit_elems,
                                                           const OptimizerPipelineOptions& o);
  ~OptimizerPipeline();

  // on_unit_written (optional) is called once per unit, from the I/O engine's completion
  // thread, when all of that unit's writes (state and param16) have completed successfully; it
  // must not block. on_unit_updated (optional) is called on the calling thread once per unit
  // with a param16 extent (or param16_to_caller), right after its Adam and before its writes are submitted, with the
  // new 16-bit weights (valid only during the call; Param16Bytes of the unit's n). When Step
  // fails, a unit given to on_unit_updated without its on_unit_written is not known to be
  // written home (its writes failed or were never submitted): the caller must not trust its
  // home; after a failure Step takes no further gradient leases.
  // before_grad (optional) is called on the calling thread before unit i's gradient is
  // leased, after its reads were submitted: it may block until that gradient is final (a
  // step started during the backward that produces the gradients, its state read meanwhile)
  // and `hyper` may change until it returns for the first unit; an error from it stops the
  // step as an I/O error does (nothing more is leased; what is in flight is waited for). With
  // it, no gradient is leased ahead of its unit. It may say where the unit's new state goes
  // (`state_out`, by StateRole, preset to the unit's own *_out; checked as those are): where a
  // checkpoint still being committed decides it, the caller knows only then.
  using UpdatedFn = std::function<void(size_t unit, const void* param16)>;
  using GateFn = std::function<Status(size_t unit, std::array<Extent, kStateRoles>* state_out)>;
  Result<OptimizerStepStats> Step(std::span<const OptimizerUnit> units,
                                  const kernels::AdamHyper& hyper,
                                  const std::function<void(size_t)>* on_unit_written = nullptr,
                                  const UpdatedFn* on_unit_updated = nullptr,
                                  StepHashing* hashing = nullptr,
                                  const GateFn* before_grad = nullptr);

  uint64_t slab_bytes() const { return slab_bytes_; }
  // The bytes of one slab for units of up to max_unit_elems, their parts padded to `align` (the
  // swap file's O_DIRECT alignment): for start-up checks before the pipeline exists.
  static uint64_t SlabBytes(uint64_t max_unit_elems, uint64_t align,
                            kernels::DType moment_type = kernels::DType::kF32);
  unsigned depth() const { return options_.depth; }
  // The slabs, for callers that measure bounds with the same memory (bench-swap).
  const std::vector<PinnedBlock>& slabs() const { return slabs_; }

  // Byte layout of one unit inside a slab (each part padded to the O_DIRECT alignment).
  struct Layout {
    uint64_t master = 0, exp_avg = 0, exp_avg_sq = 0, param16 = 0;  // offsets
    uint64_t state_bytes = 0;    // padded bytes of the fp32 master weights
    uint64_t moment_bytes = 0;   // padded bytes of each moment (moment_type)
    uint64_t param16_bytes = 0;  // padded bytes of the 16-bit copy
    uint64_t total = 0;
  };
  Layout LayoutFor(uint64_t n) const;

 private:
  OptimizerPipeline(SwapSpace& swap, PinnedPool& pool, const OptimizerPipelineOptions& o)
      : swap_(swap), pool_(pool), options_(o) {}
  // Step's argument checks: each unit's sizes, extents and gradient, the hashes' count.
  Status CheckUnits(std::span<const OptimizerUnit> units, const StepHashing* hashing) const;
  // The state of unit `i` as read into `slab` against the hashes written with it.
  Status CheckReadHashes(size_t i, const OptimizerUnit& u, const uint8_t* slab,
                         const std::array<uint64_t, kStateRoles>& expected) const;
  // The Adam step's buffers for unit `u`: its state in memory, or in `slab`.
  kernels::AdamBuffers BuffersFor(const OptimizerUnit& u, uint8_t* slab, const void* grad,
                                  const kernels::AdamHyper& hyper, bool want16) const;
  // Unit i's Adam step (its gradients already known finite), traced per worker with a tracer.
  Result<kernels::AdamStepInfo> RunAdam(size_t i, const kernels::AdamHyper& hyper,
                                        const kernels::AdamBuffers& b, Tracer* tracer) const;
  // The gate's output extents for unit `i`, checked as the unit's own *_out are.
  Status CheckGateOutputs(size_t i, const OptimizerUnit& u,
                          const std::array<Extent, kStateRoles>& outs) const;
  // One Step's reads and writes of the slabs, and what their completions share
  // (optimizer_pipeline.cc).
  struct StepIo;
  SwapSpace& swap_;
  PinnedPool& pool_;
  OptimizerPipelineOptions options_;
  uint64_t slab_bytes_ = 0;
  uint64_t max_elems_ = 0;
  std::vector<PinnedBlock> slabs_;
};

}  // namespace zinf::offload
