#include "src/train/checkpoint.h"

// Starting a run from a checkpoint: reading it, checking it against the run, and putting the
// trainer's and the optimizer's state back (checkpoint.h, "Resume").
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <filesystem>

#include <fmt/format.h>

#include "src/base/atomic_file.h"
#include "src/base/hash.h"
#include "src/base/log.h"

namespace zinf::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Field readers naming the manifest and the field.
class Reader {
 public:
  Reader(std::string where, const json& j) : where_(std::move(where)), j_(j) {}
  template <typename T>
  Status Get(const char* key, T* out) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return Bad(key, "is missing");
    try {
      if constexpr (std::is_same_v<T, std::string>) {
        if (!it->is_string()) return Bad(key, "is not a string");
      } else if constexpr (std::is_floating_point_v<T>) {
        if (!it->is_number()) return Bad(key, "is not a number");
      } else {
        if (!it->is_number_integer()) return Bad(key, "is not an integer");
      }
      *out = it->get<T>();
    } catch (const json::exception&) {
      return Bad(key, "is out of range");
    }
    return Status::Ok();
  }
  Status Hex(const char* key, uint64_t* out) const {
    std::string s;
    ZINF_RETURN_IF_ERROR(Get(key, &s));
    auto v = ParseXxh64Hex(s);
    if (!v) return Bad(key, "is not 16 hex digits");
    *out = *v;
    return Status::Ok();
  }
  Status Bits(const char* key, double* out) const {
    uint64_t b = 0;
    ZINF_RETURN_IF_ERROR(Hex(key, &b));
    *out = std::bit_cast<double>(b);
    return Status::Ok();
  }
  Result<Reader> Object(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || !it->is_object()) return Bad(key, "is missing or not an object");
    return Reader(where_ + "." + key, *it);
  }

 private:
  Status Bad(const char* key, const char* what) const {
    return DataLoss(fmt::format("{}.{} {}", where_, key, what));
  }
  std::string where_;
  const json& j_;
};

std::string ManifestPath(const ckpt::Manifest& m) {
  return (fs::path(m.dir) / ckpt::kManifestName).string();
}

}  // namespace

Result<ckpt::Manifest> ReadForResume(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string dir, ckpt::Resolve(path));
  return ckpt::Read(dir);
}

std::string PartitionRuleOf(const Config& c) {
  if (c.world_size <= 1) return ckpt::kPartitionNone;
  return c.Stage() == 0 ? ckpt::kPartitionReplicated : ckpt::kPartitionUnitChunks;
}

Status CheckResumeWorld(const ckpt::Manifest& m, uint32_t world) {
  if (m.rank) {
    return FailedPrecondition(fmt::format(
        "cannot resume from {}: it is rank {}'s part of a checkpoint across {} ranks; resume "
        "from the checkpoint's directory, {}", m.dir, *m.rank, m.world_size,
        fs::path(m.dir).parent_path().string()));
  }
  if (m.world_size != world) {
    return FailedPrecondition(fmt::format(
        "cannot resume from {}: it was written by {} rank(s) and this run has {}; resume with "
        "{} (zinf launch --nproc {}), or export its weights (zinf ckpt export {} --out "
        "w.safetensors) and start from them with --init (the optimizer's moments then start "
        "from zero)", m.dir, m.world_size, world, m.world_size, m.world_size, m.dir));
  }
  return Status::Ok();
}

Result<ckpt::Manifest> StatePartFor(const ckpt::Manifest& m, uint32_t rank, uint32_t world,
                                    const std::string& partition,
                                    const std::optional<std::vector<std::string>>& allowed) {
  ZINF_RETURN_IF_ERROR(CheckResumeWorld(m, world));
  if (m.partition != partition) {
    return FailedPrecondition(fmt::format(
        "cannot resume from {}: its optimizer state is partitioned \"{}\" and this run's would "
        "be \"{}\" (zero_optimization.stage or zinf.sharding_strategy differ: \"replicated\" "
        "is stage 0, \"unit-chunks\" stages 1 and 2); resume with the checkpoint's stage",
        m.dir, m.partition, partition));
  }
  if (!m.HasParts()) return m;
  return ckpt::ReadPart(m, rank, allowed);
}

