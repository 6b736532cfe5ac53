// src/train/executor.h — the layer executor: one GPT-2 training step over paged weights.
//
// Contract. The executor owns the model's shards in the runtime's tier manager and its device
// buffers, and runs:
// - ForwardBackward (one micro-batch): forward over the units, each unit's param16 acquired in
//   the device tier through the tier manager (prefetched ahead once the first step recorded the
//   order), widened to fp32 into a device buffer, and released; the block inputs are kept
//   (per-block activation checkpointing). Backward in reverse: each block's forward is recomputed
//   from its checkpointed input, then its backward; each unit's gradients go to the offload core
//   (GradAccumulator: host tier, spilled to NVMe when the pinned budget is short) as soon as they
//   exist, multiplied by accumulate_scale. They cross to the host in the working precision (bf16
//   or fp16, rounded to nearest even), as DeepSpeed's are: half the link traffic, and an fp16
//   gradient that overflows arrives as inf, which the accumulation reports (dynamic loss
//   scaling). The head is tied to the embedding: the widened
//   embedding kept from the forward serves the head, and the embedding's gradient collects both
//   uses on the device before it is handed over once.
// - OptimizerStep: Adam/AdamW over every unit. With the optimizer state on NVMe, the pipelined
//   OptimizerPipeline (read-ahead, write-behind) writes each unit's new param16 to its NVMe home
//   and the tier manager's copies are invalidated; with it in host memory, the same AdamStep runs
//   on host arrays and the new param16 is written home through the tier manager. Adam is
//   elementwise, so both give bit-identical results, and so does the whole step whatever the
//   budgets: offload changes where bytes live, never the arithmetic.
// Homes: param16 on NVMe when params_on_nvme or optimizer_on_nvme (the optimizer pipeline writes
// them there), else in host memory; each unit's optimizer state on NVMe or in host memory
// (ExecutorOptions::state_in_memory); gradients (16-bit with one micro-batch a step, else fp32
// sums: ExecutorOptions::micro_batches) on NVMe whenever the runtime has a swap space.
// Device memory (activations, widened weights, one unit's gradients) is a block of the runtime's
// device arena taken at Create; the rest of the arena and of the pinned pool is then sealed into
// the tier manager's slots for the shards (each size's copy in use and one in transfer at the
// least: SealPlan), so nothing is allocated or freed on the device after Create and a step can
// never run out of memory mid-run. Too small a budget is refused at Create with the numbers.
// No host synchronization per unit: a unit's weights are waited for on the compute stream (an
// event of the h2d copy; the CPU backend, computing on this thread, waits on the host), the copy
// is released with the event after its last use, and gradients go to the host through the
// accumulator's own stream and worker thread; the host waits once per micro-batch (the loss
// read-back, the hand-overs' totals).
//
// Thread-safety: one thread drives an executor (it owns the Backend's stream).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/adam.h"
#include "offload/grad_accumulator.h"
#include "offload/optimizer_pipeline.h"
#include "src/comm/communicator.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/backend.h"
#include "src/train/model.h"

