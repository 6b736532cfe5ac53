// src/train/trainer_setup.cc — Train()'s set-up: the ranks, the resume, the data, the runtime,
// the placement of the optimizer state, the executor, the weights and the checkpointer
// (trainer_setup.h).
#include "src/train/trainer_setup.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "src/base/host_info.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/backend_factory.h"
#include "src/train/checkpoint.h"
#include "src/train/data.h"
#include "src/train/ranks.h"
#include "src/train/sizing.h"
#include "src/train/weights_io.h"

namespace zinf::train {
namespace {

// `path` made absolute (a resume from another directory reads the same file); "" stays "".
std::string AbsolutePath(const std::string& path) {
  return path.empty() ? path : std::filesystem::absolute(path).lexically_normal().string();
}

// Whether two paths name the same file or directory (both exist).
bool SamePath(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec);
}

// Generations of NVMe-homed optimizer state a run keeps in its swap file: one per checkpoint
// kept, plus the one steps write; a resume takes its checkpoint's (the swap file's layout).
Result<uint32_t> StateGenerations(const Config& c, const ckpt::Manifest* resumed) {
  const CheckpointConfig& ck = c.zinf.checkpoint;
  if (c.zero.offload_optimizer.device != OffloadDevice::kNvme) return 1u;
  if (resumed == nullptr) return ck.dir.empty() ? 1u : ck.keep + 1;
  // Manifests from before zinf.checkpoint.keep applied to NVMe state had two.
  const uint32_t recorded = resumed->training.value("state_generations", 2u);
  if (!ck.dir.empty() && ck.keep + 1 > recorded) {
    return InvalidArgument(fmt::format(
        "--keep-checkpoints {}: the swap file of {} holds {} generations of the optimizer "
        "state, room for {} checkpoints kept (the run that wrote it had keep {}); resume with "
        "--keep-checkpoints {} or less", ck.keep, resumed->dir, recorded, recorded - 1,
        recorded - 1, recorded - 1));
  }
  return recorded;
}

// A resume in the checkpoint root it came from: the root's other committed checkpoints that
// stay (the newest `keep` up to the one resumed, itself included) name extents of the same
// swap file, which stay untouched until they are pruned. Older ones are on their way out:
// Checkpointer::Create prunes them, or across ranks rank 0 does, maybe after this rank lists
// them — protecting those would leave a step no generation to write.
Status ProtectKeptCheckpoints(LayerExecutor& ex, const ckpt::Manifest& resumed,
                              const std::vector<std::string>& swap_files, uint32_t keep) {
  // `resumed`: the state's manifest (a part across ranks, in its checkpoint's directory).
  std::filesystem::path dir(resumed.dir);
  if (resumed.rank) dir = dir.parent_path();
  const std::string root = dir.parent_path().string();
  std::vector<ckpt::CommittedCheckpoint> kept;
  for (const auto& c : ckpt::Committed(root)) {
    if (c.step <= resumed.step) kept.push_back(c);  // newer ones are refused
  }
  if (kept.size() > keep) kept.erase(kept.begin(), kept.end() - keep);
  for (const auto& c : kept) {
    if (c.step >= resumed.step) continue;  // itself
    auto m = ckpt::Read(c.dir);
    if (m.ok() && m->HasParts()) m = ckpt::ReadPart(*m, resumed.rank.value_or(0));
    if (!m.ok()) {
      Log().warn("train: {} does not read ({}); what it names in the swap file is not kept",
                 c.dir, m.status().ToString());
      continue;
    }
    bool same_swap = false;
    for (const auto& f : m->files) {
      same_swap |= f.kind == "swap" && !swap_files.empty() && SamePath(f.name, swap_files[0]);
    }
    if (!same_swap) continue;
    ZINF_ASSIGN_OR_RETURN(const auto shards, StateShardsByUnit(*m, ex.model()));
    std::vector<UnitState> units;
    for (uint32_t u = 0; u < shards.size(); ++u) {
      UnitState st;
      st.unit = u;
      st.n = shards[u][0]->length / 4;  // the unit's, or this rank's chunk of it
      const ckpt::FileEntry* f = m->FindFile(shards[u][0]->file);
      if (f == nullptr || f->kind != "swap") continue;  // a unit in memory: in state.bin
      for (int r = 0; r < offload::kStateRoles; ++r) {
        st.extents[r] = {shards[u][r]->offset, shards[u][r]->length};
      }
      units.push_back(st);
    }
    ZINF_RETURN_IF_ERROR(ex.ProtectCheckpoint(m->step, units).WithContext(c.dir));
  }
  return Status::Ok();
}

}  // namespace