Result<Config> ConfigOf(const ckpt::Manifest& m, const Config& base) {
  auto it = m.training.find("config");
  if (it == m.training.end() || !it->is_object()) {
    return DataLoss(fmt::format("{}: training.config is missing or not an object",
                                ManifestPath(m)));
  }
  return Config::FromString(it->dump(), {.source_name = ManifestPath(m) + " (training.config)",
                                         .log_warnings = false,
                                         .base = &base,
                                         .validate = false});
}

Result<RecordedRun> RecordedRunOf(const ckpt::Manifest& m) {
  RecordedRun r;
  const std::string where = ManifestPath(m) + ": training";
  auto steps = m.training.find("steps");
  auto run = m.training.find("run");
  if (steps == m.training.end() || !steps->is_number_unsigned() || run == m.training.end() ||
      !run->is_object()) {
    return DataLoss(where + ": expected \"steps\" (a count) and \"run\" (an object)");
  }
  r.steps_total = steps->get<uint64_t>();
  try {
    r.data = run->at("data").get<std::string>();
    r.val_data = run->at("val_data").get<std::string>();
    r.data_format = run->at("data_format").get<std::string>();
    r.synthetic_bytes = run->at("synthetic_bytes").get<uint64_t>();
    r.val_fraction = run->at("val_fraction").get<double>();
    r.eval_every = run->at("eval_every").get<uint64_t>();
    r.eval_batches = run->at("eval_batches").get<uint32_t>();
  } catch (const json::exception& e) {
    return DataLoss(fmt::format("{}.run: {}", where, e.what()));
  }
  return r;
}

namespace {

// What differs between the placement of the optimizer state in `m` and this run's (`place`:
// "nvme", "memory" or "mixed" with the units in memory), if anything.
std::optional<std::string> PlacementProblem(const ckpt::Manifest& m, const std::string& place,
                                            const std::vector<std::string>& state_in_memory_units,
                                            const std::string& device) {
  const std::string place_then = m.training.value("optimizer_state", std::string("?"));
  auto units_then = m.training.value("optimizer_state_in_memory", std::vector<std::string>());
  auto describe = [](const std::string& p, const std::vector<std::string>& units) {
    return p == "mixed" ? fmt::format("in memory for {}, on NVMe for the rest", fmt::join(units, ", "))
                        : "in " + p + " for every unit";
  };
  if (place_then == place && (place != "mixed" || units_then == state_in_memory_units)) {
    return std::nullopt;
  }
  const std::string device_then = RecordedStateDevice(m);
  if (!device.empty() && !device_then.empty() && device != device_then) {
    return fmt::format(
        "zero_optimization.offload_optimizer.device: {} here, {} in the checkpoint (the "
        "optimizer state is {} here, {} in the checkpoint)",
        device, device_then, describe(place, state_in_memory_units),
        describe(place_then, units_then));
  }
  return fmt::format(
      "--placement / zinf.budgets.host_bytes: the optimizer state is {} here, {} in the "
      "checkpoint; resume with the placement the checkpoint was written with",
      describe(place, state_in_memory_units), describe(place_then, units_then));
}

}  // namespace

std::string RecordedStateDevice(const ckpt::Manifest& m) {
  const auto config = m.training.find("config");
  if (config == m.training.end() || !config->is_object()) return "";
  const json zo = config->value("zero_optimization", json::object());
  const json oo = zo.is_object() ? zo.value("offload_optimizer", json::object())
                                 : json::object();
  return oo.is_object() ? oo.value("device", std::string()) : std::string();
}