namespace zinf::train {

struct ExecutorOptions {
  int batch = 1;  // sequences per micro-batch (B)
  int seq = 0;    // tokens per sequence; 0 = the model's seq
  kernels::DType param16_type = kernels::DType::kBf16;  // kBf16 or kF16
  // The Adam moments' type (zinf.optimizer_state_dtype): kF32, or kBf16 (8 instead of 12 bytes a
  // parameter of optimizer state, in memory and on NVMe; rounded to nearest even at every
  // step, see kernels/cpu/adam.h). The master weights stay fp32.
  kernels::DType moment_type = kernels::DType::kF32;
  // bf16 moments rounded stochastically (zinf.optimizer_state_rounding "stochastic"), each
  // unit's stream seeded from rounding_seed (zinf.seed), the step and the unit (and this rank's
  // chunk of it): deterministic, so placements agree and a resume matches.
  bool stochastic_moments = false;
  uint64_t rounding_seed = 0;
  bool params_on_nvme = false;
  bool optimizer_on_nvme = false;
  // With optimizer_on_nvme: per unit, whether its optimizer state's home is plain host memory
  // instead (zinf.budgets.host_bytes; the planner's placement). Such a unit rides the same
  // pipeline (OptimizerUnit::in_memory): Adam updates its arrays in place, so it costs the disk
  // only its 16-bit weights; everything else (the step's order, the 16-bit weights' NVMe home,
  // checkpoints: its state goes to state.bin, the others' stay in the swap file) is as for the
  // NVMe units, and training is bit for bit the same whatever the placement. Shorter than the
  // units: the rest on NVMe.
  std::vector<char> state_in_memory;
  unsigned pipeline_slabs = 3;  // OptimizerPipeline depth (zinf.pipeline_depth + 1)
  // Micro-batches per step (gradient_accumulation_steps). With 1 the gradient shards keep the
  // 16-bit gradients as they come (nothing is summed, so an fp32 copy would hold the same
  // values): half the host memory and NVMe traffic of fp32 shards, the same results bit for bit.
  // ForwardBackward then takes first == last == true only.
  uint32_t micro_batches = 1;
  // The NVMe optimizer step runs under the next step's forward (see OptimizerStep).
  bool async_optimizer = true;
  // zinf.overlap_adam: ForwardBackward(..., overlap) updates each unit as soon as its gradients
  // are final, while the device computes the next unit's backward.
  kernels::AdamOptions adam;
  Tracer* tracer = nullptr;
  // Generations of the NVMe-homed optimizer state (checkpoints): 1, or the checkpoints kept
  // + 1. A step writes in place unless a checkpoint names the current generation; then it
  // writes a generation no checkpoint names, so the extents of every committed checkpoint are
  // never overwritten until it is released (ReleaseCheckpoint). Each generation past the first
  // costs 12 bytes a parameter of swap space (master, exp_avg and exp_avg_sq; 8 with bf16
  // moments).
  uint32_t state_generations = 1;
  // Check the xxHash64 of the NVMe-homed optimizer state every time it is read back against what
  // was written (zinf.verify_state_reads): a corrupt byte stops training with DataLoss. Costs
  // hashing the 12 bytes a parameter twice a step.
  bool verify_state_reads = false;
  // Several ranks with replicated state (ZeRO stage 0, FSDP NO_SHARD): each rank runs its own
  // micro-batches, and every unit's accumulated gradient is all-reduced over the ranks before
  // its optimizer step (zinf's rank-ordered sum: the same bits on every rank), after the last
  // micro-batch's backward (with overlap_adam: just before the unit's update in that backward).
  // The gradient shards are then fp32 whatever micro_batches is (the sum is exact in fp32 of
  // the 16-bit values), and grad_sum_squares() and the finiteness are those of the sum. Null or
  // a world of one: one rank. The communicator must outlive the executor.
  comm::Communicator* comm = nullptr;
  // Sizing without a communicator (zinf plan across ranks): the world PinnedBytesWanted sizes
  // for when comm is null. 0 or 1: one rank.
  uint32_t sizing_world = 0;
  // HYBRID_SHARD across nodes (FSDP's): comm is this node's ranks, and replica_comm the ranks
  // holding the same chunks on the other nodes. Each gradient reduced over comm (a rank's chunk
  // after the reduce-scatter; stage 0 the whole unit) is all-reduced in fp32 over replica_comm
  // before it is used, so every node keeps the same state; its bytes count in
  // grad_comm_sent_bytes. Null: no replicas. Must outlive the executor.
  comm::Communicator* replica_comm = nullptr;
  // ZeRO-1 (with comm across ranks): the optimizer state is partitioned — each rank keeps the
  // fp32 master weights and moments of its own near-equal chunk of every unit (12 bytes a
  // parameter / world), on NVMe or in memory. After the last micro-batch each unit's gradient
  // is reduce-scattered (the rank-ordered sum of the rank's chunk lands in it), the rank's Adam
  // updates its chunk, and the new 16-bit weights are all-gathered and written home on every
  // rank: (world-1)/world of the fp32 gradients and of the 16-bit weights on the wire. Steps
  // run unit by unit on the training thread (not async_optimizer); with overlap_adam each
  // unit's chunk steps during the last backward once its gradient is final, after the ranks
  // agree it is finite (a flag all-reduced a unit). Σ g² is
  // the rank-ordered sum of the ranks' partial sums. GetUnitWeights becomes a collective (every
  // rank calls it for the same unit).
  bool partition_optimizer = false;
  // ZeRO-2 (with partition_optimizer): the gradients are partitioned too. Each rank's gradient
  // shards hold its chunk only (4 bytes a parameter / world): every micro-batch's 16-bit
  // gradient of a unit is reduce-scattered over the ranks as it is handed over (on the
  // accumulator's thread; bf16 or fp16 on the wire, summed in fp32 in rank order) and the rank
  // accumulates its chunk of the sum.
  bool partition_grads = false;
  // ZeRO-3 (with partition_grads): the 16-bit weights are partitioned too. Each rank's param16
  // shard of a unit holds its chunk (2 bytes a parameter / world, padded to equal chunks), paged
  // through its tiers as any shard; before a unit's forward and again before its backward the
  // chunks are all-gathered (in the pinned pool) and copied to one device buffer of the largest
  // unit, widened, and dropped: nothing of a unit stays on the device past its use (FSDP's
  // reshard_after_forward). The optimizer writes each rank's new chunk home, no gather: with
  // the state on NVMe and async_optimizer its step runs under the next forward, as one rank's
  // (OptimizerStep), and the gather of each unit waits for the unit's new shard.
  bool partition_params = false;
};

// One unit's optimizer state as a checkpoint records it: on NVMe (extents of the run's swap
// file, the current generation) or in memory (arrays), with the xxHash64 of each role's bytes
// (offload::StateRoleBytes of n and moment_type).
struct UnitState {
  uint32_t unit = 0;
  uint64_t n = 0;
  kernels::DType moment_type = kernels::DType::kF32;  // of exp_avg and exp_avg_sq
  std::array<offload::Extent, offload::kStateRoles> extents{};  // bytes 0: in memory
  std::array<const void*, offload::kStateRoles> arrays{};        // null: on NVMe
  offload::StateHashes hashes{};
  // Where each array was read from ("<file> at offset <n>"), for the error naming a bad one.
  std::array<std::string, offload::kStateRoles> sources{};
};

struct MicroBatchResult {
  double loss = 0;     // mean cross-entropy of the micro-batch (unscaled)
  bool finite = true;  // every accumulated gradient finite
  offload::OptimizerStepStats optimizer;  // the overlapped optimizer step, when one ran
};

struct ExecutorStats {
  double compute_seconds = 0;     // forward + backward, stalls excluded
  double stall_seconds = 0;       // waiting for param16 to arrive on the device
  double grad_seconds = 0;        // handing gradients to the offload core
  double optimizer_seconds = 0;   // OptimizerStep wall time
  double adam_seconds = 0;        // of which CPU Adam busy
  uint64_t device_buffer_bytes = 0;  // activations, widened weights, gradients (fixed)
  // Everything the device budget holds beside the 16-bit weights' slots: those buffers, the
  // backend's (its cuBLAS workspace, its per-row loss gradient).
  uint64_t device_reserved_bytes = 0;
  uint64_t optimizer_bytes_read = 0;     // the optimizer pipeline's NVMe traffic, all steps
  uint64_t optimizer_bytes_written = 0;
  double optimizer_wait_seconds = 0;     // forward waiting for the optimizer's new weights
  uint64_t grad_d2h_bytes = 0;           // gradients copied to the host, all steps
  uint64_t gathered_h2d_bytes = 0;       // ZeRO-3: gathered 16-bit weights copied to the device
  double comm_seconds = 0;               // the gradients' and weights' collectives across ranks
  uint64_t grad_comm_sent_bytes = 0;     // the bytes this rank sent for the gradients'
};

// The three bounds of a step, each measured alone (--profile).
struct ProfileBounds {
  double compute_seconds = 0;  // forward + backward (with recompute) of a step, weights
                               // resident: the median of 3 timings
  double read_gbps = 0;        // the raw engine reading the optimizer state's extents (0: no NVMe)
  double write_gbps = 0;       // ... and writing them back
  double adam_seconds = 0;     // CPU Adam over every unit's state in memory
  // Across ranks: the step's collectives on scratch buffers of the units' sizes (stage 0: the
  // fp32 gradients' all-reduce; 1: their reduce-scatter and the weights' all-gather; 2: each
  // micro-batch's 16-bit reduce-scatter and the all-gather; 3: each micro-batch's gathers,
  // forward and backward, and reduce-scatter). The median of 3 timings.
  double comm_seconds = 0;
};

// The pinned bytes a run of this shape wants: the optimizer pipeline's slabs, the gradient
// staging, and a host copy of every shard (16-bit weights and gradients), each padded to `align`
// (the swap file's O_DIRECT alignment) and to pages, so that nothing is evicted from the host
// tier. The automatic pinned budget is this, capped by what the machine allows.
uint64_t PinnedBytesWanted(const Model& model, const ExecutorOptions& options,
                           uint64_t align = 4096);

// The device bytes the executor's own buffers take for a micro-batch of B x T tokens (tokens,
// activations, scratch, one unit's fp32 weights and gradients, the hand-over's 16-bit gradient
// and, ZeRO-3 across ranks, `gathered_elems` 16-bit weights of a gathered unit), each block
// rounded to 256 bytes. `layer_scratch` is Model::LayerScratchElems for the backend. What the
// device budget has beyond these (and the backend's own) holds the tier manager's 16-bit weights.
uint64_t DeviceBufferBytes(const Model& model, int B, int T, uint64_t layer_scratch,
                           uint64_t gathered_elems = 0);

class LayerExecutor {
 public:
  // `compute` is the stream the backend runs on (its native handle on CUDA).
  static Result<std::unique_ptr<LayerExecutor>> Create(OffloadRuntime& rt, Backend<float>& be,
                                                       Stream* compute, const Model& model,
                                                       const ExecutorOptions& options);
  ~LayerExecutor();

