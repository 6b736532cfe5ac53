#include "src/train/checkpoint.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "src/base/atomic_file.h"
#include "src/base/hash.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;


std::string BitsHex(double v) { return fmt::format("{:016x}", std::bit_cast<uint64_t>(v)); }

json DataJson(const TrainerState& st) {
  return {{"position", st.data_position},
          {"format", std::string(DataFormatName(st.data.format))},
          {"path", st.data.path},
          {"tokens", st.data.tokens},
          {"file_bytes", st.data.file_bytes},
          {"head_xxh64", Xxh64Hex(st.data.head_xxh64)},
          {"tail_xxh64", Xxh64Hex(st.data.tail_xxh64)}};
}

json StateJson(const TrainerState& st) {
  const LossScalerState& s = st.scaler;
  return {{"applied_steps", st.applied},
          {"skipped_steps", st.skipped},
          {"prev_clip", st.prev_clip},
          {"prev_clip_bits", BitsHex(st.prev_clip)},
          {"loss_scaler",
           {{"scale", s.scale},
            {"scale_bits", BitsHex(s.scale)},
            {"iteration", s.iteration},
            {"last_overflow_iteration", s.last_overflow_iteration},
            {"hysteresis_left", s.hysteresis_left},
            {"skipped_steps", s.skipped_steps}}}};
}

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

struct Checkpointer::Job {
  uint64_t step = 0;
  std::string dir;
  ckpt::Manifest manifest;  // without files and shards
};

Result<std::unique_ptr<Checkpointer>> Checkpointer::Create(const CheckpointerOptions& o) {
  if (o.root.empty()) return InvalidArgument("zinf.checkpoint.dir: empty");
  if (o.state_on_nvme && (o.swap_files.empty() || (o.swap_files.size() > 1 && o.stripe_bytes == 0))) {
    return InvalidArgument(fmt::format(
        "zinf.checkpoint.dir: the optimizer state is on NVMe but the checkpointer was given {} "
        "swap files and stripe unit {}", o.swap_files.size(), o.stripe_bytes));
  }
  std::error_code ec;
  fs::create_directories(o.root, ec);
  if (ec) {
    return InvalidArgument(fmt::format("zinf.checkpoint.dir: cannot create {}: {}", o.root,
                                       ec.message()));
  }
  const auto committed = ckpt::Committed(o.root);
  if (!committed.empty()) {
    if (!o.resumed_step) {
      return FailedPrecondition(fmt::format(
          "zinf.checkpoint.dir: {} holds committed checkpoints (the latest of step {}); a new "
          "run there would make them stale. Resume with --resume {}, or give another "
          "--checkpoint-dir", o.root, committed.back().step, o.root));
    }
    std::string newer;
    for (const auto& c : committed) {
      if (c.step > *o.resumed_step) newer += (newer.empty() ? "" : ", ") + c.dir;
    }
    if (!newer.empty()) {
      return FailedPrecondition(fmt::format(
          "zinf.checkpoint.dir: {} holds checkpoints newer than step {}, the one resumed: {}; "
          "this run would overwrite them. Remove them, or give another --checkpoint-dir",
          o.root, *o.resumed_step, newer));
    }
  }
  if (o.bytes_per_checkpoint > 0) {
    // Checkpoints already there count against `keep`; the one being written comes on top.
    const uint64_t kept = std::min<uint64_t>(committed.size(), o.keep);
    const uint64_t need = (o.keep + 1 - kept) * o.bytes_per_checkpoint;
    struct statvfs v {};
    if (::statvfs(o.root.c_str(), &v) != 0) return Status::FromErrno(errno, "statvfs " + o.root);
    const uint64_t free_bytes = static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
    if (free_bytes < need) {
      return ResourceExhausted(fmt::format(
          "zinf.checkpoint.dir: {} has {} bytes ({}) free; {} more checkpoints of {} bytes ({}) "
          "each need {} bytes ({}) (zinf.checkpoint.keep {} kept, plus the one being written, "
          "less the {} already there); free space, lower --keep-checkpoints, or give another "
          "--checkpoint-dir",
          o.root, free_bytes, FormatBytesHuman(free_bytes), o.keep + 1 - kept,
          o.bytes_per_checkpoint, FormatBytesHuman(o.bytes_per_checkpoint), need,
          FormatBytesHuman(need), o.keep, kept));
    }
  }
  if (o.state_on_nvme) {
    // Whoever creates swap files here later must not empty the ones these checkpoints name.
    const std::string root = fs::absolute(o.root).lexically_normal().string();
    for (const std::string& swap : o.swap_files) {
      const std::string marker = (fs::path(swap).parent_path() / kSwapOwnerFile).string();
      ZINF_RETURN_IF_ERROR(WriteFileAtomically(marker, root + "\n")
                               .WithContext("zinf.checkpoint.dir: mark the swap directory"));
    }
  }
  std::unique_ptr<Checkpointer> c(new Checkpointer(o));
  // A resume in this root: checkpoints beyond `keep` (a run killed between a commit and its
  // pruning leaves one more) go now, before any step may rewrite what they name.
  if (o.resumed_step) ZINF_RETURN_IF_ERROR(c->Prune(*o.resumed_step));
  return c;
}

