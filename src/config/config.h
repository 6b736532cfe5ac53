// src/config/config.h — the one JSON configuration of zinf, with DeepSpeed's key names.
//
// Contract:
// - A config is a JSON object. Where a concept is DeepSpeed's, the key and its meaning are
//   DeepSpeed's (`zero_optimization`, `aio`, `optimizer`, `scheduler`, `fp16`, `bf16`, the batch
//   keys), so an existing DeepSpeed config loads with its meaning kept. Everything else lives
//   in the `zinf` block. Each field below names its JSON path and default; a default is
//   DeepSpeed's unless the comment says "zinf:" and why.
// - Config::FromFile / FromString parse, check every value and then Validate(). On failure the
//   Status is InvalidArgument and lists every problem found, one per line, each naming the
//   source (file path), the JSON path (`zero_optimization.offload_param.nvme_path`), the value
//   given and what is allowed. Refused: malformed JSON (reported as file:line:column), a key
//   given twice in one object, a key that is neither zinf's nor DeepSpeed's (with the nearest
//   valid key at that level: `did you mean "offload_param"?`), a wrong JSON type, a value out of
//   range, and the cross-field rules of Validate().
// - DeepSpeed keys that zinf accepts but does not act on (say `zero_optimization.overlap_comm`,
//   `aio.use_gds`, `fp16.auto_cast`) are collected into Config::unimplemented and named together
//   in ONE warning per load. A value that asks for nothing (false, "auto", null, a block with
//   "enabled": false or holding only such values, or the value zinf behaves as anyway) is
//   accepted silently. With `zinf.strict` true or ConfigParseOptions::strict the load fails
//   instead, naming all of them.
// - DeepSpeed's "auto" (written by the Hugging Face integration) is accepted for DeepSpeed keys
//   and means the default below; such keys are listed in Config::auto_keys.
// - Integers also accept integral JSON floats (DeepSpeed configs write 1e9). Byte sizes
//   (`aio.block_size`, `zinf.budgets.*`, `zinf.stripe_bytes`) accept an integer or a string with
//   a binary suffix ("4G", "512M", see src/base/units.h). DeepSpeed's `buffer_size`,
//   `max_in_cpu`, `stage3_*` sizes and `sub_group_size` count elements, not bytes, as in DeepSpeed.
// - The world size comes from the ranks' environment, not the document (Config::world_size, set
//   before Validate): train_batch_size = micro batch × accumulation × world size.
// - A document can be read onto a base config (ConfigParseOptions::base; `zinf train` reads its
//   file onto the default job's config): a value the document gives replaces the base's, a key
//   it leaves out keeps the base's value. Three groups are replaced whole when the document gives
//   any part of them: the three batch keys (they resolve from each other, so a base's micro
//   batch is not combined with a document's train_batch_size), the `scheduler` block (its
//   type decides which parameters apply; the parameters it leaves out take the defaults below),
//   and the `optimizer` block (DeepSpeed hands its params to the optimizer's constructor: what
//   it leaves out takes the defaults below). `"scheduler": null` means no scheduler (a constant
//   learning rate) on any base. `zinf train` goes further for a file it reads onto its default
//   job: a file without a scheduler block or gradient_clipping trains at a constant lr without
//   clipping, as DeepSpeed would (tools/train_config.cc).
//
// Thread-safety: a Config is a plain value; FromFile/FromString/Validate/ToJson are safe to
// call from any thread on distinct objects (loading logs through src/base/log.h).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

enum class OffloadDevice { kNone, kCpu, kNvme };
std::string_view OffloadDeviceName(OffloadDevice device);  // "none", "cpu", "nvme"

// `zero_optimization.offload_param`: where parameters live when not in use.
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;  // "cpu" | "nvme" | "none"
  std::string nvme_path;                        // REQUIRED when device is "nvme": a directory
  // Checked, but without effect (warned unless DeepSpeed's defaults; pin_memory true is what
  // zinf does anyway): DeepSpeed's staging buffers; zinf's is zinf.budgets.pinned_bytes.
  uint64_t buffer_count = 5;                    // NVMe swap buffers (>= 1 when device is nvme)
  uint64_t buffer_size = 100'000'000;           // elements per swap buffer
  uint64_t max_in_cpu = 1'000'000'000;          // elements kept in host memory with NVMe
  bool pin_memory = false;                      // host copies page-locked (zinf's always are)
};