  const Model& model() const { return model_; }
  int batch() const { return batch_; }
  int seq() const { return seq_; }

  // Weights: GPT-2 init from a seed, or a unit's fp32 values; moments set to zero.
  Status InitWeights(uint64_t seed);
  Status SetUnitWeights(uint32_t unit, const float* master);
  // The fp32 master weights of a unit (UnitParams elements).
  Status GetUnitWeights(uint32_t unit, float* master);

  // tokens, targets: batch*seq values each, in [0, V). With `overlap` (only with last = true):
  // each unit's optimizer step runs with these hyper-parameters as soon as the unit's gradients
  // are final, overlapping the next unit's backward on the device; OptimizerStep is then not
  // called for this step. A non-finite gradient then fails the call (Aborted): units updated
  // before it cannot be undone.
  // With the state on NVMe (and async_optimizer, not ZeRO-1..3) the last micro-batch starts the
  // step's optimizer pipeline before its backward, gated: the first units' state is read while
  // backward computes. With `overlap` it takes the units in backward order and each unit's Adam
  // runs (on the pipeline's thread) once that unit's gradient is final; without, in unit order,
  // once OptimizerStep gives the hyper-parameters. If OptimizerStep is not called (a skipped
  // step: DiscardGradients; or Evaluate, FinishOptimizerStep) the step is stopped before any
  // Adam and undone: nothing was written. The backward uses each unit's old weights meanwhile.
  Result<MicroBatchResult> ForwardBackward(const int32_t* tokens, const int32_t* targets,
                                           float loss_scale, float accumulate_scale, bool first,
                                           bool last, const kernels::AdamHyper* overlap = nullptr);
  Result<double> Evaluate(const int32_t* tokens, const int32_t* targets);
  // Σ g² of the step's gradients (as the shards hold them), measured during the last
  // micro-batch (ForwardBackward with last = true).
  double grad_sum_squares() const { return grad_sum_squares_; }
  // hyper.grad_scale should fold in the loss-scale unscaling and the clipping coefficient.
  // With the optimizer state on NVMe (and ExecutorOptions::async_optimizer; across ranks only
  // with ZeRO-3, whose step has no collective) the step only STARTS here: the pipeline runs on
  // its own thread under the next forward, each unit's new param16 taken by that forward the
  // moment it is installed or its writes completed (FetchWeights, ZeRO-3's IssueGather wait);
  // the returned stats are then empty and the step's are added to stats() when it finishes
  // (at the next backward, or FinishOptimizerStep). Errors surface there.
  Result<offload::OptimizerStepStats> OptimizerStep(const kernels::AdamHyper& hyper);
  // Waits for an optimizer step still running; its error. A no-op when none runs.
  Status FinishOptimizerStep();