Status CheckSwapFilesFree(const std::vector<std::string>& swap_dirs, const std::string& resuming) {
  for (const std::string& dir : swap_dirs) {
    const fs::path marker = fs::path(dir) / kSwapOwnerFile;
    std::error_code ec;
    if (!fs::exists(marker, ec)) continue;
    auto text = ReadWholeFile(marker.string());
    if (!text.ok()) return text.status();
    std::string root = *text;
    while (!root.empty() && (root.back() == '\n' || root.back() == '\r')) root.pop_back();
    const std::string resumed =
        resuming.empty() ? "" : fs::weakly_canonical(resuming, ec).string();
    std::string latest;
    uint64_t latest_step = 0;
    for (const ckpt::CommittedCheckpoint& c : ckpt::Committed(root)) {
      auto m = ckpt::Read(c.dir);
      if (!m.ok()) continue;
      bool names_here = false;
      for (const ckpt::FileEntry& f : m->files) {
        if (f.kind != "swap") continue;
        for (const std::string& member : f.members.empty() ? std::vector<std::string>{f.name}
                                                           : f.members) {
          names_here |= fs::weakly_canonical(fs::path(member).parent_path(), ec) ==
                        fs::weakly_canonical(dir, ec);
        }
      }
      if (!names_here) continue;
      if (!resumed.empty() && fs::weakly_canonical(c.dir, ec).string() == resumed) return Status::Ok();
      if (latest.empty() || c.step > latest_step) {
        latest = c.dir;
        latest_step = c.step;
      }
    }
    if (!latest.empty()) {
      return FailedPrecondition(fmt::format(
          "swap directory {}: its swap file holds the optimizer state of the checkpoints under "
          "{} (the latest {}, step {}); a new run there would empty it. Resume with --resume {}, "
          "give this run another --swap-dir, or remove those checkpoints",
          dir, root, latest, latest_step, root));
    }
  }
  return Status::Ok();
}

Checkpointer::~Checkpointer() { Wait().IgnoreError(); }

Status Checkpointer::Save(LayerExecutor& ex, const TrainerState& st) {
  ZINF_RETURN_IF_ERROR(Wait());
  auto job = std::make_shared<Job>();
  job->step = st.step;
  job->dir = (fs::path(options_.root) / ckpt::CheckpointDirName(st.step)).string();
  ckpt::Manifest& m = job->manifest;
  m.step = st.step;
  Config recorded = options_.config;
  recorded.zinf.checkpoint.resume.clear();
  const json config = json::parse(recorded.ToJson().dump());
  m.model = config["zinf"]["model"];
  const RecordedRun& run = options_.run;
  m.training = {{"config", config},
                {"steps", run.steps_total},
                {"run",
                 {{"data", run.data},
                  {"val_data", run.val_data},
                  {"data_format", run.data_format},
                  {"synthetic_bytes", run.synthetic_bytes},
                  {"val_fraction", run.val_fraction},
                  {"eval_every", run.eval_every},
                  {"eval_batches", run.eval_batches}}},
                {"param16", recorded.precision() == Precision::kFp16 ? "fp16" : "bf16"},
                {"optimizer_state", options_.state_on_nvme ? "nvme" : "memory"},
                {"state_generations", options_.state_generations}};
  m.data = {{"train", DataJson(st)}};
  m.state = StateJson(st);
  executor_ = &ex;
  waiting_for_step_ = true;
  commit_step_ = st.step;
  commit_dir_ = job->dir;
  return ex.RequestCheckpoint(st.step, [this, job](Result<std::vector<UnitState>> units) {
    waiting_for_step_ = false;
    if (!units.ok()) {
      std::promise<Status> failed;
      failed.set_value(units.status().WithContext("checkpoint of step " +
                                                  std::to_string(job->step)));
      commit_ = failed.get_future().share();
      return;
    }
    commit_ = std::async(std::launch::async, [this, job, u = std::move(units).value()]() {
                return Write(*job, u, &commit_seconds_, &commit_bytes_);
              }).share();
    executor_->HoldStateUntil(commit_);
  });
}