// `zero_optimization.offload_optimizer`: where fp32 master weights and Adam moments live; the
// optimizer step always runs on the CPU when this is not "none".
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;  // REQUIRED when device is "nvme"
  // Checked, but without effect (warned unless DeepSpeed's defaults, or what zinf does: its
  // host copies are always pinned, it always reads ahead and writes behind, zinf.pipeline_depth
  // deep; false asks for nothing zinf must do and is accepted silently).
  uint64_t buffer_count = 4;
  bool pin_memory = false;
  bool pipeline_read = true;
  bool pipeline_write = true;
  // Accepted, not acted on unless neutral: ratio (neutral 1.0), fast_init (neutral false).
};

// `zero_optimization`.
struct ZeroConfig {
  // zinf: absent means 3. One rank works like stage 3 whatever the stage. Across ranks
  // (zinf launch) 0 replicates the state and all-reduces the gradients, 1 partitions the
  // optimizer state, 2 the gradients too and 3 the 16-bit weights too (src/train/ranks.h).
  int stage = 3;
  OffloadParamConfig offload_param;
  OffloadOptimizerConfig offload_optimizer;
  // Checked, but without effect (warned unless DeepSpeed's defaults): zinf prefetches whole
  // units (zinf.prefetch_depth), its device budget bounds what is resident, and it steps the
  // optimizer a unit at a time.
  uint64_t stage3_prefetch_bucket_size = 50'000'000;    // elements fetched ahead, at most
  uint64_t stage3_max_live_parameters = 1'000'000'000;  // elements resident on the device
  uint64_t sub_group_size = 1'000'000'000;              // elements per optimizer-step tile
};

// `aio`: the NVMe engine (maps onto io::EngineOptions; see io/engine.h).
struct AioConfig {
  uint64_t block_size = 1 << 20;      // bytes per kernel request: power of two, 4K..1G
  uint32_t queue_depth = 8;           // requests in flight: 1..4096
  uint32_t intra_op_parallelism = 1;  // alias `thread_count`; posix engine threads: 1..1024
  // zinf: which engine, "auto" | "uring" | "aio" | "posix" (io::ParseEngineKind). DeepSpeed's
  // `io_backend` ("async_io" → "aio", "posix") is read when `engine` is absent.
  std::string engine = "auto";
  // Accepted, not acted on unless neutral: single_submit (false), overlap_events (true),
  // use_gds (false).
};

enum class OptimizerType { kAdam, kAdamW };
std::string_view OptimizerTypeName(OptimizerType type);  // "Adam", "AdamW"

// `optimizer`: {"type": "Adam"|"AdamW" (any case), "params": {...}}. DeepSpeed's CPU Adam
// defaults. As in DeepSpeed, "Adam" decays weights the AdamW way unless adam_w_mode is false.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;  // zinf: absent block means AdamW
  double lr = 1e-3;                            // >= 0
  double beta1 = 0.9;                          // `betas`[0], in [0, 1)
  double beta2 = 0.999;                        // `betas`[1], in [0, 1)
  double eps = 1e-8;                           // > 0
  double weight_decay = 0.0;                   // >= 0
  bool bias_correction = true;
  bool adam_w_mode = true;
  // Accepted, not acted on unless neutral: torch_adam (false), amsgrad (false).

  // True when weight decay is decoupled (AdamW): type AdamW, or Adam with adam_w_mode.
  bool DecoupledWeightDecay() const { return type == OptimizerType::kAdamW || adam_w_mode; }
};

enum class SchedulerType { kNone, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
std::string_view SchedulerTypeName(SchedulerType type);  // "none", "WarmupLR", ...
enum class WarmupType { kLog, kLinear };
std::string_view WarmupTypeName(WarmupType type);  // "log", "linear"

// `scheduler`: {"type": ..., "params": {...}}; absent means a constant learning rate (on a base
// config, the base's schedule; `zinf train` reading a file onto its default job: constant, as
// DeepSpeed), null means a constant learning rate on any base.
// A parameter of another schedule type is refused (DeepSpeed would fail on it too).
struct SchedulerConfig {
  SchedulerType type = SchedulerType::kNone;
  uint64_t warmup_num_steps = 1000;  // >= 1 (all types)
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupLR, WarmupDecayLR:
  double warmup_min_lr = 0.0;           // >= 0
  std::optional<double> warmup_max_lr;  // >= warmup_min_lr; absent: optimizer.params.lr
  // WarmupDecayLR, WarmupCosineLR: 0 (absent) means the trainer's total step count.
  uint64_t total_num_steps = 0;
  // WarmupCosineLR (ratios of optimizer.params.lr):
  double warmup_min_ratio = 0.0;  // in [0, 1]
  double cos_min_ratio = 0.0001;  // in [0, 1]
};

enum class Precision { kBf16, kFp16, kFp32 };
std::string_view PrecisionName(Precision p);  // "bf16", "fp16", "fp32"

// `fp16`: dynamic loss scaling as DeepSpeed does it.
struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;            // 0: dynamic; > 0: static scale
  uint32_t initial_scale_power = 16;  // dynamic scale starts at 2^this: 0..63
  uint32_t loss_scale_window = 1000;  // steps without overflow before the scale doubles: >= 1
  uint32_t hysteresis = 2;            // overflows tolerated before the scale halves: >= 1
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;  // > 0
  // Accepted, not acted on unless neutral: auto_cast (false), fp16_master_weights_and_grads
  // (false), fused_mode (true).
};

