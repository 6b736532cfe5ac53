#include "src/config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "src/base/json_strict.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/config/config_schema.h"

namespace zinf {
namespace {

using nlohmann::json;

nlohmann::ordered_json RopeScalingJson(const RopeScalingConfig& r);

// zinf.model: GPT-2's keys, and with arch "llama" the family's own (effective values).
nlohmann::ordered_json ModelJson(const ModelConfig& m) {
  nlohmann::ordered_json j = {{"arch", m.arch},   {"layers", m.layers},   {"width", m.width},
                              {"heads", m.heads}, {"seq_len", m.seq_len}, {"vocab", m.vocab}};
  if (!m.is_llama()) return j;
  j["kv_heads"] = m.KvHeads();
  j["intermediate"] = m.Intermediate();
  j["norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["tie_embeddings"] = m.tie_embeddings;
  j["head_dim"] = m.HeadDim();
  j["qkv_bias"] = m.qkv_bias;
  j["o_bias"] = m.o_bias;
  j["mlp_bias"] = m.mlp_bias;
  j["rope_scaling"] = RopeScalingJson(m.rope_scaling);
  j["sliding_window"] = m.sliding_window;
  return j;
}

// HF's rope_scaling object; null for none.
nlohmann::ordered_json RopeScalingJson(const RopeScalingConfig& r) {
  if (r.type == "default") return nullptr;
  return {{"rope_type", r.type},
          {"factor", r.factor},
          {"low_freq_factor", r.low_freq_factor},
          {"high_freq_factor", r.high_freq_factor},
          {"original_max_position_embeddings", r.original_max_position_embeddings}};
}

// "src: line" for each line, one per line of the message.
Status Problems(const std::string& source, const std::vector<std::string>& lines) {
  std::string message;
  for (const auto& line : lines) {
    if (!message.empty()) message += '\n';
    message += fmt::format("{}: {}", source, line);
  }
  return InvalidArgument(std::move(message));
}

// 1-based line and column of the byte nlohmann reports (the last one it read, 1-based).
std::pair<size_t, size_t> LineColumn(std::string_view text, size_t byte) {
  const size_t pos = std::min(byte == 0 ? 0 : byte - 1, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return {line, pos - line_start + 1};
}

// nlohmann's what() without its "[json.exception...] parse error at line 1, column 2: " head.
std::string ParseErrorDetail(const char* what) {
  std::string s = what;
  size_t at = s.find("parse error");
  if (at != std::string::npos) {
    size_t colon = s.find(": ", at);
    if (colon != std::string::npos) return s.substr(colon + 2);
  }
  return s;
}

std::string Quoted(const std::string& s) { return json(s).dump(); }

// Offload homes, FSDP's preset names, the batch keys, precision and the schedule.
void ValidateTraining(const Config& c, std::vector<std::string>& out) {
  auto check_offload = [&](std::string_view block, OffloadDevice device,
                           const std::string& nvme_path, uint64_t buffer_count) {
    if (device != OffloadDevice::kNvme) return;
    if (nvme_path.empty()) {
      out.push_back(fmt::format(
          "zero_optimization.{0}.nvme_path: missing; expected a directory on the NVMe drive, "
          "because zero_optimization.{0}.device is \"nvme\"",
          block));
    }
    if (buffer_count == 0) {
      out.push_back(
          fmt::format("zero_optimization.{0}.buffer_count: 0 is impossible with device \"nvme\"; "
                      "expected an integer >= 1",
                      block));
    }
  };
  check_offload("offload_param", c.zero.offload_param.device, c.zero.offload_param.nvme_path,
                c.zero.offload_param.buffer_count);
  check_offload("offload_optimizer", c.zero.offload_optimizer.device,
                c.zero.offload_optimizer.nvme_path, c.zero.offload_optimizer.buffer_count);
  if (c.zero.offload_param.device == OffloadDevice::kNvme &&
      c.zero.offload_param.buffer_size == 0) {
    out.push_back(
        "zero_optimization.offload_param.buffer_size: 0 is impossible with device "
        "\"nvme\"; expected an integer >= 1 (elements)");
  }

  // FSDP's preset names, and a stage given beside one that disagrees.
  if (!c.zinf.sharding_strategy.empty()) {
    const std::string& ss = c.zinf.sharding_strategy;
    if (ss != "NO_SHARD" && ss != "SHARD_GRAD_OP" && ss != "FULL_SHARD" && ss != "HYBRID_SHARD") {
      out.push_back(fmt::format("zinf.sharding_strategy: \"{}\"; expected NO_SHARD, "
                                "SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD (FSDP's names)", ss));
    } else if (std::find(c.given_keys.begin(), c.given_keys.end(), "zero_optimization.stage") !=
                   c.given_keys.end() &&
               c.zero.stage != c.Stage()) {
      out.push_back(fmt::format(
          "zinf.sharding_strategy {} means zero_optimization.stage {}, but the stage given is {}; "
          "give one of them, or both agreeing", ss, c.Stage(), c.zero.stage));
    }
  }

  // Batch sizes (over c.world_size ranks).
  const TrainConfig& t = c.train;
  const auto& tbs = t.train_batch_size;
  const auto& micro = t.train_micro_batch_size_per_gpu;
  const auto& gas = t.gradient_accumulation_steps;
  if (tbs && micro && gas) {
    if (*tbs != *micro * *gas * c.world_size) {
      out.push_back(fmt::format(
          "train_batch_size: {} does not equal train_micro_batch_size_per_gpu {} * "
          "gradient_accumulation_steps {} * world size {} = {}; expected them to agree (or "
          "leave one out)",
          *tbs, *micro, *gas, c.world_size, *micro * *gas * c.world_size));
    }
  } else if (tbs && micro && *tbs % (*micro * c.world_size) != 0) {
    out.push_back(fmt::format(
        "train_batch_size: {} is not a multiple of train_micro_batch_size_per_gpu {} * world "
        "size {}; expected a multiple",
        *tbs, *micro, c.world_size));
  } else if (tbs && gas && *tbs % (*gas * c.world_size) != 0) {
    out.push_back(fmt::format(
        "train_batch_size: {} is not a multiple of gradient_accumulation_steps {} * world "
        "size {}; expected a multiple",
        *tbs, *gas, c.world_size));
  }

  if (c.fp16.enabled && c.bf16.enabled.value_or(false)) {
    out.push_back(
        "fp16.enabled: true together with bf16.enabled true; expected at most one "
        "16-bit format enabled");
  }
  if (c.zinf.overlap_adam && c.fp16.enabled && c.fp16.loss_scale == 0) {
    out.push_back(
        "zinf.overlap_adam: true with fp16 dynamic loss scaling (fp16.loss_scale 0); expected "
        "bf16, or a static fp16.loss_scale: an overflow found late in backward could not undo "
        "the units already updated");
  }

  const SchedulerConfig& s = c.scheduler;
  if ((s.type == SchedulerType::kWarmupLR || s.type == SchedulerType::kWarmupDecayLR) &&
      s.warmup_min_lr > c.WarmupMaxLr()) {
    out.push_back(
        fmt::format("scheduler.params.warmup_min_lr: {} is above the warmup peak {} ({}); expected "
                    "warmup_min_lr <= warmup_max_lr",
                    s.warmup_min_lr, c.WarmupMaxLr(),
                    s.warmup_max_lr ? "scheduler.params.warmup_max_lr" : "optimizer.params.lr"));
  }
}

// The model, budgets that can never be met, checkpoints and stripes.
void ValidateResources(const Config& c, bool model_rules, std::vector<std::string>& out) {
  const ModelConfig& m = c.zinf.model;
  if (model_rules && m.width % m.heads != 0 && !(m.is_llama() && m.head_dim != 0)) {
    out.push_back(
        fmt::format("zinf.model.width: {} is not divisible by zinf.model.heads {}; "
                    "expected a multiple of heads",
                    m.width, m.heads));
  }
  if (model_rules && !m.is_llama()) {
    // The JSON reader refuses these keys with gpt2; here what a flag set is caught too.
    if (m.kv_heads != 0 || m.intermediate != 0) {
      out.push_back(fmt::format("zinf.model.{}: {} is a setting of arch \"llama\"; expected it "
                                "unset with zinf.model.arch \"gpt2\"",
                                m.kv_heads != 0 ? "kv_heads" : "intermediate",
                                m.kv_heads != 0 ? m.kv_heads : m.intermediate));
    }
  }
  if (model_rules && m.is_llama()) {
    if (m.heads % m.KvHeads() != 0) {
      out.push_back(fmt::format("zinf.model.kv_heads: {} does not divide zinf.model.heads {}; "
                                "expected a divisor of heads", m.KvHeads(), m.heads));
    }
    if (m.head_dim != 0 && m.head_dim % 2 != 0) {
      out.push_back(fmt::format("zinf.model.head_dim: {} is odd; expected an even one (rotary "
                                "embeddings)", m.head_dim));
    } else if (m.head_dim == 0 && m.width % m.heads == 0 && (m.width / m.heads) % 2 != 0) {
      out.push_back(fmt::format("zinf.model.width: {} over {} heads is an odd head_dim {}; "
                                "expected an even one (rotary embeddings)",
                                m.width, m.heads, m.width / m.heads));
    }
    if (m.sliding_window != 0 && m.seq_len > m.sliding_window) {
      out.push_back(fmt::format(
          "zinf.model.seq_len: {} is longer than zinf.model.sliding_window {}; expected at most "
          "the window (zinf attends to every earlier position, which equals the windowed "
          "attention only within it)", m.seq_len, m.sliding_window));
    }
  }

  // Budgets that can never be met.
  const bool uses_nvme = c.zero.offload_param.device == OffloadDevice::kNvme ||
                         c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  const BudgetsConfig& b = c.zinf.budgets;
  if (uses_nvme && b.pinned_bytes && *b.pinned_bytes < c.aio.block_size) {
    out.push_back(fmt::format(
        "zinf.budgets.pinned_bytes: {} ({}) cannot stage one aio.block_size of {} ({}) for "
        "NVMe I/O; expected at least aio.block_size",
        *b.pinned_bytes, FormatBytesHuman(*b.pinned_bytes), c.aio.block_size,
        FormatBytesShort(c.aio.block_size)));
  }
  if (model_rules && b.device_bytes) {
    const uint64_t elem = c.precision() == Precision::kFp32 ? 4 : 2;
    const uint64_t unit_bytes = m.LargestUnitParams() * elem;
    if (unit_bytes > *b.device_bytes) {
      out.push_back(fmt::format(
          "zinf.budgets.device_bytes: {} ({}) cannot hold the largest unit of zinf.model "
          "({} parameters * {} bytes = {}, {}); expected at least {} or a smaller model",
          *b.device_bytes, FormatBytesHuman(*b.device_bytes), m.LargestUnitParams(), elem,
          unit_bytes, FormatBytesHuman(unit_bytes), unit_bytes));
    }
  }

  const CheckpointConfig& ck = c.zinf.checkpoint;
  if (ck.every > 0 && ck.dir.empty()) {
    out.push_back(fmt::format("zinf.checkpoint.every: {} without zinf.checkpoint.dir; expected "
                              "a directory for the checkpoints", ck.every));
  }
  if (ck.keep > 63 && c.zero.offload_optimizer.device == OffloadDevice::kNvme) {
    out.push_back(fmt::format(
        "zinf.checkpoint.keep: {} with the optimizer state on NVMe; expected at most 63 (the "
        "swap file holds one generation of the state, 12 bytes a parameter (8 with bf16 moments), per checkpoint "
        "kept, plus one)", ck.keep));
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < c.zinf.stripe_paths.size(); ++i) {
    const std::string& p = c.zinf.stripe_paths[i];
    if (p.empty()) {
      out.push_back(fmt::format("zinf.stripe_paths[{}]: empty; expected a directory", i));
    } else if (!seen.insert(p).second) {
      out.push_back(
          fmt::format("zinf.stripe_paths[{}]: {} is listed twice; expected distinct "
                      "directories",
                      i, Quoted(p)));
    }
  }
}

std::vector<std::string> ValidateLines(const Config& c, bool model_rules) {
  std::vector<std::string> out;
  ValidateTraining(c, out);
  ValidateResources(c, model_rules, out);
  return out;
}

}  // namespace

std::string_view OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "?";
}

std::string_view OptimizerTypeName(OptimizerType type) {
  return type == OptimizerType::kAdam ? "Adam" : "AdamW";
}

std::string_view SchedulerTypeName(SchedulerType type) {
  switch (type) {
    case SchedulerType::kNone:
      return "none";
    case SchedulerType::kWarmupLR:
      return "WarmupLR";
    case SchedulerType::kWarmupDecayLR:
      return "WarmupDecayLR";
    case SchedulerType::kWarmupCosineLR:
      return "WarmupCosineLR";
  }
  return "?";
}

std::string_view WarmupTypeName(WarmupType type) {
  return type == WarmupType::kLog ? "log" : "linear";
}

std::string_view PrecisionName(Precision p) {
  switch (p) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      return "fp32";
  }
  return "?";
}

uint32_t ModelConfig::Intermediate() const {
  if (!is_llama()) return 4 * width;
  if (intermediate != 0) return intermediate;
  const uint64_t hidden = 2 * (4 * uint64_t{width}) / 3;  // Meta's llama/model.py, multiple_of 256
  return static_cast<uint32_t>((hidden + 255) / 256 * 256);
}
uint64_t ModelConfig::BlockParams() const {
  const uint64_t c = width;
  if (!is_llama()) return 12 * c * c + 13 * c;
  const uint64_t d = HeadDim(), q = uint64_t{heads} * d, kv = uint64_t{KvHeads()} * d;
  const uint64_t i = Intermediate();
  return c * (q + 2 * kv) + q * c + 3 * c * i + 2 * c + (qkv_bias ? q + 2 * kv : 0) +
         (o_bias ? c : 0) + (mlp_bias ? 2 * i + c : 0);
}
uint64_t ModelConfig::EmbeddingParams() const {
  return (uint64_t{vocab} + (is_llama() ? 0 : seq_len)) * width;
}
uint64_t ModelConfig::FinalParams() const {
  if (!is_llama()) return uint64_t{2} * width;
  return uint64_t{width} + (tie_embeddings ? 0 : uint64_t{vocab} * width);
}
uint64_t ModelConfig::LargestUnitParams() const {
  return std::max({BlockParams(), EmbeddingParams(), FinalParams()});
}
uint64_t ModelConfig::TotalParams() const {
  return EmbeddingParams() + layers * BlockParams() + FinalParams();
}

Result<Config> Config::FromFile(const std::string& path, const ConfigParseOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open config file " + path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::FromErrno(errno, "read config file " + path);
  ConfigParseOptions opts = options;
  if (opts.source_name.empty()) opts.source_name = path;
  return FromString(text, opts);
}

Result<Config> Config::FromString(std::string_view text, const ConfigParseOptions& options) {
  const std::string source = options.source_name.empty() ? "<string>" : options.source_name;
  json doc;
  try {
    doc = ParseJsonRefusingDuplicates(text, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    auto [line, column] = LineColumn(text, e.byte);
    return InvalidArgument(fmt::format("{}:{}:{}: malformed JSON: {}", source, line, column,
                                       ParseErrorDetail(e.what())));
  } catch (const DuplicateJsonKey& d) {
    return Problems(source, {fmt::format("{}: given twice in one object; expected each key "
                                         "once (JSON readers disagree on which one wins)",
                                         d.Dotted())});
  }
  if (!doc.is_object()) {
    return Problems(source, {fmt::format("the document is a JSON {}; expected a JSON object",
                                         doc.type_name())});
  }

  Config c = options.base != nullptr ? *options.base : Config();
  c.source = source;
  config_internal::ReadReport report;
  config_internal::ReadConfig(doc, &c, &report);
  c.unimplemented = std::move(report.unimplemented);
  c.auto_keys = std::move(report.auto_keys);
  for (const std::string& k : c.auto_keys) {
    if (k == "zinf.budgets.host_bytes") c.zinf.budgets.host_bytes_auto = true;
  }
  c.given_keys = std::move(report.given);
  std::vector<std::string> lines = std::move(report.errors);
  // Cross-field rules only make sense over values that were read.
  if (lines.empty() && options.validate) lines = ValidateLines(c, options.model_rules);
  const bool strict = options.strict || c.zinf.strict;
  if (strict) {
    for (const auto& u : c.unimplemented) {
      lines.push_back(
          fmt::format("{}: a DeepSpeed key zinf accepts but does not implement; "
                      "expected it removed (strict mode)",
                      u));
    }
  }
  if (!lines.empty()) return Problems(source, lines);

  if (!c.unimplemented.empty() && options.log_warnings) {
    std::string list;
    for (const auto& u : c.unimplemented) list += (list.empty() ? "" : ", ") + u;
    Log().warn(
        "{}: {} DeepSpeed key{} accepted but not implemented by zinf, so without "
        "effect: {} (zinf.strict or --strict refuses them)",
        source, c.unimplemented.size(), c.unimplemented.size() == 1 ? " is" : "s are", list);
  }
  if (!c.auto_keys.empty() && options.log_warnings) {
    std::string list;
    for (const auto& a : c.auto_keys) list += (list.empty() ? "" : ", ") + a;
    Log().info("{}: \"auto\" means zinf's default for {}", source, list);
  }
  return c;
}

Status Config::Validate(bool model_rules) const {
  std::vector<std::string> lines = ValidateLines(*this, model_rules);
  if (lines.empty()) return Status::Ok();
  return Problems(source, lines);
}

int Config::Stage() const {
  const std::string& ss = zinf.sharding_strategy;
  if (ss == "NO_SHARD") return 0;
  if (ss == "SHARD_GRAD_OP") return 2;
  if (ss == "FULL_SHARD" || ss == "HYBRID_SHARD") return 3;
  return zero.stage;
}

uint64_t Config::MicroBatchSize() const {
  const TrainConfig& t = train;
  if (t.train_micro_batch_size_per_gpu) return *t.train_micro_batch_size_per_gpu;
  if (t.train_batch_size) {
    const uint64_t gas = t.gradient_accumulation_steps.value_or(1);
    return std::max<uint64_t>(1, *t.train_batch_size / (gas * world_size));
  }
  return 1;
}

uint64_t Config::GradientAccumulationSteps() const {
  const TrainConfig& t = train;
  if (t.gradient_accumulation_steps) return *t.gradient_accumulation_steps;
  if (t.train_batch_size && t.train_micro_batch_size_per_gpu) {
    return std::max<uint64_t>(
        1, *t.train_batch_size / (*t.train_micro_batch_size_per_gpu * world_size));
  }
  return 1;
}

uint64_t Config::TrainBatchSize() const {
  return MicroBatchSize() * GradientAccumulationSteps() * world_size;
}

Precision Config::precision() const {
  if (fp16.enabled) return Precision::kFp16;
  if (bf16.enabled.has_value() && !*bf16.enabled) return Precision::kFp32;
  return Precision::kBf16;
}

double Config::WarmupMaxLr() const { return scheduler.warmup_max_lr.value_or(optimizer.lr); }

std::string Config::SwapDir() const {
  if (!zinf.swap_dir.empty()) return zinf.swap_dir;
  if (!zero.offload_optimizer.nvme_path.empty()) return zero.offload_optimizer.nvme_path;
  return zero.offload_param.nvme_path;
}

nlohmann::ordered_json Config::ToJson() const {
  using oj = nlohmann::ordered_json;
  auto path_or_null = [](const std::string& p) { return p.empty() ? oj(nullptr) : oj(p); };
  auto bytes_or_auto = [](const std::optional<uint64_t>& v) { return v ? oj(*v) : oj("auto"); };

  const OffloadParamConfig& op = zero.offload_param;
  const OffloadOptimizerConfig& oo = zero.offload_optimizer;
  oj out;
  out["train_batch_size"] = TrainBatchSize();
  out["train_micro_batch_size_per_gpu"] = MicroBatchSize();
  out["gradient_accumulation_steps"] = GradientAccumulationSteps();
  out["gradient_clipping"] = train.gradient_clipping;
  out["steps_per_print"] = train.steps_per_print;
  out["wall_clock_breakdown"] = train.wall_clock_breakdown;
  out["zero_optimization"] = {{"stage", zero.stage},
                              {"offload_param",
                               {{"device", OffloadDeviceName(op.device)},
                                {"nvme_path", path_or_null(op.nvme_path)},
                                {"buffer_count", op.buffer_count},
                                {"buffer_size", op.buffer_size},
                                {"max_in_cpu", op.max_in_cpu},
                                {"pin_memory", op.pin_memory}}},
                              {"offload_optimizer",
                               {{"device", OffloadDeviceName(oo.device)},
                                {"nvme_path", path_or_null(oo.nvme_path)},
                                {"buffer_count", oo.buffer_count},
                                {"pin_memory", oo.pin_memory},
                                {"pipeline_read", oo.pipeline_read},
                                {"pipeline_write", oo.pipeline_write}}},
                              {"stage3_prefetch_bucket_size", zero.stage3_prefetch_bucket_size},
                              {"stage3_max_live_parameters", zero.stage3_max_live_parameters},
                              {"sub_group_size", zero.sub_group_size}};
  out["aio"] = {{"block_size", aio.block_size},
                {"queue_depth", aio.queue_depth},
                {"intra_op_parallelism", aio.intra_op_parallelism},
                {"engine", aio.engine}};
  out["optimizer"] = {{"type", OptimizerTypeName(optimizer.type)},
                      {"params",
                       {{"lr", optimizer.lr},
                        {"betas", {optimizer.beta1, optimizer.beta2}},
                        {"eps", optimizer.eps},
                        {"weight_decay", optimizer.weight_decay},
                        {"bias_correction", optimizer.bias_correction},
                        {"adam_w_mode", optimizer.adam_w_mode}}}};
  if (scheduler.type != SchedulerType::kNone) {
    oj params = {{"warmup_num_steps", scheduler.warmup_num_steps},
                 {"warmup_type", WarmupTypeName(scheduler.warmup_type)}};
    if (scheduler.type == SchedulerType::kWarmupCosineLR) {
      params["warmup_min_ratio"] = scheduler.warmup_min_ratio;
      params["cos_min_ratio"] = scheduler.cos_min_ratio;
    } else {
      params["warmup_min_lr"] = scheduler.warmup_min_lr;
      params["warmup_max_lr"] = WarmupMaxLr();
    }
    if (scheduler.type != SchedulerType::kWarmupLR && scheduler.total_num_steps != 0) {
      params["total_num_steps"] = scheduler.total_num_steps;
    }
    out["scheduler"] = {{"type", SchedulerTypeName(scheduler.type)}, {"params", params}};
  } else {
    out["scheduler"] = nullptr;
  }
  out["fp16"] = {{"enabled", fp16.enabled},
                 {"loss_scale", fp16.loss_scale},
                 {"initial_scale_power", fp16.initial_scale_power},
                 {"loss_scale_window", fp16.loss_scale_window},
                 {"hysteresis", fp16.hysteresis},
                 {"consecutive_hysteresis", fp16.consecutive_hysteresis},
                 {"min_loss_scale", fp16.min_loss_scale}};
  out["bf16"] = {{"enabled", precision() == Precision::kBf16}};
  const ModelConfig& m = zinf.model;
  out["zinf"] = {{"budgets",
                  {{"device_bytes", bytes_or_auto(zinf.budgets.device_bytes)},
                   {"pinned_bytes", bytes_or_auto(zinf.budgets.pinned_bytes)}}},
                 {"prefetch_depth", zinf.prefetch_depth},
                 {"pipeline_depth", zinf.pipeline_depth},
                 {"max_inflight_bytes", zinf.max_inflight_bytes},
                 {"stripe_paths", zinf.stripe_paths},
                 {"stripe_bytes", zinf.stripe_bytes},
                 {"swap_dir", zinf.swap_dir},
                 {"trace_file", zinf.trace_file},
                 {"adam_threads", zinf.adam_threads},
                 {"overlap_adam", zinf.overlap_adam},
                 {"write_behind", zinf.write_behind},
                 {"eviction_policy", zinf.eviction_policy},
                 {"seed", zinf.seed},
                 {"optimizer_state_dtype", zinf.optimizer_state_dtype},
                 {"optimizer_state_rounding", zinf.optimizer_state_rounding},
                 {"model", ModelJson(m)},
                 {"checkpoint",
                  {{"dir", zinf.checkpoint.dir},
                   {"every", zinf.checkpoint.every},
                   {"keep", zinf.checkpoint.keep},
                   {"resume", zinf.checkpoint.resume},
                   {"verify_state_reads", zinf.checkpoint.verify_state_reads}}},
                 {"sharding_strategy", zinf.sharding_strategy},
                 {"comm",
                  {{"timeout_seconds", zinf.comm.timeout_seconds},
                   {"check_sequence", zinf.comm.check_sequence},
                   {"backend", zinf.comm.backend}}},
                 {"strict", zinf.strict}};
  // Absent means none (not sized from the machine): left out, not "auto".
  if (zinf.budgets.host_bytes) {
    out["zinf"]["budgets"]["host_bytes"] = *zinf.budgets.host_bytes;
  } else if (zinf.budgets.host_bytes_auto) {
    out["zinf"]["budgets"]["host_bytes"] = "auto";
  }
  return out;
}

}  // namespace zinf