  // Checkpoints. The optimizer step of this step (OptimizerStep, or the units stepped during
  // an overlapped backward) computes the xxHash64 of the state it writes, for a checkpoint of
  // its result (without it the state is read back to be hashed). EndStep clears the request.
  void HashNextOptimizerStep() { hash_next_step_ = true; }
  // The state after every optimizer step so far, for a checkpoint: `ready` is called on this
  // thread once no step is running — at once when none is, else when the running asynchronous
  // step finishes (FinishOptimizerStep, called by the next backward or directly) — with every
  // unit's state or the error that ended the step. From then on the NVMe extents given stay
  // untouched (later steps write the other generation) until the next checkpoint; arrays stay
  // valid until the next optimizer step, which first waits for HoldStateUntil's future. The NVMe
  // state is durable only after SyncState.
  // `id` (the checkpoint's step) names the checkpoint for ReleaseCheckpoint.
  using CheckpointReadyFn = std::function<void(Result<std::vector<UnitState>>)>;
  Status RequestCheckpoint(uint64_t id, CheckpointReadyFn ready);
  // The checkpoint `id` (given to RequestCheckpoint, RestoreUnit or ProtectCheckpoint) is gone:
  // the extents it named may be rewritten. Thread-safe (a checkpoint's writer calls it after
  // pruning, before its commit's future is ready). Unknown ids are ignored.
  void ReleaseCheckpoint(uint64_t id);
  // The ids of the checkpoints whose extents are kept untouched. Thread-safe.
  std::vector<uint64_t> ProtectedCheckpoints() const;
  // After a resume: another committed checkpoint `id` names these extents of this run's swap
  // file (every unit's), which stay untouched until ReleaseCheckpoint(id). InvalidArgument
  // when a unit's extents are not one of its generations.
  Status ProtectCheckpoint(uint64_t id, const std::vector<UnitState>& units);
  // fdatasync of the swap files. Thread-safe (a checkpoint's writer calls it).
  Status SyncState() const;
  // The state in memory and the extents a checkpoint names must not be overwritten until
  // `written` is ready (its writer commits in the background): the next optimizer step waits
  // for it and fails with its error.
  void HoldStateUntil(std::shared_future<Status> written) { state_hold_ = std::move(written); }
  // Puts one unit of a checkpoint's state back. An NVMe unit names extents of this run's swap
  // file (its generation becomes current, and stays untouched until the next checkpoint), or
  // gives arrays (a checkpoint of another world size, re-partitioned: written into a
  // generation no checkpoint holds); a unit in memory gives arrays, copied. Every role is checked against its hash (DataLoss naming
  // the unit, the role and where it was read), and the 16-bit weights are recomputed from the
  // master weights (the optimizer's 16-bit copy is bit for bit their rounding).
  // `id`: the checkpoint's step, which protects the unit's extents (as RequestCheckpoint).
  Status RestoreUnit(const UnitState& state, uint64_t id);
  // The swap files of the run (absolute paths), for a checkpoint's manifest.
  std::vector<std::string> SwapFilePaths() const;
  // The stripe unit of a swap space striped over several files (0: one file or none).
  uint64_t SwapStripeBytes() const;
  // The accumulated gradients are dead (consumed by OptimizerStep, which calls this, or a skipped
  // step): their copies are dropped without being written home.
  Status DiscardGradients();
  // Ends a step for the tier manager (the first call ends the recording of the access trace)
  // and clears HashNextOptimizerStep.
  void EndStep();
  // Measures the bounds alone: compute over `micro_batches` micro-batches of these tokens with
  // the weights already on the device (the values of one block reused for all: timing only, the
  // model's state is not changed), raw engine reads and writes of the optimizer extents (data
  // read and written back unchanged), Adam over scratch copies.
  Result<ProfileBounds> MeasureBounds(const int32_t* tokens, const int32_t* targets,
                                      uint64_t micro_batches);