// `bf16` (alias `bfloat16`).
struct Bf16Config {
  std::optional<bool> enabled;  // absent: see Config::precision()
  // Accepted, not acted on unless neutral: immediate_grad_update, check_grad_overflow,
  // bf16_master_weights_and_grads, bf16_optimizer_states (all false).
};

// Top-level DeepSpeed training keys. The three batch keys are kept as given; Validate()
// checks them against each other and the accessors on Config resolve the missing ones.
struct TrainConfig {
  std::optional<uint64_t> train_batch_size;                // >= 1
  std::optional<uint64_t> train_micro_batch_size_per_gpu;  // >= 1
  std::optional<uint64_t> gradient_accumulation_steps;     // >= 1
  double gradient_clipping = 0.0;                          // global-norm clip; 0 = off; >= 0
  // zinf: 1 (a progress line per step, issue 5); DeepSpeed documents 10.
  uint64_t steps_per_print = 1;
  bool wall_clock_breakdown = false;  // per-step time breakdown (compute, I/O, Adam, stalls)
};

// `zinf.budgets`: hard byte budgets per tier. Absent or "auto": sized at start from what the
// machine has. A budget given explicitly must be >= 4096 bytes.
struct BudgetsConfig {
  std::optional<uint64_t> device_bytes;
  std::optional<uint64_t> pinned_bytes;
  // Plain host memory for optimizer state (with it on NVMe and --placement auto). Absent: none.
  // "auto" (host_bytes_auto): sized at start from the memory available (AutoHostBytes).
  std::optional<uint64_t> host_bytes;
  bool host_bytes_auto = false;
};

// `zinf.model`: the decoder `zinf train` builds (src/train/model.h). Units: the embedding, each
// layer, the final norm (with an untied head). arch "gpt2" is GPT-2 as nanoGPT has it; "llama"
// is Hugging Face's LlamaForCausalLM (RMSNorm, rotary positions, grouped-query attention,
// SwiGLU, no biases), whose extra keys below take HF's meaning and defaults.
// HF's rope_scaling: "default" (none) or "llama3" (Llama 3.1's rescaling of the frequencies).
struct RopeScalingConfig {
  std::string type = "default";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_position_embeddings = 8192.0;
  bool operator==(const RopeScalingConfig&) const = default;
};

struct ModelConfig {
  std::string arch = "gpt2";  // "gpt2" or "llama"
  uint32_t layers = 4;     // transformer blocks: 1..4096
  uint32_t width = 128;    // model width (n_embd / hidden_size): 1..65536, divisible by heads
  uint32_t heads = 4;      // attention heads: 1..1024
  uint32_t seq_len = 128;  // context length (n_positions): 1..1048576
  uint32_t vocab = 256;    // vocabulary (byte-level by default): 2..16777216
  // llama only (a value given for gpt2 is refused):
  uint32_t kv_heads = 0;      // num_key_value_heads; 0: heads (no grouping)
  uint32_t intermediate = 0;  // intermediate_size; 0: Meta's 8/3·width rounded up to 256
  double norm_eps = 1e-6;     // rms_norm_eps
  double rope_theta = 10000.0;
  bool tie_embeddings = false;  // tie_word_embeddings
  uint32_t head_dim = 0;        // head_dim; 0: width / heads
  bool qkv_bias = false;        // biases on q, k and v (Qwen2; half of Llama's attention_bias)
  bool o_bias = false;          // a bias on o_proj (the other half of attention_bias)
  bool mlp_bias = false;        // mlp_bias: biases on gate, up and down
  RopeScalingConfig rope_scaling;
  uint32_t sliding_window = 0;  // Mistral's; 0: none (a longer seq_len is refused)

  bool is_llama() const { return arch == "llama"; }
  uint32_t KvHeads() const { return kv_heads == 0 ? heads : kv_heads; }
  uint32_t Intermediate() const;  // the MLP's width (GPT-2: 4·width)
  uint32_t HeadDim() const { return head_dim == 0 ? width / heads : head_dim; }

