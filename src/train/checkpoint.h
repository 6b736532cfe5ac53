// src/train/checkpoint.h — `zinf train`'s checkpoints: writing them while training goes on
// (Checkpointer) and starting a run from one (the resume functions), in the format of
// src/ckpt/manifest.h.
//
// Contract.
// - A checkpoint after step s records the trainer's state (TrainerState: steps run, optimizer
//   steps applied and skipped, the clip coefficient zinf.overlap_adam carries, the loss
//   scaler, the training data's position and fingerprint), the run's effective config (which a
//   resume starts from), and every unit's optimizer state as F32 shards: "master", "exp_avg",
//   "exp_avg_sq". The 16-bit working weights are not stored: a resume recomputes them from the
//   master weights, which is what the optimizer writes (bit for bit).
// - Optimizer state on NVMe is not copied: the manifest names the extents of the run's swap file
//   that hold it (the executor's current generation, left untouched by later steps until a newer
//   checkpoint is committed), made durable by fdatasync. State in memory is written to
//   "state.bin" in the checkpoint directory (written whole or not at all: src/base/atomic_file).
// - Save() hands the commit to a writer thread and returns: data written and synced, the
//   manifest committed atomically, the root's directory synced, then committed checkpoints
//   beyond `keep` deleted (oldest first) with any uncommitted leftovers. Training goes on
//   meanwhile; the executor's next optimizer step waits for the commit
//   (LayerExecutor::HoldStateUntil), so nothing a committing or committed checkpoint names is
//   overwritten, and a failed commit stops training with its error. When a step is still
//   running its optimizer (asynchronous NVMe step), the commit starts when it ends.
//   Wait() waits for the commit in progress and returns its status (and the first error of
//   any earlier one).
// - Across ranks (world > 1; the root is shared by the ranks: one node, or a shared file
//   system), every rank's Checkpointer writes its part (`step-<s>/rank<r>/`, its state and a
//   manifest of its own: ckpt/manifest.h) and commits it; rank 0's writer then waits for every
//   part's manifest and commits the checkpoint's (which names the parts and their hashes), and
//   every writer waits for that before its commit counts: a checkpoint is whole or not there.
//   Only rank 0 prunes (whole step directories), and every rank then releases the extents of
//   the checkpoints no longer kept. The ranks coordinate through the files alone (no
//   collective on the writer threads); a part or a checkpoint manifest not there within
//   part_timeout_seconds fails the commit, naming the rank(s) missing.
// - Create() makes the root and refuses one that holds committed checkpoints unless the run
//   resumes from one of them and none is newer than it (a fresh run, or a resume of an older
//   one, would make them stale or overwrite them), and one whose file system lacks the room for
//   the checkpoints kept plus the one being written (ResourceExhausted with the numbers).
// - Resume: ReadForResume resolves and reads the checkpoint (the latest committed under a root,
//   or the one named); CheckResumable compares it with the run (the model, the precision and the
//   placement of the optimizer state must match; the swap files it names must be the run's own;
//   other differences are logged: the run then does not match an uninterrupted one bit for
//   bit); TrainerStateOf reads the trainer's state back; RestoreOptimizerState reads every
//   unit's shards, checks their hashes and puts them back into the executor. Across ranks each
//   rank resumes from its part (StatePartFor: the world size and the partition rule are the
//   run's). A checkpoint of another world size or partition rule is re-partitioned
//   (NeedsRepartition, StatePartsForRepartition, RestoreRepartitioned): each rank reads its share
//   of every unit from all the old parts, hash-checked; CheckResumable then leaves out the
//   placement, world and swap-file checks (the state goes into this run's own layout).
//
// Thread-safety: a Checkpointer is driven by one thread (the trainer's); its writer thread
// only reads what the executor handed over for the checkpoint.
#pragma once

#include <array>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/ckpt/manifest.h"
#include "src/config/config.h"
#include "src/train/executor.h"
#include "src/train/loss_scaler.h"
#include "src/train/token_file.h"
#include "zinf/status.h"