Status Checkpointer::Wait() {
  if (waiting_for_step_) {
    // The step's optimizer still runs: finishing it starts the commit (or fails it).
    Status s = executor_->FinishOptimizerStep();
    if (waiting_for_step_) {
      waiting_for_step_ = false;
      return s.ok() ? Internal("checkpoint: the optimizer step ended without handing its state")
                    : s;
    }
  }
  if (!commit_.valid()) return Status::Ok();
  Status s = commit_.get();
  commit_ = {};
  if (!s.ok()) return s;
  ++stats_.committed;
  stats_.last_step = commit_step_.value_or(0);
  stats_.last_dir = commit_dir_;
  stats_.writer_seconds += commit_seconds_;
  stats_.last_writer_seconds = commit_seconds_;
  stats_.bytes_written += commit_bytes_;
  return s;
}

Result<double> Checkpointer::MeasurePlainCopy() {
  ZINF_RETURN_IF_ERROR(Wait());
  if (stats_.last_dir.empty()) return FailedPrecondition("plain copy: no checkpoint committed");
  ZINF_ASSIGN_OR_RETURN(ckpt::Manifest m, ckpt::Read(stats_.last_dir));
  const std::string tmp = (fs::path(options_.root) / ".plain-copy.tmp").string();
  const auto t0 = Clock::now();
  const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (out < 0) return Status::FromErrno(errno, "plain copy: create " + tmp);
  Status s;
  std::vector<char> buf(64 << 20);
  uint64_t in_file = 0, total = 0;
  for (const ckpt::ShardEntry& shard : m.shards) {
    const std::string path = m.PathOf(shard);
    const int in = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (in < 0) {
      s = Status::FromErrno(errno, "plain copy: open " + path);
      break;
    }
    for (uint64_t at = 0; at < shard.length && s.ok();) {
      const uint64_t n = std::min<uint64_t>(buf.size(), shard.length - at);
      s = PreadAll(in, buf.data(), n, shard.offset + at, path);
      if (s.ok()) s = PwriteAll(out, buf.data(), n, in_file, tmp);
      at += n;
      in_file += n;
      total += n;
      if (s.ok() && in_file >= kPlainCopyChunk) {
        // Durable, then the room given back: the next chunk overwrites from offset 0.
        if (::fdatasync(out) != 0 || ::ftruncate(out, 0) != 0) {
          s = Status::FromErrno(errno, "plain copy: sync " + tmp);
        }
        in_file = 0;
      }
    }
    ::close(in);
    if (!s.ok()) break;
  }
  if (s.ok() && ::fdatasync(out) != 0) s = Status::FromErrno(errno, "plain copy: sync " + tmp);
  ::close(out);
  ::unlink(tmp.c_str());
  ZINF_RETURN_IF_ERROR(s);
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ++stats_.plain_copies;
  stats_.plain_copy_bytes += total;
  stats_.plain_copy_seconds += secs;
  stats_.last_plain_copy_seconds = secs;
  return secs;
}

Status Checkpointer::Write(const Job& job, const std::vector<UnitState>& units, double* seconds,
                           uint64_t* bytes) {
  const auto t0 = Clock::now();
  *bytes = 0;
  std::error_code ec;
  const fs::path dir(job.dir);
  if (fs::exists(dir / ckpt::kManifestName, ec)) {
    return Internal(fmt::format("checkpoint {}: already committed", job.dir));
  }
  fs::remove_all(dir, ec);  // what a crashed writer left, never a committed checkpoint
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgument(fmt::format("checkpoint: cannot create {}: {}", job.dir, ec.message()));
  ckpt::Manifest m = job.manifest;
  if (options_.state_on_nvme) {
    const std::string& swap = options_.swap_files[0];
    uint64_t size = 0;  // of all members: shard offsets are logical
    for (const std::string& member : options_.swap_files) {
      size += fs::file_size(member, ec);
      if (ec) return Status::FromErrno(ec.value(), "stat swap file " + member);
    }
    ZINF_RETURN_IF_ERROR(executor_->SyncState().WithContext("checkpoint " + job.dir));
    ckpt::FileEntry file{.name = swap, .kind = "swap", .bytes = size};
    if (options_.swap_files.size() > 1) {
      file.members = options_.swap_files;
      file.stripe_bytes = options_.stripe_bytes;
    }
    m.files.push_back(file);
    for (const UnitState& u : units) {
      for (int r = 0; r < offload::kStateRoles; ++r) {
        m.shards.push_back({offload::kStateRoleNames[r], u.unit, "F32", {u.n}, swap, u.extents[r].offset, 4 * u.n,
                            u.hashes[r]});
      }
    }
  } else {
    const std::string path = (dir / kStateFileName).string();
    ZINF_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
    for (const UnitState& u : units) {
      for (int r = 0; r < offload::kStateRoles; ++r) {
        const uint64_t offset = f.size();
        ZINF_RETURN_IF_ERROR(f.Append(u.arrays[r], 4 * u.n));
        m.shards.push_back({offload::kStateRoleNames[r], u.unit, "F32", {u.n}, kStateFileName, offset, 4 * u.n,
                            Xxh64(u.arrays[r], 4 * u.n)});
      }
    }
    *bytes = f.size();
    m.files.push_back({kStateFileName, "data", f.size()});
    ZINF_RETURN_IF_ERROR(f.Commit());
  }
  ZINF_RETURN_IF_ERROR(ckpt::Commit(job.dir, m));
  ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
  ZINF_RETURN_IF_ERROR(Prune(job.step));
  if (options_.release_after_first_commit) {
    executor_->ReleaseCheckpoint(*std::exchange(options_.release_after_first_commit, {}));
  }
  *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return Status::Ok();
}