  // Parameter counts of the units (width C, vocab V, seq T). GPT-2: block 12C² + 13C;
  // embedding (V + T)·C; final norm 2C (the head is tied). Llama: layer C·(H·d + 2·KV·d) +
  // H·d·C + 3·C·I + 2C plus the biases asked for; embedding V·C; final C, plus V·C untied.
  uint64_t BlockParams() const;
  uint64_t EmbeddingParams() const;
  uint64_t FinalParams() const;
  uint64_t LargestUnitParams() const;
  uint64_t TotalParams() const;
};

// `zinf.checkpoint`: crash-consistent checkpoints (src/train/checkpoint.h).
// `zinf.comm`: the collectives between ranks (src/comm/communicator.h).
struct CommConfig {
  // A rank that does not answer within this fails every collective waiting for it, naming it.
  uint32_t timeout_seconds = 300;
  // Before each collective the ranks compare what they issued (one small exchange each): a
  // rank issuing something else is named instead of hanging or summing the wrong values.
  bool check_sequence = false;
  // What carries the collectives' data: "gloo" (TCP; any ranks) or "nccl" (one GPU a rank;
  // builds with NCCL). The results are the same bits either way (communicator.h).
  std::string backend = "gloo";
};

struct CheckpointConfig {
  std::string dir;     // root of the run's checkpoints ("step-<10 digits>" under it); "": none
  uint64_t every = 0;  // a checkpoint every N steps; 0: only at the end and on a stop request
  uint32_t keep = 1;   // committed checkpoints kept, 1..1000 (older ones deleted after a newer
                       // one is committed)
  std::string resume;  // a checkpoint directory, or a root (its latest); "": a fresh run
  // Check the xxHash64 of the NVMe-homed optimizer state on every read against what was
  // written: a corrupt byte stops training (costs hashing 12 bytes a parameter twice a step).
  bool verify_state_reads = false;
};

// `zinf`: everything DeepSpeed has no key for.
struct ZinfConfig {
  BudgetsConfig budgets;
  uint32_t prefetch_depth = 4;  // units fetched ahead of the one in use, 0 = on demand: 0..1024
  uint32_t pipeline_depth = 2;  // optimizer read-ahead / write-behind in units, 0 = serial: 0..64
  // Bytes of speculative (prefetch) transfers in flight per link (NVMe read, h2d); demand
  // fetches are never throttled, they are on the critical path. 0 = bounded by the budgets.
  uint64_t max_inflight_bytes = 0;
  std::vector<std::string> stripe_paths;  // swap files striped over these directories
  uint64_t stripe_bytes = 1 << 20;        // stripe unit: a multiple of 4096, 4K..1G
  std::string swap_dir;       // zinf's own swap (gradient spill); default: see Config::SwapDir()
  std::string trace_file;     // Chrome trace-event JSON written here when not empty
  uint32_t adam_threads = 0;  // CPU Adam workers, 0 = one per core: 0..1024
  // Run each unit's Adam as soon as its gradients are final, during the last micro-batch's
  // backward (overlapping the CPU optimizer with device compute). Gradient clipping then uses
  // the coefficient of the PREVIOUS step's global norm (the first step is unclipped); refused
  // with fp16 dynamic loss scaling (an overflow found later could not undo earlier updates).
  bool overlap_adam = false;
  // The embedding engine (zinf.h): a host copy of an NVMe-homed tensor released dirty starts its
  // write home at once, in the background, instead of when its slot is next needed (which then
  // waits for it). zinf train ignores it: its dirty copies are gradients read back in the step.
  bool write_behind = true;
  // Which resident copy goes when a tier's slot class is full: "belady", "lru" or "cost"
  // (offload/eviction_policy.h; the runtime refuses another name, naming this key).
  std::string eviction_policy = "belady";
  uint64_t seed = 1337;       // weight initialisation and the synthetic corpus
  // The Adam moments' storage type: "fp32", or "bf16" (rounded to nearest even at every step:
  // 8 instead of 12 bytes a parameter of optimizer state in memory and on NVMe; an
  // approximation of fp32 Adam, see kernels/cpu/adam.h). The master weights stay fp32.
  std::string optimizer_state_dtype = "fp32";
  // How bf16 moments are rounded: "stochastic" (unbiased, from a hash of zinf.seed, the step,
  // the unit and the element: deterministic) or "nearest" (even). See kernels/cpu/adam.h.
  std::string optimizer_state_rounding = "stochastic";
  ModelConfig model;
  CheckpointConfig checkpoint;
  CommConfig comm;
  // FSDP's names for the partitioning across ranks, as presets over zero_optimization.stage:
  // NO_SHARD (stage 0), SHARD_GRAD_OP (2), FULL_SHARD (3), HYBRID_SHARD (3 within a node,
  // replicated across nodes). Empty: not given. Giving it with a stage that disagrees is
  // refused.
  std::string sharding_strategy;
  bool strict = false;  // refuse unimplemented DeepSpeed keys instead of warning
};

