// The schema: which keys exist at each level, their types, ranges and defaults, and which
// DeepSpeed keys are accepted without being acted on. Every getter of a Reader declares its
// key, so the keys a level knows are exactly those its Read* function asks for; whatever else
// the object holds is an unknown key (a typo).
#include "src/config/config_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "src/config/json_reader.h"
#include "src/config/key_match.h"

namespace zinf::config_internal {
namespace {

using nlohmann::json;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kU32Max = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMinIoBlockBytes = 4096;  // O_DIRECT granularity
constexpr uint64_t kMaxIoBlockBytes = 1ull << 30;
constexpr uint64_t kMinBudgetBytes = 4096;
constexpr uint64_t kMaxBatch = 1ull << 40;

// --- zero_optimization --------------------------------------------------------------------

const Choices<OffloadDevice> kDevices = {
    {"none", OffloadDevice::kNone}, {"cpu", OffloadDevice::kCpu}, {"nvme", OffloadDevice::kNvme}};

// DeepSpeed sizes its own staging buffers with buffer_count, buffer_size and max_in_cpu, and
// pins them with pin_memory; zinf stages through the pinned budget (zinf.budgets.pinned_bytes),
// always pinned, and reads ahead and writes behind always. Their values are checked, and any but
// DeepSpeed's defaults (or what zinf does anyway) is named in the one "no effect" warning.
void ReadOffloadParam(Reader r, OffloadParamConfig* c) {
  r.Enum("device", &c->device, kDevices, kAuto);
  r.String("nvme_path", &c->nvme_path, "a directory path", kNull);
  r.Uint("buffer_count", &c->buffer_count, 0, kU64Max, kAuto);
  r.Uint("buffer_size", &c->buffer_size, 0, kU64Max, kAuto);
  r.Uint("max_in_cpu", &c->max_in_cpu, 0, kU64Max, kAuto);
  r.Bool("pin_memory", &c->pin_memory, kAuto);
  r.Unimplemented("buffer_count", {5});
  r.Unimplemented("buffer_size", {100'000'000});
  r.Unimplemented("max_in_cpu", {1'000'000'000});
  r.Unimplemented("pin_memory", {true});
  r.Finish();
}

void ReadOffloadOptimizer(Reader r, OffloadOptimizerConfig* c) {
  r.Enum("device", &c->device, kDevices, kAuto);
  r.String("nvme_path", &c->nvme_path, "a directory path", kNull);
  r.Uint("buffer_count", &c->buffer_count, 0, kU64Max, kAuto);
  r.Bool("pin_memory", &c->pin_memory, kAuto);
  r.Bool("pipeline_read", &c->pipeline_read, kAuto);
  r.Bool("pipeline_write", &c->pipeline_write, kAuto);
  r.Unimplemented("buffer_count", {4});
  r.Unimplemented("pin_memory", {true});
  r.Unimplemented("pipeline_read", {true});
  r.Unimplemented("pipeline_write", {true});
  r.Unimplemented("ratio", {1.0, 1});
  r.Unimplemented("fast_init");
  r.Unimplemented("super_offload");
  r.Unimplemented("convert_grad_on_cpu", {true});
  r.Unimplemented("cpuadam_cores_perc", {0.8});
  r.Finish();
}

void ReadZero(Reader r, ZeroConfig* c, ReadReport* report) {
  uint64_t stage = static_cast<uint64_t>(c->stage);
  r.Uint("stage", &stage, 0, 3, kAuto);
  c->stage = static_cast<int>(stage);
  // One rank works like stage 3 whatever the stage; across ranks, see src/train/ranks.h.
  ReadOffloadParam(r.Object("offload_param", kNull), &c->offload_param);
  ReadOffloadOptimizer(r.Object("offload_optimizer", kNull), &c->offload_optimizer);
  r.Uint(r.Alias("stage3_prefetch_bucket_size", "prefetch_bucket_size"),
         &c->stage3_prefetch_bucket_size, 0, kU64Max, kAuto);
  r.Uint(r.Alias("stage3_max_live_parameters", "max_live_parameters"),
         &c->stage3_max_live_parameters, 1, kU64Max, kAuto);
  r.Uint("sub_group_size", &c->sub_group_size, 1, kU64Max, kAuto);
  // zinf prefetches whole units (zinf.prefetch_depth), bounds the device tier by its budget and
  // steps the optimizer a unit at a time: these are checked, and named in the "no effect"
  // warning unless DeepSpeed's defaults.
  for (const char* k : {"stage3_prefetch_bucket_size", "prefetch_bucket_size"}) {
    r.Unimplemented(k, {50'000'000});
  }
  for (const char* k : {"stage3_max_live_parameters", "max_live_parameters"}) {
    r.Unimplemented(k, {1'000'000'000});
  }
  r.Unimplemented("sub_group_size", {1'000'000'000});
  // Collectives, bucketing and partitioning across ranks (zinf has its own), checkpoint and
  // module-hook options of DeepSpeed's PyTorch engine.
  r.UnimplementedKeys({"contiguous_gradients",
                       "overlap_comm",
                       "reduce_scatter",
                       "reduce_bucket_size",
                       "use_multi_rank_bucket_allreduce",
                       "allgather_partitions",
                       "allgather_bucket_size",
                       "load_from_fp32_weights",
                       "elastic_checkpoint",
                       "zenflow",
                       "cpu_offload",
                       "cpu_offload_param",
                       "cpu_offload_use_pin_memory",
                       "stage3_param_persistence_threshold",
                       "param_persistence_threshold",
                       "stage3_model_persistence_threshold",
                       "model_persistence_threshold",
                       "stage3_max_reuse_distance",
                       "max_reuse_distance",
                       "stage3_gather_16bit_weights_on_model_save",
                       "gather_16bit_weights_on_model_save",
                       "stage3_gather_fp16_weights_on_model_save",
                       "stage3_use_all_reduce_for_fetch_params",
                       "stage3_allgather_sequential",
                       "legacy_stage1",
                       "round_robin_gradients",
                       "zero_quantized_weights",
                       "zero_quantized_nontrainable_weights",
                       "zero_quantized_gradients",
                       "zeropp_loco_param",
                       "mics_hierarchical_params_gather",
                       "pipeline_loading_checkpoint",
                       "log_trace_cache_warnings",
                       "enable_sanity_checks",
                       "save_muon_momentum_buffer_in_memory",
                       "leaf_module"});
  r.Unimplemented("stage3_module_granularity_threshold", {0});
  r.Unimplemented("stage3_partition_stream_chunk_size", {0});
  r.Unimplemented("zero_hpz_partition_size", {1});
  r.Unimplemented("mics_shard_size", {-1});
  r.Unimplemented("ignore_unused_parameters", {true});
  r.Unimplemented("memory_efficient_linear", {true});
  r.Unimplemented("override_module_apply", {true});
  r.Finish();
}

// --- aio ----------------------------------------------------------------------------------

void ReadAio(Reader r, AioConfig* c) {
  r.Bytes("block_size", &c->block_size, kMinIoBlockBytes, kMaxIoBlockBytes, Align::kPowerOfTwo,
          kAuto);
  r.Uint32("queue_depth", &c->queue_depth, 1, 4096, kAuto);
  r.Uint32(r.Alias("intra_op_parallelism", "thread_count"), &c->intra_op_parallelism, 1, 1024,
           kAuto);
  const Choices<std::string_view> engines = {
      {"auto", "auto"}, {"uring", "uring"}, {"aio", "aio"}, {"posix", "posix"}};
  std::string_view engine = c->engine;
  r.Enum("engine", &engine, engines);
  // DeepSpeed's io_backend names its libaio engine "async_io"; zinf's `engine` wins if both.
  const Choices<std::string_view> backends = {{"async_io", "aio"},
                                              {"aio", "aio"},
                                              {"async", "aio"},
                                              {"deepnvme", "aio"},
                                              {"posix", "posix"}};
  std::string_view backend = "";
  r.GivenAs("io_backend", "engine");
  r.Enum("io_backend", &backend, backends, kAuto);
  if (!backend.empty() && !r.Has("engine")) engine = backend;
  c->engine = std::string(engine);
  r.Unimplemented("single_submit");
  r.Unimplemented("overlap_events", {true});
  r.Unimplemented("use_gds");
  r.Finish();
}

// --- optimizer, scheduler, precision --------------------------------------------------------

void ReadOptimizer(Reader r, OptimizerConfig* c) {
  const Choices<OptimizerType> types = {{"Adam", OptimizerType::kAdam},
                                        {"AdamW", OptimizerType::kAdamW}};
  r.Enum("type", &c->type, types, kPlain,
         {"Adagrad", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Lion", "Muon",
          "MuonWithAuxAdam", "SGD"});
  if (r.present() && !r.Has("type"))
    r.Error("type", "missing; expected one of \"Adam\", \"AdamW\"");
  r.Unimplemented("legacy_fusion");
  Reader p = r.Object("params");
  p.Double("lr", &c->lr, AtLeast(0), kAuto);
  p.DoublePair("betas", &c->beta1, &c->beta2, HalfOpen(0, 1), kAuto);
  p.Double("eps", &c->eps, Above(0), kAuto);
  p.Double("weight_decay", &c->weight_decay, AtLeast(0), kAuto);
  p.Bool("bias_correction", &c->bias_correction, kAuto);
  p.Bool("adam_w_mode", &c->adam_w_mode, kAuto);
  p.Unimplemented("torch_adam");
  p.Unimplemented("amsgrad");
  p.Refuse("max_grad_norm", "not an optimizer parameter; use the top-level gradient_clipping");
  p.Finish();
  r.Finish();
}

void ReadScheduler(Reader r, SchedulerConfig* c) {
  const Choices<SchedulerType> types = {{"WarmupLR", SchedulerType::kWarmupLR},
                                        {"WarmupDecayLR", SchedulerType::kWarmupDecayLR},
                                        {"WarmupCosineLR", SchedulerType::kWarmupCosineLR}};
  SchedulerType type = c->type;
  r.Enum("type", &type, types, kPlain, {"LRRangeTest", "OneCycle"});
  const bool missing_type = r.present() && !r.Has("type");
  if (missing_type) {
    r.Error("type", "missing; expected one of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\"");
  }
  c->type = type;
  Reader p = r.Object("params");
  p.Uint("warmup_num_steps", &c->warmup_num_steps, 1, kU64Max, kAuto);
  const Choices<WarmupType> warmups = {{"log", WarmupType::kLog}, {"linear", WarmupType::kLinear}};
  p.Enum("warmup_type", &c->warmup_type, warmups, kAuto);
  p.Double("warmup_min_lr", &c->warmup_min_lr, AtLeast(0), kAuto);
  p.OptDouble("warmup_max_lr", &c->warmup_max_lr, AtLeast(0), kAuto);
  p.Uint("total_num_steps", &c->total_num_steps, 1, kU64Max, kAuto);
  p.Double("warmup_min_ratio", &c->warmup_min_ratio, Closed(0, 1), kAuto);
  p.Double("cos_min_ratio", &c->cos_min_ratio, Closed(0, 1), kAuto);
  p.Unimplemented("last_batch_iteration", {-1});
  // Each schedule takes only its own parameters (DeepSpeed would fail on the others).
  const std::string type_name(SchedulerTypeName(type));
  auto only_for = [&](std::string_view key, std::initializer_list<SchedulerType> allowed,
                      std::string_view names) {
    if (type == SchedulerType::kNone || !p.Has(key)) return;
    if (std::find(allowed.begin(), allowed.end(), type) != allowed.end()) return;
    p.Error(key, fmt::format("applies to {} only, and scheduler.type is \"{}\"", names, type_name));
  };
  only_for("warmup_min_lr", {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR},
           "WarmupLR and WarmupDecayLR");
  only_for("warmup_max_lr", {SchedulerType::kWarmupLR, SchedulerType::kWarmupDecayLR},
           "WarmupLR and WarmupDecayLR");
  only_for("total_num_steps", {SchedulerType::kWarmupDecayLR, SchedulerType::kWarmupCosineLR},
           "WarmupDecayLR and WarmupCosineLR");
  only_for("warmup_min_ratio", {SchedulerType::kWarmupCosineLR}, "WarmupCosineLR");
  only_for("cos_min_ratio", {SchedulerType::kWarmupCosineLR}, "WarmupCosineLR");
  p.Finish();
  r.Finish();
}

void ReadFp16(Reader r, Fp16Config* c) {
  r.Bool("enabled", &c->enabled, kAuto);
  r.Double("loss_scale", &c->loss_scale, AtLeast(0), kAuto);
  r.Uint32("initial_scale_power", &c->initial_scale_power, 0, 63, kAuto);
  r.Uint32("loss_scale_window", &c->loss_scale_window, 1, kU32Max, kAuto);
  r.Uint32("hysteresis", &c->hysteresis, 1, kU32Max, kAuto);
  r.Bool("consecutive_hysteresis", &c->consecutive_hysteresis, kAuto);
  r.Double("min_loss_scale", &c->min_loss_scale, Above(0), kAuto);
  r.UnimplementedKeys({"auto_cast", "fp16_master_weights_and_grads"});
  r.Unimplemented("fused_mode", {true});
  r.Finish();
}

void ReadBf16(Reader r, Bf16Config* c) {
  r.OptBool("enabled", &c->enabled, kAuto);
  r.UnimplementedKeys({"immediate_grad_update", "check_grad_overflow",
                       "bf16_master_weights_and_grads", "bf16_optimizer_states"});
  r.Finish();
}

// --- zinf ---------------------------------------------------------------------------------

// HF's rope_scaling: {"rope_type" (or "type"): "llama3", "factor", "low_freq_factor",
// "high_freq_factor", "original_max_position_embeddings"}; null or absent: none.
void ReadRopeScaling(Reader r, RopeScalingConfig* c) {
  const Choices<std::string_view> types = {{"default", "default"}, {"llama3", "llama3"}};
  std::string_view type = c->type;
  r.Enum(r.Alias("rope_type", "type"), &type, types, kPlain,
         {"linear", "dynamic", "yarn", "longrope", "su", "mrope"});
  c->type = std::string(type);
  r.Double("factor", &c->factor, Above(0));
  r.Double("low_freq_factor", &c->low_freq_factor, Above(0));
  r.Double("high_freq_factor", &c->high_freq_factor, Above(0));
  r.Double("original_max_position_embeddings", &c->original_max_position_embeddings, Above(0));
  r.Finish();
}

void ReadModel(Reader r, ModelConfig* c) {
  const Choices<std::string_view> archs = {{"gpt2", "gpt2"}, {"llama", "llama"}};
  std::string_view arch = c->arch;
  r.Enum("arch", &arch, archs);
  c->arch = std::string(arch);
  r.Uint32(r.Alias("layers", "n_layer"), &c->layers, 1, 4096);
  r.Uint32(r.Alias("width", "n_embd"), &c->width, 1, 65536);
  r.Uint32(r.Alias("heads", "n_head"), &c->heads, 1, 1024);
  r.Uint32(r.Alias("seq_len", "n_positions"), &c->seq_len, 1, 1 << 20);
  r.Uint32(r.Alias("vocab", "vocab_size"), &c->vocab, 2, 1 << 24);
  // The Llama family's own keys. GPT-2 has no such choice (its head is tied, its MLP 4·width
  // wide, its attention ungrouped, unbiased by choice, unrotated), so any of them given with it
  // is refused.
  const std::string_view kv = r.Alias("kv_heads", "num_key_value_heads");
  const std::string_view inter = r.Alias("intermediate", "intermediate_size");
  const std::string_view eps = r.Alias("norm_eps", "rms_norm_eps");
  const std::string_view tie = r.Alias("tie_embeddings", "tie_word_embeddings");
  r.Uint32(kv, &c->kv_heads, 0, 1024);
  r.Uint32(inter, &c->intermediate, 0, 1u << 20);
  r.Double(eps, &c->norm_eps, Above(0));
  r.Double("rope_theta", &c->rope_theta, Above(0));
  r.Bool(tie, &c->tie_embeddings);
  r.Uint32("head_dim", &c->head_dim, 0, 1u << 16);
  r.Bool("qkv_bias", &c->qkv_bias);
  r.Bool("o_bias", &c->o_bias);
  r.Bool("mlp_bias", &c->mlp_bias);
  r.Uint32("sliding_window", &c->sliding_window, 0, 1u << 24);
  ReadRopeScaling(r.Object("rope_scaling", kNull), &c->rope_scaling);
  if (!c->is_llama()) {
    for (std::string_view key :
         {kv, inter, eps, std::string_view("rope_theta"), tie, std::string_view("head_dim"),
          std::string_view("qkv_bias"), std::string_view("o_bias"), std::string_view("mlp_bias"),
          std::string_view("sliding_window"), std::string_view("rope_scaling")}) {
      if (r.Has(key)) {
        r.Error(key, "is a key of arch \"llama\"; expected it absent with arch \"gpt2\" "
                     "(GPT-2's head is tied, its MLP 4·width wide, its heads ungrouped)");
      }
    }
  }
  r.Finish();
}

void ReadComm(Reader r, CommConfig* c) {
  r.Uint32("timeout_seconds", &c->timeout_seconds, 1, 86400);
  r.Bool("check_sequence", &c->check_sequence);
  const Choices<std::string_view> backends = {{"gloo", "gloo"}, {"nccl", "nccl"}};
  std::string_view backend = c->backend;
  r.Enum("backend", &backend, backends);
  c->backend = std::string(backend);
  r.Finish();
}

void ReadCheckpoint(Reader r, CheckpointConfig* c) {
  r.String("dir", &c->dir, "a directory path");
  r.Uint("every", &c->every, 0, kU64Max);
  r.Uint32("keep", &c->keep, 1, 1000);
  r.String("resume", &c->resume, "a checkpoint directory or a directory of checkpoints");
  r.Bool("verify_state_reads", &c->verify_state_reads);
  r.Finish();
}

void ReadZinf(Reader r, ZinfConfig* c) {
  Reader b = r.Object("budgets");
  b.OptBytes("device_bytes", &c->budgets.device_bytes, kMinBudgetBytes, kU64Max, Align::kAny,
             kAuto);
  b.OptBytes("pinned_bytes", &c->budgets.pinned_bytes, kMinBudgetBytes, kU64Max, Align::kAny,
             kAuto);
  b.OptBytes("host_bytes", &c->budgets.host_bytes, kMinBudgetBytes, kU64Max, Align::kAny, kAuto);
  b.Finish();
  r.Uint32("prefetch_depth", &c->prefetch_depth, 0, 1024);
  r.Uint32("pipeline_depth", &c->pipeline_depth, 0, 64);
  r.Bytes("max_inflight_bytes", &c->max_inflight_bytes, 0, kU64Max, Align::kAny);
  r.StringList("stripe_paths", &c->stripe_paths, "directories");
  r.Bytes("stripe_bytes", &c->stripe_bytes, kMinIoBlockBytes, kMaxIoBlockBytes, Align::kPage);
  r.String("swap_dir", &c->swap_dir, "a directory path");
  r.String("trace_file", &c->trace_file, "a file path");
  r.Uint32("adam_threads", &c->adam_threads, 0, 1024);
  r.Bool("overlap_adam", &c->overlap_adam);
  r.Bool("write_behind", &c->write_behind);
  r.String("eviction_policy", &c->eviction_policy,
           "an eviction policy: \"belady\", \"lru\" or \"cost\" (offload/eviction_policies.inc)");
  r.Uint("seed", &c->seed, 0, kU64Max);
  const Choices<std::string_view> state_dtypes = {{"fp32", "fp32"}, {"bf16", "bf16"}};
  std::string_view state_dtype = c->optimizer_state_dtype;
  r.Enum("optimizer_state_dtype", &state_dtype, state_dtypes);
  c->optimizer_state_dtype = std::string(state_dtype);
  const Choices<std::string_view> roundings = {{"stochastic", "stochastic"},
                                               {"nearest", "nearest"}};
  std::string_view rounding = c->optimizer_state_rounding;
  r.Enum("optimizer_state_rounding", &rounding, roundings);
  c->optimizer_state_rounding = std::string(rounding);
  ReadModel(r.Object("model"), &c->model);
  ReadCheckpoint(r.Object("checkpoint"), &c->checkpoint);
  ReadComm(r.Object("comm"), &c->comm);
  r.String("sharding_strategy", &c->sharding_strategy,
           "NO_SHARD, SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD");
  r.Bool("strict", &c->strict);
  r.Finish();
}

// --- top level ----------------------------------------------------------------------------

// Whether `report` holds `path` as given.
bool Given(const ReadReport& report, std::string_view path) {
  return std::find(report.given.begin(), report.given.end(), path) != report.given.end();
}

void ReadTop(Reader& r, Config* c, ReadReport* report) {
  ReadZero(r.Object("zero_optimization"), &c->zero, report);
  ReadAio(r.Object("aio"), &c->aio);
  // The optimizer block is read whole, as DeepSpeed hands its params to the optimizer: given,
  // it replaces the base's optimizer, the parameters it leaves out taking their defaults.
  if (r.Has("optimizer")) c->optimizer = OptimizerConfig();
  ReadOptimizer(r.Object("optimizer", kNull), &c->optimizer);
  // The scheduler block is one choice: given (null included: no scheduler), it replaces the
  // base's schedule, its parameters starting from their defaults.
  if (r.Has("scheduler")) {
    c->scheduler = SchedulerConfig();
    r.MarkGiven("scheduler");
  }
  ReadScheduler(r.Object("scheduler", kNull), &c->scheduler);
  ReadFp16(r.Object("fp16"), &c->fp16);
  ReadBf16(r.Object(r.Alias("bf16", "bfloat16")), &c->bf16);
  // The precision is decided by both blocks' "enabled" together.
  if (Given(*report, "fp16.enabled") != Given(*report, "bf16.enabled")) {
    report->given.push_back(Given(*report, "fp16.enabled") ? "bf16.enabled" : "fp16.enabled");
  }
  // The batch keys resolve from each other (Config::MicroBatchSize...): any of them given
  // replaces all three, so a base's micro batch never mixes with the document's total.
  TrainConfig& t = c->train;
  TrainConfig batch;
  r.OptUint("train_batch_size", &batch.train_batch_size, 1, kMaxBatch, kAuto | kNull);
  r.OptUint("train_micro_batch_size_per_gpu", &batch.train_micro_batch_size_per_gpu, 1, kMaxBatch,
            kAuto | kNull);
  r.OptUint("gradient_accumulation_steps", &batch.gradient_accumulation_steps, 1, kMaxBatch,
            kAuto | kNull);
  if (batch.train_batch_size || batch.train_micro_batch_size_per_gpu ||
      batch.gradient_accumulation_steps) {
    t.train_batch_size = batch.train_batch_size;
    t.train_micro_batch_size_per_gpu = batch.train_micro_batch_size_per_gpu;
    t.gradient_accumulation_steps = batch.gradient_accumulation_steps;
    for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu",
                          "gradient_accumulation_steps"}) {
      if (!Given(*report, k)) report->given.push_back(k);
    }
  }
  r.Double("gradient_clipping", &t.gradient_clipping, AtLeast(0), kAuto);
  r.Uint("steps_per_print", &t.steps_per_print, 1, kU64Max, kAuto | kNull);
  r.Bool("wall_clock_breakdown", &t.wall_clock_breakdown, kAuto);
  ReadZinf(r.Object("zinf"), &c->zinf);
  // DeepSpeed features outside what zinf does (monitoring, compression, pipeline and tensor
  // parallelism, elasticity, ...): accepted as whole blocks, named in the warning.
  r.UnimplementedKeys({"amp",
                       "prescale_gradients",
                       "sparse_gradients",
                       "activation_checkpointing",
                       "flops_profiler",
                       "tensorboard",
                       "wandb",
                       "csv_monitor",
                       "comet",
                       "comms_logger",
                       "monitor_config",
                       "autotuning",
                       "elasticity",
                       "data_efficiency",
                       "curriculum_learning",
                       "checkpoint",
                       "data_types",
                       "communication_data_type",
                       "seq_parallel_communication_data_type",
                       "memory_breakdown",
                       "sparse_attention",
                       "pipeline",
                       "compression_training",
                       "nebula",
                       "eigenvalue",
                       "progressive_layer_drop",
                       "quantize_training",
                       "weight_quantization",
                       "hybrid_engine",
                       "torch_autocast",
                       "compile",
                       "zero_allow_comm_data_type_fp32",
                       "disable_allgather",
                       "dump_state",
                       "graph_harvesting",
                       "dataloader_drop_last",
                       "vocabulary_size",
                       "timers",
                       "use_data_before_expert_parallelism",
                       "tensor_parallel",
                       "sequence_parallel_size",
                       "load_universal_checkpoint",
                       "use_node_local_storage"});
  r.Unimplemented("gradient_predivide_factor", {1.0, 1});
  r.Unimplemented("zero_allow_untested_optimizer", {true});
  r.Unimplemented("zero_force_ds_cpu_optimizer", {true});
  r.Finish();
}

// Unknown keys with no near neighbour at their level: say where that name is valid, if
// anywhere. Done after the whole schema is visited, when known_paths is complete.
std::string ResolveUnknown(const UnknownKey& u, const std::vector<std::string>& known) {
  if (u.key.empty()) return u.message;
  const std::string& head = u.message;
  const std::string& key = u.key;
  std::set<std::string> elsewhere;
  for (const auto& p : known) {
    const size_t dot = p.rfind('.');
    const std::string last = dot == std::string::npos ? p : p.substr(dot + 1);
    if (EditDistance(last, key) <= (key.size() >= 6 ? 1u : 0u)) elsewhere.insert(p);
  }
  if (elsewhere.empty()) {
    return head + "; if it is a newer DeepSpeed key, remove it (zinf does not know it)";
  }
  std::string where;
  for (const auto& p : elsewhere) where += (where.empty() ? "" : ", ") + p;
  return fmt::format("{}; it belongs at {}", head, where);
}

}  // namespace

void ReadConfig(const json& doc, Config* config, ReadReport* report) {
  std::vector<std::string> known_paths;
  std::vector<UnknownKey> unknown;
  Reader top(report, &doc, "", &known_paths, &unknown);
  ReadTop(top, config, report);
  for (const auto& u : unknown) report->errors.push_back(ResolveUnknown(u, known_paths));
}

std::vector<KeyInfo> DescribeConfig(const Config& base) {
  Config config = base;
  std::vector<KeyInfo> catalog;
  ReadReport report;
  report.catalog = &catalog;
  ReadConfig(json::object(), &config, &report);
  std::vector<KeyInfo> keys;
  for (const KeyInfo& k : catalog) {
    if (k.kind != KeyInfo::Kind::kAlias) keys.push_back(k);
  }
  for (const KeyInfo& a : catalog) {
    if (a.kind != KeyInfo::Kind::kAlias) continue;
    for (KeyInfo& k : keys) {
      if (k.path == a.path) k.aliases.push_back(a.note);
    }
  }
  return keys;
}

}  // namespace zinf::config_internal