Status Checkpointer::Prune(uint64_t newest) {
  const auto committed = ckpt::Committed(options_.root);
  std::vector<std::string> doomed;
  size_t kept = 0;
  std::vector<uint64_t> released;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (it->step > newest) continue;  // Create refused these
    if (kept < options_.keep) {
      ++kept;
    } else {
      doomed.push_back(it->dir);
      released.push_back(it->step);
    }
  }
  // Directories named like checkpoints that never got their manifest: a crashed writer's.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(options_.root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !name.starts_with("step-")) continue;
    if (!fs::exists(e.path() / ckpt::kManifestName)) doomed.push_back(e.path().string());
  }
  for (const std::string& d : doomed) {
    fs::remove_all(d, ec);
    if (ec) return Status::FromErrno(ec.value(), "remove old checkpoint " + d);
  }
  if (!doomed.empty()) ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
  // Only now, with the manifests gone for good, may steps rewrite what they named.
  if (executor_ != nullptr) {
    for (uint64_t step : released) executor_->ReleaseCheckpoint(step);
  }
  return Status::Ok();
}

// ---- resume --------------------------------------------------------------------------------

Result<ckpt::Manifest> ReadForResume(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(std::string dir, ckpt::Resolve(path));
  return ckpt::Read(dir);
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

Status CheckResumable(const ckpt::Manifest& m, const Config& c,
                      const std::vector<std::string>& swap_files) {
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
  const std::string place = nvme ? "nvme" : "memory";
  if (m.training.value("optimizer_state", std::string()) != place) {
    problems.push_back(fmt::format(
        "zero_optimization.offload_optimizer.device: the optimizer state is in {} here, in {} "
        "in the checkpoint", place, m.training.value("optimizer_state", std::string("?"))));
  }
  if (m.world_size != 1) {
    problems.push_back(fmt::format("world size {} in the checkpoint, 1 here", m.world_size));
  }
  for (const ckpt::FileEntry& f : m.files) {
    if (f.kind != "swap") continue;
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
      if (then.value(key, json()) != now.value(key, json())) {
        Log().warn("resume: {} is {} here, {} in {}: the run will not match an uninterrupted "
                   "one bit for bit", key, now.value(key, json()).dump(),
                   then.value(key, json()).dump(), where);
      }
    }
    for (const char* key : {"seed", "overlap_adam"}) {
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

Result<std::vector<StateShardSet>> StateShardsByUnit(const ckpt::Manifest& m, const GptDims& d) {
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
    const uint64_t n = d.UnitParams(s.unit);
    if (s.dtype != "F32" || s.length != 4 * n) {
      return InvalidArgument(fmt::format(
          "{}: shard {} of unit {} ({}) is {} bytes of {}; expected {} bytes of F32", where,
          s.role, s.unit, d.UnitName(s.unit), s.length, s.dtype, 4 * n));
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
  const GptDims& d = ex.dims();
  const uint32_t units = d.units();
  const std::string where = ManifestPath(m);
  ZINF_ASSIGN_OR_RETURN(const std::vector<StateShardSet> by_unit, StateShardsByUnit(m, d));
  std::vector<float> arrays[offload::kStateRoles];
  for (uint32_t u = 0; u < units; ++u) {
    const uint64_t n = d.UnitParams(u);
    UnitState st;
    st.unit = u;
    st.n = n;
    for (int r = 0; r < offload::kStateRoles; ++r) {
      const ckpt::ShardEntry* s = by_unit[u][r];
      st.hashes[r] = s->xxh64;
      const ckpt::FileEntry* f = m.FindFile(s->file);
      if (f != nullptr && f->kind == "swap") {
        st.extents[r] = {s->offset, s->length};
        continue;
      }
      const std::string path = m.PathOf(*s);
      arrays[r].resize(n);
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) return Status::FromErrno(errno, "open checkpoint file " + path);
      Status rd = PreadAll(fd, arrays[r].data(), 4 * n, s->offset, path);
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