struct Config;

struct ConfigParseOptions {
  bool strict = false;       // as zinf.strict (either one makes the load strict)
  std::string source_name;   // names the source in messages; FromFile uses the path
  bool log_warnings = true;  // log the one "not implemented" warning
  // The config the document is read onto (see the contract above); null: the defaults below.
  // Its unimplemented, auto_keys and given_keys are not carried over.
  const Config* base = nullptr;
  // False: the cross-field rules are left to the caller, who fills more fields (command-line
  // flags, a swap directory) and then calls Validate().
  bool validate = true;
  // False: zinf.model is not what will run (the C engine pages the caller's own tensors), so
  // Validate's rules about it (width by heads, its largest unit in the device budget) are skipped.
  bool model_rules = true;
};

struct Config {
  ZeroConfig zero;            // "zero_optimization"
  AioConfig aio;              // "aio"
  TrainConfig train;          // top-level batch, clipping and printing keys
  OptimizerConfig optimizer;  // "optimizer"
  SchedulerConfig scheduler;  // "scheduler"
  Fp16Config fp16;            // "fp16"
  Bf16Config bf16;            // "bf16"
  ZinfConfig zinf;            // "zinf"

  std::string source = "<defaults>";       // the file path, or the source name given
  // The ranks training together (WORLD_SIZE; 1 for one process). Not a key of the document: the
  // launcher's environment gives it, and the batch keys are read against it.
  uint64_t world_size = 1;
  std::vector<std::string> unimplemented;  // "path=value" of each accepted-but-ignored key
  std::vector<std::string> auto_keys;      // paths whose value was "auto"
  // The paths (as ToJson writes them, aliases under their primary names) of the values the
  // document set, in reading order. Groups are listed whole: "scheduler" for a scheduler block
  // (null included), all three batch keys when one is given, fp16.enabled and bf16.enabled
  // when either is (they decide the precision together).
  std::vector<std::string> given_keys;

  // The defaults, as if loaded from "{}".
  static Config Defaults() { return Config(); }
  static Result<Config> FromFile(const std::string& path, const ConfigParseOptions& options = {});
  static Result<Config> FromString(std::string_view json_text,
                                   const ConfigParseOptions& options = {});

  // Cross-field rules: nvme_path given for an "nvme" device; the batch keys agree
  // (train_batch_size = micro × accumulation × world_size); fp16 and bf16 not both enabled;
  // zinf.overlap_adam not with fp16 dynamic loss scaling;
  // warmup_min_lr <= warmup_max_lr; model width divisible by heads; with NVMe in use the pinned
  // budget holds at least one aio block; the largest unit's 16-bit parameters fit the device
  // budget; stripe_paths not repeated. Call again after changing fields (command-line overrides).
  // model_rules false skips the two rules about zinf.model (see ConfigParseOptions).
  Status Validate(bool model_rules = true) const;

  // Effective values.
  uint64_t MicroBatchSize() const;             // given, or train / accumulation, or 1
  uint64_t GradientAccumulationSteps() const;  // given, or train / micro, or 1
  uint64_t TrainBatchSize() const;             // micro × accumulation × world size
  // bf16 unless fp16 is enabled; fp32 when neither is enabled and bf16.enabled is explicitly
  // false (DeepSpeed trains in fp32 when both are off; zinf's default is bf16, issue 5).
  Precision precision() const;
  double WarmupMaxLr() const;  // scheduler.warmup_max_lr, or optimizer.lr
  // zero_optimization.stage, or the stage zinf.sharding_strategy names.
  int Stage() const;
  // zinf.swap_dir, else offload_optimizer.nvme_path, else offload_param.nvme_path, else "".
  std::string SwapDir() const;

  // The effective config in the same layout (DeepSpeed keys plus the zinf block, in that
  // order), without the unimplemented keys; "scheduler" is null when there is none.
  // FromString(ToJson().dump()) gives an equal config, on any base.
  // Include <nlohmann/json.hpp> to use the result.
  nlohmann::ordered_json ToJson() const;
};

}  // namespace zinf