namespace {

// What a resume starts from; empty when the run is fresh.
struct ResumeSource {
  // The manifest of this rank's state (across ranks, its part of the checkpoint in `dir`). A
  // checkpoint of another world size or partition rule is re-partitioned: every rank reads its
  // share from all the old parts (old_parts), `from` is rank 0's (the trainer's state, the
  // model's record), and the swap files are this run's own.
  std::optional<ckpt::Manifest> from;
  std::string dir;
  bool repartition = false;
  std::vector<ckpt::Manifest> old_parts;
  // The run goes on in the checkpoint's own swap layout.
  const ckpt::Manifest* exact() const { return from && !repartition ? &*from : nullptr; }
};

// Where the optimizer state lives, and the budgets the runtime is built with.
struct StateLayout {
  Config rc;                 // the run's config with the automatic pinned budget resolved
  std::string placement;     // "memory", "nvme" or "mixed"
  std::vector<std::string> in_memory_names;
  // The units in memory as checkpoints record them (only a mixed placement lists them).
  std::vector<std::string> Recorded() const {
    return placement == "mixed" ? in_memory_names : std::vector<std::string>{};
  }
};

// The ranks joined and agreeing, this rank's config, and the checks that need nothing built.
Status JoinRun(const TrainOptions& opt, TrainRun& run) {
  // Across ranks (zinf launch): the batch keys are read against the world size, and each rank
  // has its own swap directories.
  ZINF_ASSIGN_OR_RETURN(const comm::WorldEnv world_env, comm::ReadWorldEnv());
  run.shared = opt.config;
  run.shared.world_size = static_cast<uint64_t>(world_env.world);
  ZINF_RETURN_IF_ERROR(run.shared.Validate());
  run.c = world_env.world > 1 ? PerRankPaths(run.shared, world_env.rank) : run.shared;
  const Config& c = run.c;
  if (world_env.world > 1 && UsesNvme(c)) ZINF_RETURN_IF_ERROR(MakeRankDirs(c));
  ZINF_ASSIGN_OR_RETURN(run.ranks, JoinRanks(run.shared));
  ZINF_RETURN_IF_ERROR(CheckRanksAgree(run.ranks, run.shared,
                                       {.steps = opt.steps,
                                        .data = AbsolutePath(opt.data_path),
                                        .val_data = AbsolutePath(opt.val_data_path),
                                        .init = AbsolutePath(opt.init_path),
                                        .synthetic_bytes = opt.synthetic_bytes}));
  if (c.precision() == Precision::kFp32) {
    return Unimplemented(fmt::format(
        "{}: bf16.enabled is false and fp16 is off, which asks for fp32 training; zinf trains "
        "with a bf16 or fp16 working copy (enable one of them)", c.source));
  }
  if (opt.steps == 0) return InvalidArgument("--steps must be >= 1");
  const CheckpointConfig& ck = c.zinf.checkpoint;
  if (!ck.resume.empty() && !opt.init_path.empty()) {
    return InvalidArgument(fmt::format(
        "--init {} with --resume {}: a resume takes the weights from the checkpoint; give one "
        "of them", opt.init_path, ck.resume));
  }
  return Status::Ok();
}

// The checkpoint a resume reads (zinf.checkpoint.resume), and the trainer's state in it.
Result<ResumeSource> ReadResume(const TrainOptions& opt, TrainRun& run) {
  ResumeSource r;
  const Config& c = run.c;
  if (c.zinf.checkpoint.resume.empty()) return r;
  const Ranks& ranks = run.ranks;
  ZINF_ASSIGN_OR_RETURN(const ckpt::Manifest whole, ReadForResume(c.zinf.checkpoint.resume));
  r.dir = whole.dir;
  r.repartition = !whole.rank && NeedsRepartition(whole, static_cast<uint32_t>(ranks.world()),
                                                  PartitionRuleOf(c),
                                                  static_cast<uint32_t>(ranks.shard_world()));
  if (r.repartition) {
    ZINF_ASSIGN_OR_RETURN(r.old_parts, StatePartsForRepartition(whole));
    r.from = r.old_parts[0];
    Log().info("train: re-partitioning {}: written by {} rank(s) (\"{}\"), resumed by {} (\"{}\")",
               whole.dir, whole.world_size, whole.partition, ranks.world(), PartitionRuleOf(c));
  } else {
    ZINF_ASSIGN_OR_RETURN(r.from,
                          StatePartFor(whole, static_cast<uint32_t>(ranks.rank()),
                                       static_cast<uint32_t>(ranks.world()), PartitionRuleOf(c)));
  }
  ZINF_ASSIGN_OR_RETURN(run.resumed, TrainerStateOf(*r.from));
  if (run.resumed.step >= opt.steps) {
    return InvalidArgument(fmt::format(
        "--resume {}: the checkpoint is of step {}, and the run asks for {} steps in all; "
        "expected --steps above {}", r.from->dir, run.resumed.step, opt.steps,
        run.resumed.step));
  }
  return r;
}

// The model's shape, the data (first: a bad file is reported before anything heavy is built),
// the schedule and the loss scaler.
Status LoadData(const TrainOptions& opt, TrainRun& run, const ResumeSource& resume) {
  const Config& c = run.c;
  ZINF_ASSIGN_OR_RETURN(run.model, Model::FromConfig(c.zinf.model));
  if (!run.model.is_gpt() && !opt.save_path.empty()) {
    return Unimplemented("--save writes nanoGPT-named GPT-2 weights; zinf.model.arch \"llama\" "
                         "has no weights file format yet (Hugging Face's comes with issue 39's "
                         "export)");
  }
  run.B = static_cast<uint32_t>(c.MicroBatchSize());
  run.gas = c.GradientAccumulationSteps();
  run.T = c.zinf.model.seq_len;
  const uint32_t B = run.B, T = run.T;
  ZINF_ASSIGN_OR_RETURN(TrainingData data,
                        LoadTrainingData({.path = opt.data_path,
                                          .val_path = opt.val_data_path,
                                          .format = opt.data_format,
                                          .synthetic_bytes = opt.synthetic_bytes,
                                          .seed = c.zinf.seed,
                                          .val_fraction = opt.val_fraction},
                                         static_cast<uint32_t>(run.model.vocab()), T));
  ZINF_ASSIGN_OR_RETURN(BatchSampler train_data,
                        BatchSampler::Create(data.train, Split::kTrain, B, T, c.zinf.seed));
  if (resume.from) {
    ZINF_RETURN_IF_ERROR(train_data.source().CheckSameAs(run.resumed.data).WithContext(
        "--resume " + resume.from->dir + ": a resume reads the data the checkpoint's run read"));
  }
  run.train_data.emplace(std::move(train_data));
  if (opt.eval_every > 0 && data.validation.split_size(Split::kValidation) > T) {
    ZINF_ASSIGN_OR_RETURN(run.val_data, BatchSampler::Create(data.validation, Split::kValidation,
                                                             B, T, c.zinf.seed + 1));
  } else if (!opt.val_data_path.empty() && opt.eval_every == 0) {
    Log().warn("train: --val-data {} is not used without --eval-every N", opt.val_data_path);
  }
  ZINF_ASSIGN_OR_RETURN(run.schedule,
                        LrSchedule::Create(c.scheduler, c.optimizer.lr, opt.steps));
  ZINF_ASSIGN_OR_RETURN(run.scaler, LossScaler::FromConfig(c.fp16));
  run.fp16 = c.precision() == Precision::kFp16;
  return Status::Ok();
}

// The executor's options: types, homes, the pipeline, the trace, the ranks' partitioning.
Status SetExecutorOptions(const TrainOptions& opt, TrainRun& run, const ResumeSource& resume) {
  const Config& c = run.c;
  const Ranks& ranks = run.ranks;
  // --trace, else the config's zinf.trace_file.
  run.trace_path = !opt.trace_path.empty() ? opt.trace_path : c.zinf.trace_file;
  run.tracer = std::make_unique<Tracer>(!run.trace_path.empty());
  ExecutorOptions& eo = run.eo;
  eo.batch = static_cast<int>(run.B);
  eo.seq = static_cast<int>(run.T);
  eo.param16_type = run.fp16 ? kernels::DType::kF16 : kernels::DType::kBf16;
  eo.moment_type = MomentType(c);
  eo.stochastic_moments = c.zinf.optimizer_state_rounding == "stochastic";
  eo.rounding_seed = c.zinf.seed;
  eo.params_on_nvme = c.zero.offload_param.device == OffloadDevice::kNvme;
  eo.optimizer_on_nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  eo.pipeline_slabs = c.zinf.pipeline_depth + 1;
  eo.micro_batches = static_cast<uint32_t>(run.gas);
  eo.adam.threads = static_cast<int>(c.zinf.adam_threads);
  eo.tracer = run.tracer.get();
  // Checkpoints of NVMe-homed state keep generations of it in the swap file.
  ZINF_ASSIGN_OR_RETURN(eo.state_generations, StateGenerations(c, resume.exact()));
  eo.verify_state_reads = c.zinf.checkpoint.verify_state_reads;
  eo.comm = ranks.partition_comm();  // HYBRID_SHARD: the node's ranks
  eo.replica_comm = ranks.replica_comm.get();
  // ZeRO-1/2 across ranks: the optimizer state (and the gradients) partitioned, stepped after
  // backward.
  eo.partition_optimizer = ranks.world() > 1 && c.Stage() >= 1;
  eo.partition_grads = ranks.world() > 1 && c.Stage() >= 2;   // ZeRO-2
  eo.partition_params = ranks.world() > 1 && c.Stage() >= 3;  // ZeRO-3, FSDP's FULL_SHARD
  // ZeRO-1/2 gather each unit's new weights after its Adam (a collective, issued by the
  // training thread); ZeRO-3's step has none (each rank writes its own shards home), so it runs
  // under the next forward as one rank's does.
  if (eo.partition_optimizer && !eo.partition_params) eo.async_optimizer = false;
  return Status::Ok();
}

// No other run uses this run's swap files.
Status CheckSwapFiles(const Config& c, const ResumeSource& resume) {
  if (!UsesNvme(c)) return Status::Ok();
  std::vector<std::string> swap_dirs = c.zinf.stripe_paths;
  if (swap_dirs.empty()) swap_dirs.push_back(c.SwapDir());
  // Re-partitioning reads the checkpoint's state from its swap files: this run's must be
  // others (the resumed checkpoint counts as any other).
  Status free = CheckSwapFilesFree(swap_dirs, resume.repartition ? std::string() : resume.dir);
  if (resume.repartition) {
    free = free.WithContext("a resume on another world size reads the checkpoint's optimizer "
                            "state from its swap files, which this run must leave alone");
  }
  return free;
}

// The units a resumed checkpoint kept in memory (none recorded: nullopt).
std::optional<std::vector<std::string>> RecordedInMemory(const TrainRun& run,
                                                         const ResumeSource& resume) {
  const ckpt::Manifest* from = resume.exact();
  if (from == nullptr || !run.eo.optimizer_on_nvme) return std::nullopt;
  std::optional<std::vector<std::string>> names;
  const std::string then = from->training.value("optimizer_state", std::string());
  if (then == "mixed") {
    names = from->training.value("optimizer_state_in_memory", std::vector<std::string>());
  } else if (then == "nvme") {
    names.emplace();  // no unit in memory
  } else if (then == "memory" && RecordedStateDevice(*from) == "nvme") {
    names.emplace();  // every unit in memory, placed there from NVMe
    for (uint32_t u = 0; u < run.model.units(); ++u) names->push_back(run.model.UnitName(u));
  }
  return names;
}

// The budgets and each unit's optimizer state on NVMe or in memory (--placement,
// zinf.budgets.host_bytes; a resume keeps its checkpoint's).
Result<StateLayout> PlaceState(const TrainOptions& opt, TrainRun& run,
                               const ResumeSource& resume) {
  const Config& c = run.c;
  const Model& dims = run.model;
  ExecutorOptions& eo = run.eo;
  StateLayout l{.rc = c};
  // An automatic pinned budget is what this run wants (every shard's host copy and the
  // optimizer's slabs), within what the machine allows: a small model does not lock 2 GiB.
  if (!l.rc.zinf.budgets.pinned_bytes) {
    const uint64_t wanted = PinnedBytesWanted(dims, eo);
    l.rc.zinf.budgets.pinned_bytes = AutoPinnedBudget(dims, c, eo);
    Log().info("train: pinned budget auto: {} ({} bytes; the run wants {}, the machine allows {})",
               FormatBytesHuman(*l.rc.zinf.budgets.pinned_bytes), *l.rc.zinf.budgets.pinned_bytes,
               FormatBytesHuman(wanted), FormatBytesHuman(AutoPinnedCap()));
  }
  const std::optional<std::vector<std::string>> recorded = RecordedInMemory(run, resume);
  const uint32_t world32 = static_cast<uint32_t>(run.ranks.shard_world());
  const uint32_t rank32 = static_cast<uint32_t>(run.ranks.shard_rank());
  const bool chunked = eo.partition_optimizer;
  const uint64_t pinned_budget = *l.rc.zinf.budgets.pinned_bytes;
  // This rank's share of the memory available: the node's ranks split it (each reads it as it
  // starts; one that reads it after another allocated sees less, never more).
  const uint64_t node_ranks = static_cast<uint64_t>(std::max(1, run.ranks.env.local_world));
  const uint64_t mem_available = MemAvailableBytes() / node_ranks;
  // zinf.budgets.host_bytes "auto": sized now from the memory available (a resume keeps its
  // checkpoint's placement instead).
  Config placed = c;
  if (c.zinf.budgets.host_bytes_auto && eo.optimizer_on_nvme && !recorded && mem_available > 0) {
    const uint64_t device = DeviceBudgetOf(c);
    placed.zinf.budgets.host_bytes = AutoHostBytes(mem_available, pinned_budget, device);
    Log().info("train: host budget auto: {} ({} available{}, less the pinned budget {}, the "
               "device budget {} and 2 GiB kept)",
               FormatBytesHuman(*placed.zinf.budgets.host_bytes), FormatBytesHuman(mem_available),
               node_ranks > 1 ? fmt::format(" to this rank, 1/{} of the node's", node_ranks) : "",
               FormatBytesHuman(pinned_budget), FormatBytesHuman(device));
  }
  ZINF_ASSIGN_OR_RETURN(
      run.placement,
      PlaceOptimizerState(
          dims, placed, opt.placement, StateBytesPerParam(c),
          [&](uint32_t u) {
            const uint64_t n = dims.UnitParams(u);
            return chunked ? ckpt::ChunkOfUnit(n, world32, rank32).len : n;
          },
          // 0: unknown (not checked); 1: nothing left beside the pinned budget.
          mem_available == 0 ? 0 : mem_available > pinned_budget ? mem_available - pinned_budget : 1,
          recorded ? &*recorded : nullptr));
  const StatePlacement& placement = run.placement;
  if (eo.optimizer_on_nvme) {
    eo.state_in_memory = placement.in_memory;
    Log().info("train: optimizer state placement {}: {}", placement.how, placement.Describe(dims));
  }
  for (uint32_t u = 0; u < dims.units(); ++u) {
    if (placement.in_memory[u]) l.in_memory_names.push_back(dims.UnitName(u));
  }
  l.placement = !eo.optimizer_on_nvme                          ? "memory"
                : placement.memory_bytes == 0                  ? "nvme"
                : l.in_memory_names.size() == dims.units()     ? "memory"
                                                               : "mixed";
  if (l.placement == "mixed" && !placement.in_memory.empty() && l.in_memory_names.empty()) {
    return Internal("mixed placement without units in memory");
  }
  if (const ckpt::Manifest* from = resume.exact()) {
    ZINF_RETURN_IF_ERROR(CheckResumePlacement(
        *from, l.placement, l.Recorded(),
        std::string(OffloadDeviceName(c.zero.offload_optimizer.device))));
  }
  return l;
}

// The offload runtime (device, pool, swap file, tiers), the backend and the layer executor.
Status BuildEngine(const TrainOptions& opt, TrainRun& run, const ResumeSource& resume,
                   const StateLayout& layout) {
  const ExecutorOptions& eo = run.eo;
  // This rank's share of each unit, as the executor partitions it: its swap file holds only that.
  const RankShare share{.world = static_cast<uint32_t>(run.ranks.shard_world()),
                        .rank = static_cast<uint32_t>(run.ranks.shard_rank()),
                        .optimizer = eo.partition_optimizer,
                        .grads = eo.partition_grads,
                        .params = eo.partition_params};
  bool swap_in_checkpoint = false;
  if (const ckpt::Manifest* from = resume.exact()) {
    for (const auto& f : from->files) swap_in_checkpoint |= f.kind == "swap";
  }
  ZINF_ASSIGN_OR_RETURN(
      run.rt, MakeOffloadRuntime(
                  layout.rc,
                  {.swap_bytes = SwapBytes(run.model, run.c, eo.state_generations,
                                           run.placement.in_memory, share),
                   .tracer = run.tracer.get(),
                   .device_kind = opt.device,
                   .cuda_ordinal = run.ranks.cuda_ordinal,
                   .h2d_gbps = opt.h2d_gbps,
                   .keep_swap_files = eo.state_generations > 1,
                   .reuse_swap_files = swap_in_checkpoint,
                   .wrap_backend = opt.wrap_backend}));
  ZINF_ASSIGN_OR_RETURN(run.compute, run.rt->device->CreateStream("compute"));
  ZINF_ASSIGN_OR_RETURN(run.backend, MakeBackend(*run.rt->device, run.compute,
                                                 run.c.zinf.adam_threads, run.rt->arena.get()));
  ZINF_ASSIGN_OR_RETURN(run.ex,
                        LayerExecutor::Create(*run.rt, *run.backend, run.compute, run.model, eo));
  return Status::Ok();
}

// The weights and the optimizer state: a resume's (re-partitioned or not), --init's, or new.
Status InitOrRestore(const TrainOptions& opt, TrainRun& run, const ResumeSource& resume,
                     const StateLayout& layout) {
  const Config& c = run.c;
  LayerExecutor& ex = *run.ex;
  if (!resume.from) {
    if (!opt.init_path.empty()) return LoadWeights(ex, opt.init_path);
    return ex.InitWeights(c.zinf.seed);
  }
  ZINF_RETURN_IF_ERROR(CheckResumable(*resume.from, c, ex.SwapFilePaths(), layout.placement,
                                      layout.Recorded(), resume.repartition));
  if (resume.repartition) {
    ZINF_RETURN_IF_ERROR(RestoreRepartitioned(
        ex, resume.old_parts, run.resumed.step, static_cast<uint32_t>(run.ranks.shard_rank()),
        static_cast<uint32_t>(run.ranks.shard_world()), PartitionRuleOf(c)));
  } else {
    ZINF_RETURN_IF_ERROR(RestoreOptimizerState(ex, *resume.from));
  }
  ZINF_RETURN_IF_ERROR(run.scaler->Restore(run.resumed.scaler));
  run.train_data->Seek(run.resumed.data_position);
  Log().info("train: resumed from {} (step {}, {} applied, {} skipped)", resume.dir,
             run.resumed.step, run.resumed.applied, run.resumed.skipped);
  return Status::Ok();
}

// The checkpointer of zinf.checkpoint.dir (none without one).
Status MakeCheckpointer(const TrainOptions& opt, TrainRun& run, const ResumeSource& resume,
                        const StateLayout& layout) {
  const Config& c = run.c;
  const CheckpointConfig& ck = c.zinf.checkpoint;
  if (ck.dir.empty()) return Status::Ok();
  LayerExecutor& ex = *run.ex;
  const Ranks& ranks = run.ranks;
  std::optional<uint64_t> resumed_step, resumed_elsewhere;
  if (resume.from &&
      SamePath(std::filesystem::path(resume.dir).parent_path().string(), ck.dir)) {
    resumed_step = run.resumed.step;
  } else if (resume.from) {
    resumed_elsewhere = run.resumed.step;
  }
  const RecordedRun recorded{.steps_total = opt.steps,
                             .data = AbsolutePath(opt.data_path),
                             .val_data = AbsolutePath(opt.val_data_path),
                             .data_format = std::string(DataFormatName(opt.data_format)),
                             .synthetic_bytes = opt.synthetic_bytes,
                             .val_fraction = opt.val_fraction,
                             .eval_every = opt.eval_every,
                             .eval_batches = opt.eval_batches};
  ZINF_ASSIGN_OR_RETURN(
      run.checkpointer,
      Checkpointer::Create(
          {.root = ck.dir,
           .keep = ck.keep,
           .config = run.shared,  // not this rank's paths
           .run = recorded,
           // state.bin (12 or 8 bytes a parameter) and room for its manifest
           .bytes_per_checkpoint =
               ex.StateBytesInMemory() > 0 ? ex.StateBytesInMemory() + (64 << 10) : 0,
           .state_on_nvme = ex.StateBytesOnNvme() > 0,
           .state_placement = layout.placement,
           .state_in_memory_units = layout.Recorded(),
           .swap_files = ex.SwapFilePaths(),
           .stripe_bytes = ex.SwapStripeBytes(),
           .resumed_step = resumed_step,
           .state_generations = run.eo.state_generations,
           .release_after_first_commit = resumed_elsewhere,
           .rank = static_cast<uint32_t>(ranks.rank()),
           .world = static_cast<uint32_t>(ranks.world()),
           .partition = PartitionRuleOf(c),
           .chunks = static_cast<uint32_t>(ranks.shard_comm ? ranks.shard_world() : 0),
           .part_timeout_seconds = static_cast<double>(c.zinf.comm.timeout_seconds)}));
  // What Create left of the root's older checkpoints stays untouched until pruned.
  if (resumed_step && ex.StateBytesOnNvme() > 0) {
    ZINF_RETURN_IF_ERROR(ProtectKeptCheckpoints(ex, *resume.from, ex.SwapFilePaths(), ck.keep));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TrainRun>> SetUpRun(const TrainOptions& opt) {
  auto run = std::make_unique<TrainRun>();
  ZINF_RETURN_IF_ERROR(JoinRun(opt, *run));
  ZINF_ASSIGN_OR_RETURN(const ResumeSource resume, ReadResume(opt, *run));
  ZINF_RETURN_IF_ERROR(LoadData(opt, *run, resume));
  ZINF_RETURN_IF_ERROR(SetExecutorOptions(opt, *run, resume));
  ZINF_RETURN_IF_ERROR(CheckSwapFiles(run->c, resume));
  ZINF_ASSIGN_OR_RETURN(const StateLayout layout, PlaceState(opt, *run, resume));
  ZINF_RETURN_IF_ERROR(BuildEngine(opt, *run, resume, layout));
  const auto t_init = TrainClock::now();
  ZINF_RETURN_IF_ERROR(InitOrRestore(opt, *run, resume, layout));
  ZINF_RETURN_IF_ERROR(MakeCheckpointer(opt, *run, resume, layout));
  const Model& d = run->model;
  Log().info("train: {} parameters ({}), micro-batch {} x {} accumulation, {} on {}; weights "
             "ready in {:.1f} s",
             d.TotalParams(), d.Describe(), run->B, run->gas,
             run->backend->name(), run->rt->device->Describe(), SecondsSince(t_init));
  return run;
}

}  // namespace zinf::train