  ExecutorStats stats() const { return stats_; }
  // The parameters whose optimizer state this rank holds (all of them but with ZeRO-1/2).
  uint64_t StateParams() const;
  // The bytes of this rank's optimizer state in host memory (units in memory) and on NVMe
  // (one generation).
  uint64_t StateBytesInMemory() const;
  uint64_t StateBytesOnNvme() const;
  // The bytes of this rank's 16-bit weight shards (the whole units', or with ZeRO-3 its
  // chunks').
  uint64_t Param16ShardBytes() const;
  // Of those, the bytes derived from master weights in memory (Param16Derived).
  uint64_t Param16DerivedBytes() const;
  // The bytes of this rank's gradient shards (fp32 or 16-bit, the unit's or, with ZeRO-2, its
  // chunk's).
  uint64_t GradShardBytes() const;

 private:
  struct Buffers;
  LayerExecutor(OffloadRuntime& rt, Backend<float>& be, Stream* s, const Model& d,
                const ExecutorOptions& o);
  Status Setup();
  Status RegisterShards();
  // The device memory: checks that the budget holds the buffers, the backend's and the least
  // the 16-bit weights need, then takes the buffers from the arena.
  Status AllocateDevice();
  // The leases the executor holds at once, per tier and role (the tier manager's plan).
  offload::SealOptions SealPlan() const;
  // Whether the pinned budget holds what a step needs at once (refused with the numbers).
  Status CheckPinnedBudget() const;
  Status SealTiers();
  // Makes the backend's next work wait for `event` (a stream wait on CUDA, a host wait for the
  // CPU backend, whose ops run on this thread).
  Status ComputeWaits(const Event& event);
  // The event after the backend's work so far (empty for the CPU backend: done already).
  Result<Event> ComputeDone();
  // Acquires unit's param16 on the device, widens it into dst (fp32), releases it.
  // `next`: with ZeRO-3, the unit fetched after this one in the same pass (-1: none), whose
  // gather then starts at once.
  Status FetchWeights(uint32_t unit, float* dst, int next = -1);
  Status Upload(const int32_t* tokens, const int32_t* targets);
  // backward_follows: the pass goes on into backward (ZeRO-3 gathers its first unit ahead).
  Result<double> ForwardAll(bool backward_follows);
  // HYBRID_SHARD: a reduced gradient (n fp32 values) summed over replica_comm in place, the
  // bytes sent added to *sent; nothing without replicas. Either thread (one at a time).
  Status AllReduceOverReplicas(float* v, uint64_t n, uint64_t* sent);
  // Whether gradients are all-reduced over ranks (ExecutorOptions::comm, world > 1).
  bool ReducesGrads() const;
  // ZeRO-1 (ExecutorOptions::partition_optimizer across ranks).
  bool Partitioned() const { return partitioned_; }
  // This rank's chunk of a unit: elements [lo, lo + len); every rank's chunk spans `per`
  // elements of the padded vector (the last rank's may hold fewer real ones).
  struct Chunk {
    uint64_t lo = 0, len = 0, per = 0;
  };
  Chunk ChunkOf(uint32_t unit) const;
  // The optimizer state's elements of a unit on this rank (its chunk, or the whole unit).
  uint64_t StateElems(uint32_t unit) const;
  // The largest unit's state elements on this rank (its chunk across ranks): the optimizer
  // pipeline's slabs are sized for it.
  uint64_t MaxStateElems() const;
  // Whether the unit's optimizer state lives on NVMe (else in host memory: master_ and the
  // moments' arrays).
  bool StateOnNvme(uint32_t unit) const { return in_memory_[unit] == 0; }
  // Whether any unit's state lives in memory.
  bool AnyStateInMemory() const;
  // Whether the unit's 16-bit weights are derived from its master weights in memory (a derived
  // shard of the tier manager: never read from or written to NVMe). So are a unit's whose state
  // is in memory where its 16-bit weights would otherwise live on NVMe, unless ZeRO partitions
  // the state (a rank's master chunk does not cover the weights it uses).
  bool Param16Derived(uint32_t unit) const { return p16_derived_[unit] != 0; }
  // Before the master weights of a unit with derived 16-bit weights change: waits for a
  // derivation in flight, and none starts until Param16Changed (or, in the async steps, the
  // install of the new weights or HomeRewritten).
  void BeginMasterWrite(uint32_t unit);
  // The unit's 16-bit weights are now `p16` (the cast of its new master weights): written home,
  // or for derived ones every old copy dropped (the next load derives the new ones; p16 unused,
  // may be null).
  Status Param16Changed(uint32_t unit, const uint16_t* p16);
  // The bytes of a role of a unit's state on this rank (offload::StateRoleBytes).
  uint64_t StateBytes(uint32_t unit, int role) const;
  // The unit's stream of stochastic rounding (OptimizerUnit::rounding_stream).
  uint64_t RoundingStream(uint32_t unit) const;
  // ZeRO-1: this rank's new 16-bit weights of a unit (chunk.len values) all-gathered into the
  // whole unit and written home (every rank calls it for the same unit). ZeRO-3: the chunk
  // (padded with zeros) written home alone.
  Status GatherParam16(uint32_t unit, const void* chunk16);
  // ZeRO-3: FetchWeights' path: the chunks all-gathered, copied to the device, widened; then
  // the gather of `next` (the unit used after this one in the same pass, or -1) started, to
  // run under this unit's compute.
  Status FetchGathered(uint32_t unit, float* dst, int next);
  // --profile across ranks: the step's collectives alone (ProfileBounds::comm_seconds).
  Result<double> TimeCollectives(uint64_t micro_batches);
  // ZeRO-3: starts the all-gather of a unit's chunks into the free pinned buffer (once an
  // optimizer step running under this forward has written the unit's new shard).
  Status IssueGather(uint32_t unit);
  // ZeRO-3: waits for a started gather nobody will use (every rank started it) and drops it.
  Status DropGather();
  // ZeRO-1: one unit's optimizer step on this rank's chunk (NVMe or memory).
  Status StepChunk(uint32_t unit, const kernels::AdamHyper& hyper,
                   offload::OptimizerStepStats* st);
  // zinf.overlap_adam across partitioned ranks: StepChunk during backward, once the state is
  // free of a checkpoint's hold; the unit's gradient discarded after.
  Status StepChunkNow(uint32_t unit, const kernels::AdamHyper& hyper,
                      offload::OptimizerStepStats* st);
  // Whether every rank's value is true (a collective: every rank calls it at the same point).
  Result<bool> AllRanksFinite(bool mine);
  // All-reduces unit's accumulated gradient in place in its host copy (released dirty), adding
  // its Σ g² to *sum_squares; whether every value of the sum is finite.
  Result<bool> ReduceUnitGrad(uint32_t unit, double* sum_squares);
  // ReduceUnitGrad over every unit in backward order; grad_sum_squares_ becomes the sum's.
  Result<bool> ReduceAllGrads();
  // The gradient shards' element type (see ExecutorOptions::micro_batches) and their bytes.
  kernels::DType GradType() const;
  uint64_t GradBytes(uint64_t n) const;
  // Starts the unit's gradient hand-over (GradAccumulator::Submit): never waits on the device.
  Status HandOverGrad(uint32_t unit, const float* grad, float scale, bool first, bool last);
  // ForwardBackward's last part: every hand-over waited for, the micro-batch's finiteness and,
  // on the last, the step's Σ g² (across ranks, over them). reduced_sum_squares: with overlap
  // across ZeRO-1 ranks, what ReduceUnitGrad summed.
  Status FinishBackward(bool last, const kernels::AdamHyper* overlap,
                        double reduced_sum_squares, MicroBatchResult* r);
  // The last micro-batch's backward starts the optimizer pipeline gated, when it is
  // asynchronous and not partitioned; whether it did.
  Result<bool> StartGatedStep(bool last, const kernels::AdamHyper* overlap);
  // RestoreUnit's parts: a checkpoint's state that names this run's own swap extents (checked
  // where they are; the unit's new 16-bit weights cast into the bounce slab), and the message
  // for a role whose hash differs.
  Result<uint16_t*> RestoreFromExtents(const UnitState& s, uint64_t id);
  Status StateMismatch(uint32_t u, int role, uint64_t got, uint64_t recorded,
                       const std::string& where) const;
  // One unit's optimizer step (its gradients final), new param16 home, gradients discarded.
  Status StepUnit(uint32_t unit, const kernels::AdamHyper& hyper, offload::OptimizerStepStats* st);
  // StepUnit's body for a unit whose state is in memory (no pipeline): Adam over its gradient
  // (acquired in `grad_mode`), the new param16 written home (in place when homed in host
  // memory). Leases the gradient and releases it clean (never discards it) and leaves stats_
  // alone: callable from the async step's thread.
  Status StepUnitInMemory(uint32_t unit, const kernels::AdamHyper& hyper,
                          offload::AcquireMode grad_mode, offload::OptimizerStepStats* st);
  // Whole-extent transfers of optimizer state through the pipeline's first slab (idle between
  // steps): no memory outside the pinned budget.
  Status WriteNvme(const offload::Extent& e, const void* src, uint64_t bytes);
  Status ReadNvme(const offload::Extent& e, void* dst, uint64_t bytes);
  uint8_t* BounceBuffer() const;

