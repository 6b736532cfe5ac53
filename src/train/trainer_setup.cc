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
    ZINF_ASSIGN_OR_RETURN(const auto shards, StateShardsByUnit(*m, ex.dims()));
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

Result<std::unique_ptr<TrainRun>> SetUpRun(const TrainOptions& opt) {
  // Across ranks (zinf launch): the batch keys are read against the world size, and each rank
  // has its own swap directories.
  ZINF_ASSIGN_OR_RETURN(const comm::WorldEnv world_env, comm::ReadWorldEnv());
  Config shared = opt.config;
  shared.world_size = static_cast<uint64_t>(world_env.world);
  ZINF_RETURN_IF_ERROR(shared.Validate());
  const Config cfg = world_env.world > 1 ? PerRankPaths(shared, world_env.rank) : shared;
  const Config& c = cfg;
  if (world_env.world > 1 && UsesNvme(c)) ZINF_RETURN_IF_ERROR(MakeRankDirs(c));
  ZINF_ASSIGN_OR_RETURN(Ranks ranks, JoinRanks(shared));
  ZINF_RETURN_IF_ERROR(CheckRanksAgree(ranks, shared,
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
  const bool resuming = !ck.resume.empty();
  if (resuming && !opt.init_path.empty()) {
    return InvalidArgument(fmt::format(
        "--init {} with --resume {}: a resume takes the weights from the checkpoint; give one "
        "of them", opt.init_path, ck.resume));
  }
  // resume_from: the manifest of this rank's state (across ranks, its part of the checkpoint
  // in resume_dir). A checkpoint of another world size or partition rule is re-partitioned:
  // every rank reads its share from all the old parts (old_parts), resume_from is rank 0's
  // (the trainer's state, the model's record), and the swap files are this run's own.
  std::optional<ckpt::Manifest> resume_from;
  std::string resume_dir;
  TrainerState resumed;
  bool repartition = false;
  std::vector<ckpt::Manifest> old_parts;
  if (resuming) {
    ZINF_ASSIGN_OR_RETURN(const ckpt::Manifest whole, ReadForResume(ck.resume));
    resume_dir = whole.dir;
    repartition = !whole.rank && NeedsRepartition(whole, static_cast<uint32_t>(ranks.world()),
                                                  PartitionRuleOf(c),
                                                  static_cast<uint32_t>(ranks.shard_world()));
    if (repartition) {
      ZINF_ASSIGN_OR_RETURN(old_parts, StatePartsForRepartition(whole));
      resume_from = old_parts[0];
      Log().info("train: re-partitioning {}: written by {} rank(s) (\"{}\"), resumed by {} (\"{}\")",
                 whole.dir, whole.world_size, whole.partition, ranks.world(), PartitionRuleOf(c));
    } else {
      ZINF_ASSIGN_OR_RETURN(resume_from,
                            StatePartFor(whole, static_cast<uint32_t>(ranks.rank()),
                                         static_cast<uint32_t>(ranks.world()), PartitionRuleOf(c)));
    }
    ZINF_ASSIGN_OR_RETURN(resumed, TrainerStateOf(*resume_from));
    if (resumed.step >= opt.steps) {
      return InvalidArgument(fmt::format(
          "--resume {}: the checkpoint is of step {}, and the run asks for {} steps in all; "
          "expected --steps above {}", resume_from->dir, resumed.step, opt.steps, resumed.step));
    }
  }
  const GptDims dims = GptDims::FromConfig(c.zinf.model);
  const auto B = static_cast<uint32_t>(c.MicroBatchSize());
  const uint64_t gas = c.GradientAccumulationSteps();
  const uint32_t T = c.zinf.model.seq_len;

  // Data first: a bad file is reported before anything heavy is built.
  ZINF_ASSIGN_OR_RETURN(TrainingData data,
                        LoadTrainingData({.path = opt.data_path,
                                          .val_path = opt.val_data_path,
                                          .format = opt.data_format,
                                          .synthetic_bytes = opt.synthetic_bytes,
                                          .seed = c.zinf.seed,
                                          .val_fraction = opt.val_fraction},
                                         dims.V, T));
  ZINF_ASSIGN_OR_RETURN(BatchSampler train_data,
                        BatchSampler::Create(data.train, Split::kTrain, B, T, c.zinf.seed));
  if (resuming) {
    ZINF_RETURN_IF_ERROR(train_data.source().CheckSameAs(resumed.data).WithContext(
        "--resume " + resume_from->dir + ": a resume reads the data the checkpoint's run read"));
  }
  std::optional<BatchSampler> val_data;
  if (opt.eval_every > 0 && data.validation.split_size(Split::kValidation) > T) {
    ZINF_ASSIGN_OR_RETURN(val_data, BatchSampler::Create(data.validation, Split::kValidation, B,
                                                         T, c.zinf.seed + 1));
  } else if (!opt.val_data_path.empty() && opt.eval_every == 0) {
    Log().warn("train: --val-data {} is not used without --eval-every N", opt.val_data_path);
  }
  ZINF_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(c.scheduler, c.optimizer.lr, opt.steps));
  ZINF_ASSIGN_OR_RETURN(LossScaler scaler, LossScaler::FromConfig(c.fp16));
  const bool fp16 = c.precision() == Precision::kFp16;

  // --trace, else the config's zinf.trace_file.
  const std::string trace_path = !opt.trace_path.empty() ? opt.trace_path : c.zinf.trace_file;
  auto tracer = std::make_unique<Tracer>(!trace_path.empty());
  ExecutorOptions eo;
  eo.batch = static_cast<int>(B);
  eo.seq = static_cast<int>(T);
  eo.param16_type = fp16 ? kernels::DType::kF16 : kernels::DType::kBf16;
  eo.moment_type = MomentType(c);
  eo.stochastic_moments = c.zinf.optimizer_state_rounding == "stochastic";
  eo.rounding_seed = c.zinf.seed;
  eo.params_on_nvme = c.zero.offload_param.device == OffloadDevice::kNvme;
  eo.optimizer_on_nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  eo.pipeline_slabs = c.zinf.pipeline_depth + 1;
  eo.micro_batches = static_cast<uint32_t>(gas);
  eo.adam.threads = static_cast<int>(c.zinf.adam_threads);
  eo.tracer = tracer.get();
  // Checkpoints of NVMe-homed state keep generations of it in the swap file.
  ZINF_ASSIGN_OR_RETURN(eo.state_generations,
                        StateGenerations(c, resume_from && !repartition ? &*resume_from : nullptr));
  eo.verify_state_reads = ck.verify_state_reads;
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
  bool swap_in_checkpoint = false;
  if (resume_from && !repartition) {
    for (const auto& f : resume_from->files) swap_in_checkpoint |= f.kind == "swap";
  }
  if (UsesNvme(c)) {
    std::vector<std::string> swap_dirs = c.zinf.stripe_paths;
    if (swap_dirs.empty()) swap_dirs.push_back(c.SwapDir());
    // Re-partitioning reads the checkpoint's state from its swap files: this run's must be
    // others (the resumed checkpoint counts as any other).
    Status free = CheckSwapFilesFree(swap_dirs, repartition ? std::string() : resume_dir);
    if (repartition) {
      free = free.WithContext("a resume on another world size reads the checkpoint's optimizer "
                              "state from its swap files, which this run must leave alone");
    }
    ZINF_RETURN_IF_ERROR(free);
  }
  // An automatic pinned budget is what this run wants (every shard's host copy and the
  // optimizer's slabs), within what the machine allows: a small model does not lock 2 GiB.
  Config rc = c;
  if (!rc.zinf.budgets.pinned_bytes) {
    const uint64_t wanted = PinnedBytesWanted(dims, eo);
    rc.zinf.budgets.pinned_bytes = AutoPinnedBudget(dims, c, eo);
    Log().info("train: pinned budget auto: {} ({} bytes; the run wants {}, the machine allows {})",
               FormatBytesHuman(*rc.zinf.budgets.pinned_bytes), *rc.zinf.budgets.pinned_bytes,
               FormatBytesHuman(wanted), FormatBytesHuman(AutoPinnedCap()));
  }
  // Each unit's optimizer state on NVMe or in memory (--placement, zinf.budgets.host_bytes; a
  // resume keeps its checkpoint's).
  std::optional<std::vector<std::string>> recorded_in_memory;
  if (resume_from && !repartition && eo.optimizer_on_nvme) {
    const std::string then = resume_from->training.value("optimizer_state", std::string());
    if (then == "mixed") {
      recorded_in_memory =
          resume_from->training.value("optimizer_state_in_memory", std::vector<std::string>());
    } else if (then == "nvme") {
      recorded_in_memory.emplace();  // no unit in memory
    } else if (then == "memory" && RecordedStateDevice(*resume_from) == "nvme") {
      recorded_in_memory.emplace();  // every unit in memory, placed there from NVMe
      for (uint32_t u = 0; u < dims.units(); ++u) recorded_in_memory->push_back(dims.UnitName(u));
    }
  }
  const uint32_t world32 = static_cast<uint32_t>(ranks.shard_world());
  const uint32_t rank32 = static_cast<uint32_t>(ranks.shard_rank());
  const bool chunked = eo.partition_optimizer;
  // This rank's share of each unit, as the executor partitions it: its swap file holds only that.
  const RankShare share{.world = world32, .rank = rank32, .optimizer = eo.partition_optimizer,
                        .grads = eo.partition_grads, .params = eo.partition_params};
  const uint64_t pinned_budget = *rc.zinf.budgets.pinned_bytes;
  // This rank's share of the memory available: the node's ranks split it (each reads it as it
  // starts; one that reads it after another allocated sees less, never more).
  const uint64_t node_ranks = static_cast<uint64_t>(std::max(1, ranks.env.local_world));
  const uint64_t mem_available = MemAvailableBytes() / node_ranks;
  // zinf.budgets.host_bytes "auto": sized now from the memory available (a resume keeps its
  // checkpoint's placement instead).
  Config placed = c;
  if (c.zinf.budgets.host_bytes_auto && eo.optimizer_on_nvme && !recorded_in_memory &&
      mem_available > 0) {
    const uint64_t device = DeviceBudgetOf(c);
    placed.zinf.budgets.host_bytes = AutoHostBytes(mem_available, pinned_budget, device);
    Log().info("train: host budget auto: {} ({} available{}, less the pinned budget {}, the "
               "device budget {} and 2 GiB kept)",
               FormatBytesHuman(*placed.zinf.budgets.host_bytes), FormatBytesHuman(mem_available),
               node_ranks > 1 ? fmt::format(" to this rank, 1/{} of the node's", node_ranks) : "",
               FormatBytesHuman(pinned_budget), FormatBytesHuman(device));
  }
  ZINF_ASSIGN_OR_RETURN(
      const StatePlacement placement,
      PlaceOptimizerState(
          dims, placed, opt.placement, StateBytesPerParam(c),
          [&](uint32_t u) {
            const uint64_t n = dims.UnitParams(u);
            return chunked ? ckpt::ChunkOfUnit(n, world32, rank32).len : n;
          },
          // 0: unknown (not checked); 1: nothing left beside the pinned budget.
          mem_available == 0 ? 0 : mem_available > pinned_budget ? mem_available - pinned_budget : 1,
          recorded_in_memory ? &*recorded_in_memory : nullptr));
  if (eo.optimizer_on_nvme) {
    eo.state_in_memory = placement.in_memory;
    Log().info("train: optimizer state placement {}: {}", placement.how, placement.Describe(dims));
  }
  std::vector<std::string> in_memory_names;
  for (uint32_t u = 0; u < dims.units(); ++u) {
    if (placement.in_memory[u]) in_memory_names.push_back(dims.UnitName(u));
  }
  const std::string state_placement =
      !eo.optimizer_on_nvme                       ? "memory"
      : placement.memory_bytes == 0               ? "nvme"
      : in_memory_names.size() == dims.units()    ? "memory"
                                                  : "mixed";
  if (state_placement == "mixed" && !placement.in_memory.empty() && in_memory_names.empty()) {
    return Internal("mixed placement without units in memory");
  }
  if (resume_from && !repartition) {
    ZINF_RETURN_IF_ERROR(CheckResumePlacement(
        *resume_from, state_placement,
        state_placement == "mixed" ? in_memory_names : std::vector<std::string>{},
        std::string(OffloadDeviceName(c.zero.offload_optimizer.device))));
  }
  ZINF_ASSIGN_OR_RETURN(
      auto rt, MakeOffloadRuntime(rc, {.swap_bytes = SwapBytes(dims, c, eo.state_generations,
                                                                 placement.in_memory, share),
                                       .tracer = tracer.get(),
                                       .device_kind = opt.device,
                                       .cuda_ordinal = ranks.cuda_ordinal,
                                       .h2d_gbps = opt.h2d_gbps,
                                       .keep_swap_files = eo.state_generations > 1,
                                       .reuse_swap_files = swap_in_checkpoint,
                                       .wrap_backend = opt.wrap_backend}));
  ZINF_ASSIGN_OR_RETURN(Stream * compute, rt->device->CreateStream("compute"));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Backend<float>> backend,
                        MakeBackend(*rt->device, compute, c.zinf.adam_threads,
                                    rt->arena.get()));
  ZINF_ASSIGN_OR_RETURN(auto ex, LayerExecutor::Create(*rt, *backend, compute, dims, eo));

  auto t_init = TrainClock::now();
  if (resume_from) {
    ZINF_RETURN_IF_ERROR(CheckResumable(*resume_from, c, ex->SwapFilePaths(), state_placement,
                                        state_placement == "mixed" ? in_memory_names
                                                                   : std::vector<std::string>{},
                                        repartition));
    if (repartition) {
      ZINF_RETURN_IF_ERROR(RestoreRepartitioned(
          *ex, old_parts, resumed.step, static_cast<uint32_t>(ranks.shard_rank()),
          static_cast<uint32_t>(ranks.shard_world()), PartitionRuleOf(c)));
    } else {
      ZINF_RETURN_IF_ERROR(RestoreOptimizerState(*ex, *resume_from));
    }
    ZINF_RETURN_IF_ERROR(scaler.Restore(resumed.scaler));
    train_data.Seek(resumed.data_position);
    Log().info("train: resumed from {} (step {}, {} applied, {} skipped)", resume_dir,
               resumed.step, resumed.applied, resumed.skipped);
  } else if (!opt.init_path.empty()) {
    ZINF_RETURN_IF_ERROR(LoadWeights(*ex, opt.init_path));
  } else {
    ZINF_RETURN_IF_ERROR(ex->InitWeights(c.zinf.seed));
  }
  std::unique_ptr<Checkpointer> checkpointer;
  if (!ck.dir.empty()) {
    std::optional<uint64_t> resumed_step, resumed_elsewhere;
    if (resume_from &&
        SamePath(std::filesystem::path(resume_dir).parent_path().string(), ck.dir)) {
      resumed_step = resumed.step;
    } else if (resume_from) {
      resumed_elsewhere = resumed.step;
    }
    ZINF_ASSIGN_OR_RETURN(checkpointer,
                          Checkpointer::Create({.root = ck.dir,
                                                .keep = ck.keep,
                                                .config = shared,  // not this rank's paths
                                                .run = {.steps_total = opt.steps,
                                                        .data = AbsolutePath(opt.data_path),
                                                        .val_data = AbsolutePath(opt.val_data_path),
                                                        .data_format = std::string(
                                                            DataFormatName(opt.data_format)),
                                                        .synthetic_bytes = opt.synthetic_bytes,
                                                        .val_fraction = opt.val_fraction,
                                                        .eval_every = opt.eval_every,
                                                        .eval_batches = opt.eval_batches},
                                                // state.bin (12 or 8 bytes a parameter) and
                                                // room for its manifest
                                                .bytes_per_checkpoint =
                                                    ex->StateBytesInMemory() > 0
                                                        ? ex->StateBytesInMemory() + (64 << 10)
                                                        : 0,
                                                .state_on_nvme = ex->StateBytesOnNvme() > 0,
                                                .state_placement = state_placement,
                                                .state_in_memory_units =
                                                    state_placement == "mixed"
                                                        ? in_memory_names
                                                        : std::vector<std::string>{},
                                                .swap_files = ex->SwapFilePaths(),
                                                .stripe_bytes = ex->SwapStripeBytes(),
                                                .resumed_step = resumed_step,
                                                .state_generations = eo.state_generations,
                                                .release_after_first_commit =
                                                    resumed_elsewhere,
                                                .rank = static_cast<uint32_t>(ranks.rank()),
                                                .world = static_cast<uint32_t>(ranks.world()),
                                                .partition = PartitionRuleOf(c),
                                                .chunks = static_cast<uint32_t>(
                                                    ranks.shard_comm ? ranks.shard_world() : 0),
                                                .part_timeout_seconds = static_cast<double>(
                                                    c.zinf.comm.timeout_seconds)}));
    // What Create left of the root's older checkpoints stays untouched until pruned.
    if (resumed_step && ex->StateBytesOnNvme() > 0) {
      ZINF_RETURN_IF_ERROR(
          ProtectKeptCheckpoints(*ex, *resume_from, ex->SwapFilePaths(), ck.keep));
    }
  }
  Log().info("train: {} parameters ({} layers, width {}, {} heads, seq {}, vocab {}), "
              "micro-batch {} x {} accumulation, {} on {}; weights ready in {:.1f} s",
              dims.TotalParams(), dims.L, dims.C, dims.NH, T, dims.V, B, gas, backend->name(),
              rt->device->Describe(), SecondsSince(t_init));

  auto run = std::make_unique<TrainRun>();
  run->shared = std::move(shared);
  run->c = cfg;
  run->ranks = std::move(ranks);
  run->resumed = std::move(resumed);
  run->dims = dims;
  run->B = B;
  run->T = T;
  run->gas = gas;
  run->fp16 = fp16;
  run->train_data.emplace(std::move(train_data));
  run->val_data = std::move(val_data);
  run->schedule.emplace(std::move(schedule));
  run->scaler.emplace(std::move(scaler));
  run->trace_path = trace_path;
  run->tracer = std::move(tracer);
  run->eo = eo;
  run->placement = placement;
  run->rt = std::move(rt);
  run->compute = compute;
  run->backend = std::move(backend);
  run->ex = std::move(ex);
  run->checkpointer = std::move(checkpointer);
  return run;
}

}  // namespace zinf::train
