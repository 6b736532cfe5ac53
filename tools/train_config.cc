#include "tools/train_config.h"

#include <algorithm>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "src/base/log.h"
#include "src/base/units.h"
#include "src/comm/world.h"
#include "src/runtime/offload_runtime.h"
#include "src/model/model_shape.h"
#include "src/train/checkpoint.h"
#include "src/train/model.h"
#include "src/train/default_job.h"
#include "src/train/weights_io.h"

namespace zinf::tools {
namespace {

// The directory holding the running executable (build/ for build/zinf).
std::string ExecutableDir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// The flags on top of the config: each flag given sets its values and records itself as their
// source (a flag that also clears a value derived from it names that value too).
Status ApplyFlags(const CLI::App& cmd, const TrainArgs& a, Config& c, ConfigSources& sources) {
  auto set = [&](const char* flag, std::initializer_list<const char*> paths) {
    if (cmd.count(flag) == 0) return false;
    for (const char* p : paths) sources.Set(p, flag);
    return true;
  };
  if (set("--arch", {"zinf.model.arch"})) c.zinf.model.arch = a.arch;
  if (set("--layers", {"zinf.model.layers"})) c.zinf.model.layers = a.layers;
  if (set("--width", {"zinf.model.width"})) c.zinf.model.width = a.width;
  if (set("--heads", {"zinf.model.heads"})) c.zinf.model.heads = a.heads;
  if (set("--seq-len", {"zinf.model.seq_len"})) c.zinf.model.seq_len = a.seq_len;
  if (set("--vocab", {"zinf.model.vocab"})) c.zinf.model.vocab = a.vocab;
  if (set("--kv-heads", {"zinf.model.kv_heads"})) c.zinf.model.kv_heads = a.kv_heads;
  if (set("--intermediate", {"zinf.model.intermediate"})) {
    c.zinf.model.intermediate = a.intermediate;
  }
  if (set("--batch", {"train_micro_batch_size_per_gpu", "train_batch_size"})) {
    c.train.train_micro_batch_size_per_gpu = a.batch;
    c.train.train_batch_size.reset();
  }
  if (set("--grad-accum", {"gradient_accumulation_steps", "train_batch_size"})) {
    c.train.gradient_accumulation_steps = a.accum;
    c.train.train_batch_size.reset();
  }
  if (set("--lr", {"optimizer.params.lr", "scheduler.params.warmup_max_lr"})) {
    c.optimizer.lr = a.lr;
    c.scheduler.warmup_max_lr.reset();
  }
  if (cmd.count("--schedule") > 0) {
    // Only the type changes; its parameters stay what the config says.
    const SchedulerType t = a.schedule == "warmup"   ? SchedulerType::kWarmupLR
                            : a.schedule == "cosine" ? SchedulerType::kWarmupCosineLR
                            : a.schedule == "decay"  ? SchedulerType::kWarmupDecayLR
                                                     : SchedulerType::kNone;
    c.scheduler.type = t;
    // "constant" is the whole block (written as null).
    sources.Set(t == SchedulerType::kNone ? "scheduler" : "scheduler.type", "--schedule");
  }
  if (set("--clip", {"gradient_clipping"})) c.train.gradient_clipping = a.clip;
  if (set("--overlap-adam", {"zinf.overlap_adam"})) c.zinf.overlap_adam = a.overlap_adam;
  if (set("--comm-timeout", {"zinf.comm.timeout_seconds"})) {
    c.zinf.comm.timeout_seconds = a.comm_timeout;
  }
  if (set("--seed", {"zinf.seed"})) c.zinf.seed = a.seed;
  if (set("--optimizer-state-dtype", {"zinf.optimizer_state_dtype"})) {
    c.zinf.optimizer_state_dtype = a.state_dtype;
  }
  if (set("--optimizer-state-rounding", {"zinf.optimizer_state_rounding"})) {
    c.zinf.optimizer_state_rounding = a.state_rounding;
  }
  if (set("--precision", {"fp16.enabled", "bf16.enabled"})) {
    c.fp16.enabled = a.precision == "fp16";
    c.bf16.enabled = a.precision == "bf16";
  }
  // A byte size, or "auto": chosen at start (the device: 1 GiB emulated, a GPU's free memory
  // less 10%; pinned: what the run wants, within what the machine allows).
  auto budget = [](const std::string& flag, const std::string& v,
                   std::optional<uint64_t>* out) -> Status {
    if (v == "auto") {
      out->reset();
      return Status::Ok();
    }
    auto b = ParseBytes(v);
    if (!b.ok()) {
      return InvalidArgument(flag + ": " + b.status().message() + " (or auto)");
    }
    *out = *b;
    return Status::Ok();
  };
  if (set("--device-budget", {"zinf.budgets.device_bytes"})) {
    ZINF_RETURN_IF_ERROR(budget("--device-budget", a.device_budget, &c.zinf.budgets.device_bytes));
  }
  if (set("--pinned-budget", {"zinf.budgets.pinned_bytes"})) {
    ZINF_RETURN_IF_ERROR(budget("--pinned-budget", a.pinned_budget, &c.zinf.budgets.pinned_bytes));
  }
  if (set("--host-budget", {"zinf.budgets.host_bytes"})) {
    ZINF_RETURN_IF_ERROR(budget("--host-budget", a.host_budget, &c.zinf.budgets.host_bytes));
    c.zinf.budgets.host_bytes_auto = a.host_budget == "auto";
  }
  if (set("--offload", {"zero_optimization.offload_param.device",
                        "zero_optimization.offload_optimizer.device"})) {
    const OffloadDevice d = a.offload == "nvme"  ? OffloadDevice::kNvme
                            : a.offload == "cpu" ? OffloadDevice::kCpu
                                                 : OffloadDevice::kNone;
    c.zero.offload_param.device = d;
    c.zero.offload_optimizer.device = d;
  }
  if (set("--swap-dir", {"zinf.swap_dir"})) c.zinf.swap_dir = a.swap_dir;
  if (set("--checkpoint-dir", {"zinf.checkpoint.dir"})) c.zinf.checkpoint.dir = a.checkpoint_dir;
  if (set("--checkpoint-every", {"zinf.checkpoint.every"})) {
    c.zinf.checkpoint.every = a.checkpoint_every;
  }
  if (set("--keep-checkpoints", {"zinf.checkpoint.keep"})) {
    c.zinf.checkpoint.keep = a.keep_checkpoints;
  }
  if (set("--verify-state-reads", {"zinf.checkpoint.verify_state_reads"})) {
    c.zinf.checkpoint.verify_state_reads = a.verify_state_reads;
  }
  if (set("--resume", {"zinf.checkpoint.resume"})) c.zinf.checkpoint.resume = a.resume;
  return Status::Ok();
}

// --init FILE: the model's sizes the file records replace the defaults; one a file or flag
// gave must agree with the file's.
Status TakeModelFromInit(const std::string& path, Config& c, ConfigSources& sources) {
  ZINF_ASSIGN_OR_RETURN(train::RecordedModel recorded, train::ReadRecordedModel(path));
  struct Size {
    const char* key;       // under zinf.model
    const char* metadata;  // the file's name for it
    std::optional<uint32_t> recorded;
    uint32_t* value;
  };
  ModelConfig& m = c.zinf.model;
  const Size sizes[] = {{"layers", "n_layer", recorded.layers, &m.layers},
                        {"width", "n_embd", recorded.width, &m.width},
                        {"heads", "n_head", recorded.heads, &m.heads},
                        {"seq_len", "block_size", recorded.seq_len, &m.seq_len},
                        {"vocab", "vocab_size", recorded.vocab, &m.vocab}};
  std::vector<std::string> problems;
  for (const Size& s : sizes) {
    if (!s.recorded) continue;
    const std::string json_path = std::string("zinf.model.") + s.key;
    const std::string source = sources.Of(json_path);
    if (source == kDefaultSource) {
      *s.value = *s.recorded;
      sources.Set(json_path, "--init " + path);
    } else if (*s.value != *s.recorded) {
      problems.push_back(fmt::format(
          "{}: {} (from {}) disagrees with --init {}, whose weights record {} {}; expected the "
          "same, or leave {} to take the file's",
          json_path, *s.value, source, path, s.metadata, *s.recorded,
          source.starts_with("--") ? source + " out"
                                   : fmt::format("{} out of {}", json_path, source)));
    }
  }
  if (problems.empty()) return Status::Ok();
  std::string message;
  for (const std::string& p : problems) message += (message.empty() ? "" : "\n") + p;
  return InvalidArgument(message);
}

// --preset NAME: every zinf.model key the config and the flags left at its default takes the
// preset's value; one they gave must agree with it (seq_len of a Llama-family preset is the
// training length, left to the config: its max_position_embeddings bounds nothing).
Status TakeModelFromPreset(const std::string& name, Config& c, ConfigSources& sources) {
  ZINF_ASSIGN_OR_RETURN(const model::ModelShape shape, model::Preset(name));
  const ModelConfig preset = train::ModelConfigOf(shape, c.zinf.model.seq_len);
  // Both sides in their effective values, with the preset's arch for the keys to compare.
  Config given = c, wanted = c;
  given.zinf.model.arch = preset.arch;
  wanted.zinf.model = preset;
  const auto have = given.ToJson()["zinf"]["model"], want = wanted.ToJson()["zinf"]["model"];
  std::vector<std::string> problems, taken;
  for (const auto& [key, value] : want.items()) {
    if (key == "seq_len" && preset.is_llama()) continue;  // not the preset's
    const std::string json_path = "zinf.model." + key;
    const std::string source = sources.Of(json_path);
    if (source == kDefaultSource) {
      taken.push_back(json_path);
    } else if (have.value(key, nlohmann::ordered_json()) != value) {
      problems.push_back(fmt::format(
          "{}: {} (from {}) disagrees with --preset {}, whose {} is {}; expected the same, or "
          "leave {} to take the preset's",
          json_path, have.value(key, nlohmann::ordered_json()).dump(), source, name, key,
          value.dump(),
          source.starts_with("--") ? source + " out"
                                   : fmt::format("{} out of {}", json_path, source)));
    }
  }
  if (!problems.empty()) {
    std::string message;
    for (const std::string& p : problems) message += (message.empty() ? "" : "\n") + p;
    return InvalidArgument(message);
  }
  c.zinf.model = preset;
  for (const std::string& p : taken) sources.Set(p, "--preset " + name);
  return Status::Ok();
}

// With NVMe in use: a swap directory (the flag's, the config's, else build/train-swap next to
// the executable) and each empty nvme_path set to it, with the source of the directory used.
void FillSwapPaths(Config& c, ConfigSources& sources) {
  if (!UsesNvme(c)) return;
  if (c.SwapDir().empty() && c.zinf.stripe_paths.empty()) {
    c.zinf.swap_dir = ExecutableDir() + "/train-swap";
    sources.Set("zinf.swap_dir", kDefaultSource);
  }
  const std::string dir = c.SwapDir();
  const std::string dir_source =
      !c.zinf.swap_dir.empty()                     ? sources.Of("zinf.swap_dir")
      : !c.zero.offload_optimizer.nvme_path.empty() ? sources.Of("zero_optimization.offload_optimizer.nvme_path")
                                                    : sources.Of("zero_optimization.offload_param.nvme_path");
  auto fill = [&](OffloadDevice device, std::string& path, const char* key) {
    if (device != OffloadDevice::kNvme || !path.empty()) return;
    path = dir;
    sources.Set(key, dir_source);
  };
  fill(c.zero.offload_param.device, c.zero.offload_param.nvme_path,
       "zero_optimization.offload_param.nvme_path");
  fill(c.zero.offload_optimizer.device, c.zero.offload_optimizer.nvme_path,
       "zero_optimization.offload_optimizer.nvme_path");
}

// A config file means what DeepSpeed makes of it, also in what it leaves out: no scheduler
// block trains at the optimizer's constant lr, no gradient_clipping does not clip. (The default
// job's warm-up and cosine decay and its clipping at 1.0 stay the defaults of a run without a
// file; a resume keeps its run's.)
void TakeDeepSpeedDefaults(const std::string& file, Config& c, ConfigSources& sources) {
  auto given = [&](std::string_view key) {
    return std::find(c.given_keys.begin(), c.given_keys.end(), key) != c.given_keys.end();
  };
  if (!given("scheduler")) {
    c.scheduler = SchedulerConfig();
    sources.Set("scheduler", file + " (no scheduler block: DeepSpeed's constant lr)");
  }
  if (!given("gradient_clipping")) {
    c.train.gradient_clipping = 0.0;
    sources.Set("gradient_clipping", file + " (absent: DeepSpeed's 0, no clipping)");
  }
  // DeepSpeed trains in fp32 without either block; zinf always computes with a 16-bit working
  // copy (fp32 master weights and moments). Not silent: said here and in --print-config.
  if (!given("bf16.enabled") && !given("fp16.enabled") && c.precision() == Precision::kBf16) {
    const std::string why =
        " (neither bf16 nor fp16 enabled: DeepSpeed would train in fp32, which zinf does not; "
        "a bf16 working copy with fp32 master weights)";
    sources.Set("bf16.enabled", file + why);
    Log().warn("{}: neither bf16 nor fp16 is enabled, which in DeepSpeed means fp32 training; "
               "zinf computes with a bf16 working copy of the weights and keeps fp32 master "
               "weights and moments. Add \"bf16\": {{\"enabled\": true}} to say so and "
               "silence this",
               file);
  }
}

}  // namespace

Result<TrainRunConfig> BuildTrainConfig(const CLI::App& cmd, const TrainArgs& a) {
  Config defaults = train::DefaultJobConfig();
  // Across ranks (zinf launch) the batch keys are read against the world size.
  ZINF_ASSIGN_OR_RETURN(const comm::WorldEnv world, comm::ReadWorldEnv());
  // A resume (--resume, else the file's zinf.checkpoint.resume) starts from the config of the
  // checkpoint's run; the file's keys and the flags go on top, as on the defaults.
  std::string resume = a.resume;
  if (resume.empty() && !a.config.empty()) {
    ZINF_ASSIGN_OR_RETURN(Config file, Config::FromFile(a.config, {.strict = a.strict,
                                                                   .log_warnings = false,
                                                                   .base = &defaults,
                                                                   .validate = false}));
    resume = file.zinf.checkpoint.resume;
  }
  TrainRunConfig r{defaults, {}, std::nullopt};
  std::string resume_source;
  // A resume on another world size (re-partitioning): the checkpoint's global batch, kept when
  // this run's file and flags leave the batch keys alone.
  std::optional<uint64_t> resumed_global_batch;
  if (!resume.empty()) {
    ZINF_ASSIGN_OR_RETURN(ckpt::Manifest m, train::ReadForResume(resume));
    if (m.rank) {  // a part named instead of its checkpoint
      ZINF_RETURN_IF_ERROR(train::CheckResumeWorld(m, static_cast<uint32_t>(world.world)));
    }
    ZINF_ASSIGN_OR_RETURN(defaults, train::ConfigOf(m, defaults));
    if (m.world_size != static_cast<uint64_t>(world.world)) {
      // Its batch keys were read against its own world: the micro-batch stays, the accumulation
      // steps are worked out again below.
      Config then = defaults;
      then.world_size = std::max<uint64_t>(1, m.world_size);
      resumed_global_batch = then.TrainBatchSize();
      defaults.train.train_micro_batch_size_per_gpu = then.MicroBatchSize();
      defaults.train.train_batch_size.reset();
      defaults.train.gradient_accumulation_steps.reset();
    }
    resume_source = "--resume " + m.dir;
    r.sources.SetAll(defaults.given_keys, resume_source);
    ZINF_ASSIGN_OR_RETURN(r.resumed_run, train::RecordedRunOf(m));
    resume = m.dir;
  }
  Config& c = r.config;
  c = defaults;
  if (!a.config.empty()) {
    ZINF_ASSIGN_OR_RETURN(
        c, Config::FromFile(a.config, {.strict = a.strict, .base = &defaults, .validate = false}));
    for (const std::string& k : c.given_keys) {
      if (k.rfind("optimizer", 0) == 0) r.sources.Set("optimizer", a.config);  // read whole
    }
    r.sources.SetAll(c.given_keys, a.config);
    r.sources.SetAll(c.auto_keys, a.config + " (auto)");  // the file asked for zinf's choice
    if (resume.empty()) TakeDeepSpeedDefaults(a.config, c, r.sources);
  }
  ZINF_RETURN_IF_ERROR(ApplyFlags(cmd, a, c, r.sources));
  if (resumed_global_batch && !c.train.train_batch_size && !c.train.gradient_accumulation_steps) {
    const uint64_t per = c.MicroBatchSize() * static_cast<uint64_t>(std::max(1, world.world));
    if (*resumed_global_batch % per == 0) {
      c.train.gradient_accumulation_steps = *resumed_global_batch / per;
      r.sources.Set("gradient_accumulation_steps",
                    resume_source + " (its global batch of " +
                        std::to_string(*resumed_global_batch) + " on " +
                        std::to_string(std::max(1, world.world)) + " rank(s))");
    } else {
      Log().warn("resume on {} rank(s): the checkpoint's global batch of {} is not a multiple of "
                 "{} (micro-batch {} x {} ranks); the accumulation steps stay 1 (give "
                 "--grad-accum or train_batch_size to choose)",
                 world.world, *resumed_global_batch, per, c.MicroBatchSize(), world.world);
    }
  }
  if (!resume.empty()) {
    c.zinf.checkpoint.resume = resume;  // resolved: the checkpoint directory itself
    if (c.zinf.checkpoint.dir.empty()) {
      c.zinf.checkpoint.dir = std::filesystem::path(resume).parent_path().string();
      r.sources.Set("zinf.checkpoint.dir", resume_source);
    }
  }
  if (!a.preset.empty()) ZINF_RETURN_IF_ERROR(TakeModelFromPreset(a.preset, c, r.sources));
  if (!a.init.empty()) ZINF_RETURN_IF_ERROR(TakeModelFromInit(a.init, c, r.sources));
  FillSwapPaths(c, r.sources);
  // WarmupLR/WarmupDecayLR without warmup_max_lr peak at the optimizer's lr: its source.
  if (!c.scheduler.warmup_max_lr) {
    r.sources.Set("scheduler.params.warmup_max_lr", r.sources.Of("optimizer.params.lr"));
  }
  c.world_size = static_cast<uint64_t>(world.world);
  ZINF_RETURN_IF_ERROR(c.Validate());
  return r;
}

Status PrepareSwapDirs(const Config& c) {
  if (!UsesNvme(c)) return Status::Ok();
  for (const std::string& dir : c.zinf.stripe_paths.empty() ? std::vector<std::string>{c.SwapDir()}
                                                            : c.zinf.stripe_paths) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return InvalidArgument(fmt::format("swap directory {}: {}", dir, ec.message()));
  }
  return Status::Ok();
}

}  // namespace zinf::tools