  OffloadRuntime& rt_;
  Backend<float>& be_;
  Stream* compute_;
  Model model_;
  ExecutorOptions options_;
  int batch_ = 1, seq_ = 1;

  std::vector<offload::ShardId> p16_, grad_;
  // Optimizer state: NVMe extents (pipeline) or host arrays.
  std::vector<offload::OptimizerUnit> opt_units_;
  // NVMe-homed state by generation: [gen][unit] master, exp_avg, exp_avg_sq
  // (ExecutorOptions::state_generations of them).
  std::vector<std::vector<std::array<offload::Extent, offload::kStateRoles>>> state_ext_;
  std::vector<uint8_t> cur_gen_;   // per unit: the generation holding its state
  std::vector<uint8_t> next_gen_;  // per unit: the generation the step under way writes
  // Per checkpoint id: the generation each unit's state lies in (-1: none). Written on the
  // training thread, erased by ReleaseCheckpoint from a checkpoint's writer.
  mutable std::mutex protect_mu_;
  std::map<uint64_t, std::vector<int8_t>> protections_;  // GUARDED_BY(protect_mu_)
  bool Protected(uint32_t unit, int gen) const;
  // The generation a unit's next write goes to: the current one unless a checkpoint names it,
  // else the first after it that none names (FailedPrecondition when every one is named).
  Result<int> WriteGeneration(uint32_t unit) const;
  std::vector<offload::StateHashes> hashes_;  // per unit, of the state now
  std::vector<char> hashes_known_;
  bool hash_next_step_ = false;
  std::shared_future<Status> state_hold_;
  // The units as the pipeline sees them for a step of `units` (reading the current generation,
  // writing the target one), the hashing it does, and, once done, the bookkeeping.
  Result<std::vector<offload::OptimizerUnit>> StepUnits(std::span<const uint32_t> units,
                                                        bool resolve_writes = true);
  // Where a unit on NVMe writes this step's state (the generation no checkpoint names).
  Status ResolveWrites(uint32_t unit, offload::OptimizerUnit* ou);
  void PrepareHashing(std::span<const uint32_t> units, offload::StepHashing* h);
  void StepDone(std::span<const uint32_t> units, const offload::StepHashing& h);
  Status WaitStateHold();
  // The extent of a unit's state role in its current generation.
  const offload::Extent& StateExtent(uint32_t unit, int role) const;
  // Before state is rewritten outside a step: when a checkpoint names the current generation,
  // switch to one it does not (true: every role must then be written).
  Result<bool> TakeUnprotectedGeneration(uint32_t unit);
  // SetUnitWeights' bookkeeping: the hashes of the new state (master, zero moments).
  void NoteWeightsSet(uint32_t unit, const float* master);
  // Reads a whole role of a unit's current NVMe state (padded) into dst.
  Status ReadStateRole(uint32_t unit, int role, uint8_t* dst);
  // Every unit's state now (no step running); NVMe extents become protected.
  Result<std::vector<UnitState>> TakeCheckpointState(uint64_t id);
  CheckpointReadyFn pending_checkpoint_;  // asked for while an asynchronous step ran
  uint64_t pending_checkpoint_id_ = 0;
  std::vector<uint32_t> all_units_;
  std::vector<offload::OptimizerUnit> opt_step_units_;  // the running async step's
  offload::StepHashing opt_hashing_;                    // the running async step's
  std::vector<char> in_memory_;  // per unit: its optimizer state lives in host memory
  std::vector<char> p16_derived_;  // per unit: Param16Derived
  // Per unit, the state in memory (empty for a unit on NVMe).
  std::vector<std::vector<float>> master_;
  std::vector<std::vector<uint8_t>> exp_avg_, exp_avg_sq_;  // options_.moment_type
  std::vector<uint16_t> p16_staging_;  // host path: the new param16 of one unit
  bool partitioned_ = false;
  bool partitioned_grads_ = false;  // ZeRO-2
  bool partitioned_params_ = false;  // ZeRO-3
  // ZeRO-3: the all-gathered 16-bit weights of a unit (world chunks of the largest): two
  // buffers in the pinned pool (the one being used, the next unit's being gathered) with the
  // event after the last copy out of each, and one on the device.
  offload::PinnedBlock gathered_host_[2];
  Event gathered_copied_[2];
  void* gathered_dev_ = nullptr;
  // The copies to gathered_dev_ run on their own stream (on a GPU beside the compute stream's
  // kernels), each after the widening of the unit copied before it (gathered_widened_).
  Stream* gather_copy_ = nullptr;
  Event gathered_widened_;
  // The gather started ahead: its unit, buffer, the lease on this rank's chunk (the send
  // buffer, held until the gather is done) and the collective.
  struct PendingGather {
    bool active = false;
    uint32_t unit = 0;
    int buffer = 0;
    offload::Lease lease;
    comm::Work work;
  };
  PendingGather pending_gather_;
  int next_gather_buffer_ = 0;
  offload::HandOver::ReduceFn reduce_fn_;  // ZeRO-2: runs on the accumulator's thread
  std::atomic<uint64_t> reduce_sent_bytes_{0};  // ... and counts there
  std::atomic<uint64_t> reduce_nanos_{0};
  uint64_t reduce_nanos_seen_ = 0;  // of reduce_nanos_, already in stats_.comm_seconds
  // ZeRO-1/2: the rank-ordered sum over ranks of every rank's partial Σ g².
  Result<double> SumOverRanks(double partial);
  std::vector<uint16_t> gather16_;  // ZeRO-1: world chunks of 16-bit weights (the largest unit)
  std::vector<double> partial_sum_squares_;  // ZeRO-1: every rank's Σ g² of its chunks
  std::unique_ptr<offload::OptimizerPipeline> pipeline_;
  std::unique_ptr<offload::GradAccumulator> accumulator_;