Status CheckResumePlacement(const ckpt::Manifest& m, const std::string& place,
                            const std::vector<std::string>& state_in_memory_units,
                            const std::string& device) {
  if (auto p = PlacementProblem(m, place, state_in_memory_units, device)) {
    return FailedPrecondition(fmt::format("cannot resume from {}:\n  {}", ManifestPath(m), *p));
  }
  return Status::Ok();
}

Status CheckResumable(const ckpt::Manifest& m, const Config& c,
                      const std::vector<std::string>& swap_files,
                      const std::string& state_placement,
                      const std::vector<std::string>& state_in_memory_units,
                      bool repartitioned) {
  const std::string where = ManifestPath(m);
  std::vector<std::string> problems;
  const json now = json::parse(c.ToJson().dump());
  for (const char* key : {"layers", "width", "heads", "seq_len", "vocab"}) {
    const json& then = m.model.contains(key) ? m.model[key] : json();
    if (then != now["zinf"]["model"][key]) {
      problems.push_back(fmt::format("zinf.model.{}: {} here, {} in the checkpoint", key,
                                     now["zinf"]["model"][key].dump(), then.dump()));
    }
  }
  const std::string p16 = c.precision() == Precision::kFp16 ? "fp16" : "bf16";
  if (m.training.value("param16", std::string()) != p16) {
    problems.push_back(fmt::format("precision: {} here, {} in the checkpoint", p16,
                                   m.training.value("param16", std::string("?"))));
  }
  const bool nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  const std::string place = !state_placement.empty() ? state_placement : nvme ? "nvme" : "memory";
  // Re-partitioned state is read from the checkpoint's files into this run's own layout:
  // the placement, the world size and the swap files may differ.
  if (auto p = repartitioned ? std::nullopt
                             : PlacementProblem(m, place, state_in_memory_units,
                                                std::string(OffloadDeviceName(
                                                    c.zero.offload_optimizer.device)))) {
    problems.push_back(*p);
  }
  // Checkpoints written before zinf.optimizer_state_dtype existed hold fp32 moments.
  const std::string moments_then = m.training.value("optimizer_state_dtype", std::string("fp32"));
  if (moments_then != c.zinf.optimizer_state_dtype) {
    problems.push_back(fmt::format(
        "zinf.optimizer_state_dtype: the moments are {} here, {} in the checkpoint",
        c.zinf.optimizer_state_dtype, moments_then));
  }
  if (!repartitioned && m.world_size != std::max<uint64_t>(c.world_size, 1)) {
    problems.push_back(fmt::format("world size {} in the checkpoint, {} here", m.world_size,
                                   std::max<uint64_t>(c.world_size, 1)));
  }
  if (!repartitioned && m.HasParts()) {
    problems.push_back("the checkpoint's state lies in its parts (resume from this rank's: "
                       "StatePartFor)");
  }
  for (const ckpt::FileEntry& f : m.files) {
    if (f.kind != "swap" || repartitioned) continue;
    const std::vector<std::string> named =
        f.members.empty() ? std::vector<std::string>{f.name} : f.members;
    if (named != swap_files) {
      problems.push_back(fmt::format(
          "the checkpoint keeps optimizer state in the swap file(s) {}, not this run's ({}); "
          "the swap directories (zinf.offload_optimizer.nvme_path, zinf.stripe_paths) must be "
          "the ones the checkpoint's run used, in the same order",
          fmt::join(named, ", "), swap_files.empty() ? std::string("none")
                                                     : fmt::format("{}", fmt::join(swap_files, ", "))));
    }
  }
  if (!problems.empty()) {
    std::string msg = fmt::format("cannot resume from {}:", where);
    for (const auto& p : problems) msg += "\n  " + p;
    return FailedPrecondition(msg);
  }
  // Allowed, but the run then differs from an uninterrupted one.
  auto it = m.training.find("config");
  if (it != m.training.end() && it->is_object()) {
    const json& then = *it;
    for (const char* key : {"train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                            "gradient_clipping", "optimizer", "scheduler", "fp16"}) {
      // Re-partitioned: the accumulation steps follow the world size (the global batch kept).
      if (repartitioned && std::string_view(key) == "gradient_accumulation_steps") continue;
      if (then.value(key, json()) != now.value(key, json())) {
        Log().warn("resume: {} is {} here, {} in {}: the run will not match an uninterrupted "
                   "one bit for bit", key, now.value(key, json()).dump(),
                   then.value(key, json()).dump(), where);
      }
    }
    for (const char* key : {"seed", "overlap_adam", "optimizer_state_rounding"}) {
      const json a = now["zinf"].value(key, json()), b = then.value("zinf", json()).value(key, json());
      if (a != b) {
        Log().warn("resume: zinf.{} is {} here, {} in {}: the run will not match an "
                   "uninterrupted one bit for bit", key, a.dump(), b.dump(), where);
      }
    }
  }
  return Status::Ok();
}

Result<TrainerState> TrainerStateOf(const ckpt::Manifest& m) {
  const std::string where = ManifestPath(m);
  TrainerState st;
  st.step = m.step;
  Reader state(where + ": state", m.state);
  ZINF_RETURN_IF_ERROR(state.Get("applied_steps", &st.applied));
  ZINF_RETURN_IF_ERROR(state.Get("skipped_steps", &st.skipped));
  ZINF_RETURN_IF_ERROR(state.Bits("prev_clip_bits", &st.prev_clip));
  ZINF_ASSIGN_OR_RETURN(Reader ls, state.Object("loss_scaler"));
  ZINF_RETURN_IF_ERROR(ls.Bits("scale_bits", &st.scaler.scale));
  ZINF_RETURN_IF_ERROR(ls.Get("iteration", &st.scaler.iteration));
  ZINF_RETURN_IF_ERROR(ls.Get("last_overflow_iteration", &st.scaler.last_overflow_iteration));
  ZINF_RETURN_IF_ERROR(ls.Get("hysteresis_left", &st.scaler.hysteresis_left));
  ZINF_RETURN_IF_ERROR(ls.Get("skipped_steps", &st.scaler.skipped_steps));
  Reader data(where + ": data", m.data);
  ZINF_ASSIGN_OR_RETURN(Reader train, data.Object("train"));
  ZINF_RETURN_IF_ERROR(train.Get("position", &st.data_position));
  std::string format;
  ZINF_RETURN_IF_ERROR(train.Get("format", &format));
  auto f = ParseDataFormat(format);
  if (!f.ok()) return DataLoss(fmt::format("{}: data.train.format: {}", where, format));
  st.data.format = *f;
  ZINF_RETURN_IF_ERROR(train.Get("path", &st.data.path));
  ZINF_RETURN_IF_ERROR(train.Get("tokens", &st.data.tokens));
  ZINF_RETURN_IF_ERROR(train.Get("file_bytes", &st.data.file_bytes));
  ZINF_RETURN_IF_ERROR(train.Hex("head_xxh64", &st.data.head_xxh64));
  ZINF_RETURN_IF_ERROR(train.Hex("tail_xxh64", &st.data.tail_xxh64));
  if (st.applied + st.skipped != st.step) {
    return DataLoss(fmt::format("{}: {} applied and {} skipped steps do not add up to step {}",
                                where, st.applied, st.skipped, st.step));
  }
  return st;
}

Result<std::vector<StateShardSet>> StateShardsByUnit(const ckpt::Manifest& m, const Model& d) {
  const uint32_t units = d.units();
  const std::string where = ManifestPath(m);
  std::vector<StateShardSet> by_unit(units);
  for (const ckpt::ShardEntry& s : m.shards) {
    const auto* role = std::find(std::begin(offload::kStateRoleNames),
                                 std::end(offload::kStateRoleNames), s.role);
    if (role == std::end(offload::kStateRoleNames)) continue;  // not optimizer state
    const int r = static_cast<int>(role - std::begin(offload::kStateRoleNames));
    if (s.unit >= units) {
      return InvalidArgument(fmt::format("{}: shard {} of unit {}: the model has {} units",
                                         where, s.role, s.unit, units));
    }
    uint64_t n = d.UnitParams(s.unit);
    n = m.PartChunk(n).len;  // across ranks under "unit-chunks": this part's chunk
    // The master weights are F32; the moments F32 or BF16 (zinf.optimizer_state_dtype).
    const bool ok_dtype = s.dtype == "F32" || (r != offload::kMasterState && s.dtype == "BF16");
    if (!ok_dtype || s.length != n * ckpt::DtypeBytes(s.dtype)) {
      return InvalidArgument(fmt::format(
          "{}: shard {} of unit {} ({}) is {} bytes of {}; expected {} bytes of F32{}", where,
          s.role, s.unit, d.UnitName(s.unit), s.length, s.dtype, 4 * n,
          r == offload::kMasterState ? "" : fmt::format(" or {} bytes of BF16", 2 * n)));
    }
    if (by_unit[s.unit][r] != nullptr) {
      return InvalidArgument(fmt::format("{}: shard {} of unit {} is listed twice", where,
                                         s.role, s.unit));
    }
    by_unit[s.unit][r] = &s;
  }
  for (uint32_t u = 0; u < units; ++u) {
    for (int r = 0; r < offload::kStateRoles; ++r) {
      if (by_unit[u][r] == nullptr) {
        return DataLoss(fmt::format("{}: no {} shard for unit {} ({})", where,
                                    offload::kStateRoleNames[r], u, d.UnitName(u)));
      }
    }
  }
  return by_unit;
}

Status RestoreOptimizerState(LayerExecutor& ex, const ckpt::Manifest& m) {
  const Model& d = ex.model();
  const uint32_t units = d.units();
  const std::string where = ManifestPath(m);
  ZINF_ASSIGN_OR_RETURN(const std::vector<StateShardSet> by_unit, StateShardsByUnit(m, d));
  std::vector<uint8_t> arrays[offload::kStateRoles];
  for (uint32_t u = 0; u < units; ++u) {
    const uint64_t n = by_unit[u][0]->length / 4;  // the unit's, or this rank's chunk of it
    UnitState st;
    st.unit = u;
    st.n = n;
    if (by_unit[u][offload::kExpAvgState]->dtype != by_unit[u][offload::kExpAvgSqState]->dtype) {
      return InvalidArgument(fmt::format("{}: unit {} ({}): exp_avg is {} but exp_avg_sq {}",
                                         where, u, d.UnitName(u),
                                         by_unit[u][offload::kExpAvgState]->dtype,
                                         by_unit[u][offload::kExpAvgSqState]->dtype));
    }
    st.moment_type = by_unit[u][offload::kExpAvgState]->dtype == "BF16" ? kernels::DType::kBf16
                                                                          : kernels::DType::kF32;
    for (int r = 0; r < offload::kStateRoles; ++r) {
      const ckpt::ShardEntry* s = by_unit[u][r];
      st.hashes[r] = s->xxh64;
      const ckpt::FileEntry* f = m.FindFile(s->file);
      if (f != nullptr && f->kind == "swap") {
        st.extents[r] = {s->offset, s->length};
        continue;
      }
      const std::string path = m.PathOf(*s);
      arrays[r].resize(s->length);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) return Status::FromErrno(errno, "open checkpoint file " + path);
      Status rd = PreadAll(fd, arrays[r].data(), s->length, s->offset, path);
      ::close(fd);
      ZINF_RETURN_IF_ERROR(rd.WithContext(where));
      st.arrays[r] = arrays[r].data();
      st.sources[r] = fmt::format("{} at offset {}", path, s->offset);
    }
    ZINF_RETURN_IF_ERROR(ex.RestoreUnit(st, m.step).WithContext("resume from " + m.dir));
  }
  return Status::Ok();
}

}  // namespace zinf::train