namespace zinf::train {

inline constexpr char kStateFileName[] = "state.bin";

struct TrainerState {
  uint64_t step = 0;     // steps run, applied and skipped (the next is step + 1)
  uint64_t applied = 0;  // optimizer steps applied (the schedule's and Adam's step count)
  uint64_t skipped = 0;
  double prev_clip = 1.0;  // zinf.overlap_adam clips with the previous step's coefficient
  LossScalerState scaler;
  uint64_t data_position = 0;  // the next training batch
  DataSource data;
};

// What the run read and how, outside the config: a resume given no data flags reads the same.
struct RecordedRun {
  uint64_t steps_total = 0;      // --steps (the schedule's length)
  std::string data, val_data;    // absolute paths; "" for the synthetic corpus / the data's tail
  std::string data_format = "auto";
  uint64_t synthetic_bytes = 0;
  double val_fraction = 0.1;
  uint64_t eval_every = 0;
  uint32_t eval_batches = 4;
};

struct CheckpointerOptions {
  std::string root;
  uint32_t keep = 1;
  Config config;             // the run's (Config::ToJson is recorded, without resume)
  RecordedRun run;
  // Bytes one checkpoint writes (state in memory: its state.bin; 0 when the state is on NVMe,
  // whose room the swap file reserves): Create refuses a root whose file system cannot hold
  // `keep` of them plus the one being written.
  uint64_t bytes_per_checkpoint = 0;
  bool state_on_nvme = false;  // any unit's optimizer state on NVMe
  // Where the optimizer state lives, as the manifest records it (training.optimizer_state):
  // "nvme", "memory", or "mixed" with the units in memory named (training.
  // optimizer_state_in_memory). Units in memory go to the checkpoint's state.bin, units on NVMe
  // are named in the swap file.
  std::string state_placement;  // empty: "nvme" or "memory" by state_on_nvme
  std::vector<std::string> state_in_memory_units;
  std::vector<std::string> swap_files;  // the run's, absolute (state_on_nvme), stripe order
  uint64_t stripe_bytes = 0;            // their stripe unit when there are several
  // The checkpoint the run resumed from, when it lies under root (it and older ones may stay).
  std::optional<uint64_t> resumed_step;
  // Generations of NVMe-homed state in the swap file (ExecutorOptions::state_generations),
  // recorded in the manifest: a resume lays the swap file out the same way.
  uint32_t state_generations = 1;
  // The checkpoint (its step) the run resumed from when it lies outside root: its extents are
  // released once this run's first checkpoint is committed.
  std::optional<uint64_t> release_after_first_commit;
  // Across ranks: this rank, the world size, the partition rule of the optimizer state
  // (ckpt::kPartition*), the chunks of a unit (0: the world size; HYBRID_SHARD: the ranks of a
  // node), and how long a writer waits for the other ranks' parts.
  uint32_t rank = 0;
  uint32_t world = 1;
  std::string partition = ckpt::kPartitionNone;
  uint32_t chunks = 0;
  double part_timeout_seconds = 300;
};

struct CheckpointStats {
  uint64_t committed = 0;      // checkpoints committed
  uint64_t last_step = 0;      // of the last one committed
  std::string last_dir;
  double writer_seconds = 0;   // on the writer thread, all checkpoints
  double last_writer_seconds = 0;
  uint64_t bytes_written = 0;  // data files (state in memory); NVMe state is not copied
  // MeasurePlainCopy: copies made, their bytes and seconds, and the last one's.
  uint64_t plain_copies = 0, plain_copy_bytes = 0;
  double plain_copy_seconds = 0, last_plain_copy_seconds = 0;
};

inline constexpr uint64_t kPlainCopyChunk = 2ull << 30;

class Checkpointer {
 public:
  static Result<std::unique_ptr<Checkpointer>> Create(const CheckpointerOptions& options);
  ~Checkpointer();  // waits for the writer

  // Starts the checkpoint of `state` and the executor's optimizer state after its last step.
  Status Save(LayerExecutor& executor, const TrainerState& state);
  Status Wait();
  // The benchmark's yardstick (zinf train --compare-checkpoint-copy): waits for the commit in
  // progress, then copies the bytes of every shard of the last committed checkpoint the plain
  // way (buffered reads of its files, writes to a temporary file under the root, fdatasync),
  // as a checkpoint that copies its state would; the temporary file is emptied every
  // kPlainCopyChunk bytes so the disk needs no room for a whole copy, and removed at the end.
  // Returns the seconds it took and adds them to stats().
  Result<double> MeasurePlainCopy();
  CheckpointStats stats() const { return stats_; }

 private:
  explicit Checkpointer(CheckpointerOptions o) : options_(std::move(o)) {}
  struct Job;
  Status Write(const Job& job, const std::vector<UnitState>& units, double* seconds,
               uint64_t* bytes);
  // Across ranks, after this rank's part is committed: rank 0 commits the checkpoint once every
  // part is there; every rank waits for that commit.
  Status CommitAcrossRanks(const Job& job);
  Status Prune(uint64_t newest_step);