  // Device memory (one arena) and the pinned host staging for tokens and losses.
  void* arena_ = nullptr;
  void* host_io_ = nullptr;
  int32_t *d_tokens_ = nullptr, *d_targets_ = nullptr;
  float *xs_ = nullptr, *acts_ = nullptr, *head_ = nullptr, *dres_ = nullptr,
        *scratch_ = nullptr, *wbuf_ = nullptr, *wemb_ = nullptr, *gbuf_ = nullptr,
        *gemb_ = nullptr;
  // Hand-overs of gradients in flight at once (GradAccumulator depth).
  static constexpr unsigned kHandOverDepth = 2;
  // One unit's gradient in the working precision, for the hand-over; reused once the copy of
  // the previous one has read it (g16_free_: a block's backward later, long done).
  void* g16_ = nullptr;
  Event g16_free_;
  // The asynchronous optimizer step (NVMe pipeline on its own thread).
  void WaitUnitWritten(uint32_t unit);
  std::future<Result<offload::OptimizerStepStats>> opt_future_;
  bool opt_running_ = false;
  kernels::AdamHyper opt_hyper_;
  std::function<void(size_t)> opt_on_written_;
  offload::OptimizerPipeline::UpdatedFn opt_on_updated_;
  std::mutex opt_mu_;
  std::condition_variable opt_cv_;
  std::vector<char> unit_written_;  // GUARDED_BY(opt_mu_)
  // Starts the asynchronous step over `order` (units in the order the pipeline takes them).
  // Gated: started during the last micro-batch's backward, its state read meanwhile, each
  // unit's Adam waiting until OpenGate(unit) says its gradient is final (and opt_hyper_ set);
  // the unit's 16-bit weights are left to the prefetcher until then (backward still uses them).
  Status StartAsyncStep(std::vector<uint32_t> order, bool gated);
  // The asynchronous step with every unit's state in memory and its 16-bit weights homed in
  // host memory (no pipeline): StepUnitInMemory unit by unit on its own thread, in unit order,
  // under the next forward; each unit's weights are left to the prefetcher until written.
  Status StartAsyncMemoryStep();
  bool CanStepMemoryAsync() const;
  // The unit's gradient is final and opt_hyper_ holds the step's hyper-parameters: its Adam
  // may run (training thread).
  Status OpenGate(uint32_t unit);
  // A gated step whose gates are not all open is stopped (its Adam never runs for the units
  // still gated): true when it had opened none (nothing was written; the step is undone).
  bool AbortGatedStep();
  std::vector<uint32_t> opt_order_;   // the running async step's units, in its order
  bool opt_gated_ = false;            // the running async step waits at gates
  uint32_t gates_opened_ = 0;         // training thread
  std::vector<char> gate_open_;       // GUARDED_BY(opt_mu_), by unit
  bool gate_abort_ = false;           // GUARDED_BY(opt_mu_)
  // By unit: where its new state goes, chosen when its gate opened. GUARDED_BY(opt_mu_)
  std::vector<std::array<offload::Extent, offload::kStateRoles>> gate_outs_;
  offload::OptimizerPipeline::GateFn opt_gate_;
  double grad_sum_squares_ = 0;
  bool moments_zero_at_home_ = true;  // no optimizer step has written the NVMe moments yet
  ExecutorStats stats_;
};

}  // namespace zinf::train