  CheckpointerOptions options_;
  LayerExecutor* executor_ = nullptr;  // of the checkpoint waiting for its step
  bool waiting_for_step_ = false;
  std::shared_future<Status> commit_;
  std::optional<uint64_t> commit_step_;
  std::string commit_dir_;
  double commit_seconds_ = 0;
  uint64_t commit_bytes_ = 0;
  CheckpointStats stats_;
};

// The swap files a committed checkpoint names must not be emptied by another run. A
// Checkpointer of NVMe-homed state leaves kSwapOwnerFile in each swap file's directory, naming
// its checkpoint root; CheckSwapFilesFree refuses (FailedPrecondition naming the swap file, the
// root and the latest such checkpoint) a run about to create swap files in `swap_dirs` while
// checkpoints under that root still name them, unless the run resumes one of them
// (`resuming`: the checkpoint directory resumed, or empty).
inline constexpr char kSwapOwnerFile[] = "zinf.swap.checkpoints";
Status CheckSwapFilesFree(const std::vector<std::string>& swap_dirs, const std::string& resuming);

Result<ckpt::Manifest> ReadForResume(const std::string& path);
// The manifest holding this rank's optimizer state: `m` itself for one rank, else its part of
// rank `rank` (checked against the run's world size and partition rule, and against
// allowed_swap_files when given).
Result<ckpt::Manifest> StatePartFor(const ckpt::Manifest& m, uint32_t rank, uint32_t world,
                                    const std::string& partition,
                                    const std::optional<std::vector<std::string>>&
                                        allowed_swap_files = {});
// Whether a run of `world` ranks can resume from `m`: the world size it was written by, and
// not one rank's part (FailedPrecondition saying what to do instead).
Status CheckResumeWorld(const ckpt::Manifest& m, uint32_t world);
// The partition rule of a run's optimizer state (ckpt::kPartition*).
std::string PartitionRuleOf(const Config& c);
// Whether the run's placement of the optimizer state ("nvme", "memory", or "mixed" with the
// units in memory) is the checkpoint's (FailedPrecondition naming both otherwise): checked
// before the swap file is opened, whose layout follows the placement.
// `device`: this run's zero_optimization.offload_optimizer.device ("nvme", "cpu", "none"; empty:
// not compared), which the message names when it differs from the checkpoint's.
Status CheckResumePlacement(const ckpt::Manifest& manifest, const std::string& state_placement,
                            const std::vector<std::string>& state_in_memory_units,
                            const std::string& device = "");
// The checkpoint's run's zero_optimization.offload_optimizer.device ("" when not recorded).
std::string RecordedStateDevice(const ckpt::Manifest& manifest);
// `state_placement` / `state_in_memory_units`: the run's placement of the optimizer state, as
// CheckpointerOptions records it (empty: "nvme" or "memory" from the config); a checkpoint of
// another placement is refused (the swap file's layout follows the placement).
Status CheckResumable(const ckpt::Manifest& manifest, const Config& config,
                      const std::vector<std::string>& swap_files,
                      const std::string& state_placement = "",
                      const std::vector<std::string>& state_in_memory_units = {},
                      bool repartitioned = false);
Result<TrainerState> TrainerStateOf(const ckpt::Manifest& manifest);
Status RestoreOptimizerState(LayerExecutor& executor, const ckpt::Manifest& manifest);
// A resume on another world size or partition rule (re-partitioning; checkpoint_repartition.cc):
// whether `global` (the checkpoint's own manifest) needs it for a run of `world` ranks under
// `partition` (PartitionRuleOf).
// `chunks`: this run's chunks of a unit under "unit-chunks" (HYBRID_SHARD: the ranks of a node;
// else the world size).
bool NeedsRepartition(const ckpt::Manifest& global, uint32_t world, const std::string& partition,
                      uint32_t chunks);
// The manifests that hold its optimizer state (under "unit-chunks" the parts of its chunks,
// 0..Chunks()-1; rank 0's of a "replicated" one; the manifest itself for one rank): refused
// when `global` is a part.
Result<std::vector<ckpt::Manifest>> StatePartsForRepartition(const ckpt::Manifest& global);
// Puts this rank's share of every unit's state (under "unit-chunks" chunk `rank` of `world`: a
// HYBRID_SHARD run passes its rank and size within its node; else the whole
// unit) back into the executor: each unit's role is joined from the old parts' shards that
// overlap the share, each such shard streamed whole through a fixed buffer and checked against
// its recorded hash (DataLoss naming it) before any of it is used (the shards no rank's share
// overlaps do not exist: the chunks tile the unit). Memory: the share's three arrays of one unit
// and a 4 MiB buffer. Every rank calls it (ZeRO-1/2 gather the 16-bit weights: a collective).
Status RestoreRepartitioned(LayerExecutor& executor, const std::vector<ckpt::Manifest>& parts,
                            uint64_t step, uint32_t rank, uint32_t world,
                            const std::string& partition);
// Every unit's master, exp_avg and exp_avg_sq shard (indexed by offload::StateRole), checked
// against the model (a part of a "unit-chunks" checkpoint: against its rank's chunks): a shard of a unit the model lacks, of another dtype or length, or listed
// twice is InvalidArgument; a missing one is DataLoss. Pointers into `manifest`.
using StateShardSet = std::array<const ckpt::ShardEntry*, offload::kStateRoles>;
Result<std::vector<StateShardSet>> StateShardsByUnit(const ckpt::Manifest& manifest,
                                                    const Model& model);
// The config the checkpoint's run had (its "training.config"), read onto `base`.
Result<Config> ConfigOf(const ckpt::Manifest& manifest, const Config& base);
// The total steps the checkpoint's run was asked for, its data and evaluation options
// (training.run).
Result<RecordedRun> RecordedRunOf(const ckpt::Manifest& manifest);

}  // namespace zinf::train
