#include "src/train/checkpoint.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <filesystem>
#include <thread>

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


// A state role's dtype name in the manifest (F32 master weights; F32 or BF16 moments).
std::string StateDtypeName(int role, kernels::DType moments) {
  return offload::StateRoleType(role, moments) == kernels::DType::kBf16 ? "BF16" : "F32";
}

}  // namespace

struct Checkpointer::Job {
  uint64_t step = 0;
  std::string dir;       // where this rank's manifest goes: the step's directory, or its part
  std::string step_dir;  // the step's directory
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
  if (o.world > 1) {
    // This rank's parts of checkpoints never committed (a run that failed before rank 0 wrote
    // the manifest) go before any rank writes: rank 0 must never take one for a new part. (No
    // rank saves before every rank is past this: the first step's collectives.)
    for (const auto& e : fs::directory_iterator(o.root, ec)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory() || !ckpt::StepOfDirName(name)) continue;
      if (fs::exists(e.path() / ckpt::kManifestName)) continue;
      const fs::path part = e.path() / ckpt::RankPartDirName(o.rank);
      fs::remove_all(part, ec);
      if (ec) return Status::FromErrno(ec.value(), "remove uncommitted part " + part.string());
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
      std::vector<ckpt::Manifest> parts;  // across ranks: every rank's part
      if (m->HasParts()) {
        for (uint32_t r = 0; r < m->world_size; ++r) {
          if (auto p = ckpt::ReadPart(*m, r); p.ok()) parts.push_back(*std::move(p));
        }
      } else {
        parts.push_back(*m);
      }
      bool names_here = false;
      for (const ckpt::Manifest& part : parts) {
        for (const ckpt::FileEntry& f : part.files) {
          if (f.kind != "swap") continue;
          for (const std::string& member :
               f.members.empty() ? std::vector<std::string>{f.name} : f.members) {
            names_here |= fs::weakly_canonical(fs::path(member).parent_path(), ec) ==
                          fs::weakly_canonical(dir, ec);
          }
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
  job->step_dir = (fs::path(options_.root) / ckpt::CheckpointDirName(st.step)).string();
  job->dir = options_.world > 1
                 ? (fs::path(job->step_dir) / ckpt::RankPartDirName(options_.rank)).string()
                 : job->step_dir;
  ckpt::Manifest& m = job->manifest;
  m.step = st.step;
  m.world_size = options_.world;
  m.partition = options_.partition;
  m.chunks = options_.chunks;
  if (options_.world > 1) m.rank = options_.rank;
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
                {"optimizer_state", !options_.state_placement.empty()
                                        ? options_.state_placement
                                        : options_.state_on_nvme ? "nvme" : "memory"},
                {"optimizer_state_dtype", recorded.zinf.optimizer_state_dtype},
                {"state_generations", options_.state_generations}};
  if (!options_.state_in_memory_units.empty() && options_.state_placement == "mixed") {
    m.training["optimizer_state_in_memory"] = options_.state_in_memory_units;
  }
  m.data = {{"train", DataJson(st)}};
  m.state = StateJson(st);
  executor_ = &ex;
  waiting_for_step_ = true;
  commit_step_ = st.step;
  commit_dir_ = job->step_dir;
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
  if (m.HasParts()) {
    ZINF_ASSIGN_OR_RETURN(m, ckpt::ReadPart(m, options_.rank));  // this rank's part
  }
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
  if (fs::exists(fs::path(job.step_dir) / ckpt::kManifestName, ec)) {
    return Internal(fmt::format("checkpoint {}: already committed", job.step_dir));
  }
  fs::remove_all(dir, ec);  // what a crashed writer left, never a committed checkpoint
  fs::create_directories(dir, ec);
  if (ec) return InvalidArgument(fmt::format("checkpoint: cannot create {}: {}", job.dir, ec.message()));
  ckpt::Manifest m = job.manifest;
  // Units on NVMe are named where they lie in the swap file; units in memory go to state.bin.
  bool any_nvme = false, any_memory = false;
  for (const UnitState& u : units) (u.arrays[0] != nullptr ? any_memory : any_nvme) = true;
  if (any_nvme) {
    if (!options_.state_on_nvme) {
      return Internal(fmt::format("checkpoint {}: state on NVMe but no swap files given", job.dir));
    }
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
  }
  std::optional<AtomicFile> state_file;
  if (any_memory) {
    ZINF_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create((dir / kStateFileName).string()));
    state_file.emplace(std::move(f));
  }
  for (const UnitState& u : units) {
    for (int r = 0; r < offload::kStateRoles; ++r) {
      const uint64_t bytes = offload::StateRoleBytes(r, u.n, u.moment_type);
      if (u.arrays[r] == nullptr) {
        m.shards.push_back({offload::kStateRoleNames[r], u.unit, StateDtypeName(r, u.moment_type),
                            {u.n}, options_.swap_files[0], u.extents[r].offset, bytes,
                            u.hashes[r]});
        continue;
      }
      const uint64_t offset = state_file->size();
      ZINF_RETURN_IF_ERROR(state_file->Append(u.arrays[r], bytes));
      m.shards.push_back({offload::kStateRoleNames[r], u.unit, StateDtypeName(r, u.moment_type),
                          {u.n}, kStateFileName, offset, bytes, Xxh64(u.arrays[r], bytes)});
    }
  }
  if (state_file) {
    *bytes = state_file->size();
    m.files.push_back({kStateFileName, "data", state_file->size()});
    ZINF_RETURN_IF_ERROR(state_file->Commit());
  }
  ZINF_RETURN_IF_ERROR(ckpt::Commit(job.dir, m));
  if (options_.world > 1) {
    ZINF_RETURN_IF_ERROR(FsyncDirectory(job.step_dir));
    ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
    ZINF_RETURN_IF_ERROR(CommitAcrossRanks(job));
  } else {
    ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
  }
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
  std::vector<uint64_t> kept_steps;
  std::vector<uint64_t> released;
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (it->step > newest) continue;  // Create refused these
    if (kept_steps.size() < options_.keep) {
      kept_steps.push_back(it->step);
    } else {
      doomed.push_back(it->dir);
      released.push_back(it->step);
    }
  }
  // Directories named like checkpoints that never got their manifest and are older than the
  // newest: a crashed writer's (across ranks a newer one may be another rank's part in the
  // making).
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(options_.root, ec)) {
    const std::optional<uint64_t> step = ckpt::StepOfDirName(e.path().filename().string());
    if (!e.is_directory() || !step || *step >= newest) continue;
    if (!fs::exists(e.path() / ckpt::kManifestName)) doomed.push_back(e.path().string());
  }
  // Across ranks only rank 0 removes (the others' parts go with their step's directory).
  if (options_.rank == 0) {
    for (const std::string& d : doomed) {
      // The manifest first: a checkpoint half removed is not a committed one.
      fs::remove(fs::path(d) / ckpt::kManifestName, ec);
      fs::remove_all(d, ec);
      // Another rank may be removing its uncommitted part inside d at this moment (Create at
      // its start): what vanished under remove_all is gone either way, so go again once.
      if (ec == std::errc::no_such_file_or_directory) fs::remove_all(d, ec);
      if (ec) return Status::FromErrno(ec.value(), "remove old checkpoint " + d);
    }
    if (!doomed.empty()) ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
  }
  // Only now, with the manifests gone for good, may steps rewrite what they named. Across
  // ranks another rank may already have removed some from the listing: every checkpoint this
  // executor protects but the ones kept is released.
  if (executor_ != nullptr) {
    if (options_.world > 1) {
      for (uint64_t id : executor_->ProtectedCheckpoints()) {
        if (std::find(kept_steps.begin(), kept_steps.end(), id) == kept_steps.end()) {
          released.push_back(id);
        }
      }
    }
    for (uint64_t step : released) executor_->ReleaseCheckpoint(step);
  }
  return Status::Ok();
}

Status Checkpointer::CommitAcrossRanks(const Job& job) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.part_timeout_seconds));
  const fs::path step_dir(job.step_dir);
  // Waits until every path exists; else names the missing ones.
  auto wait_for = [&](const std::vector<std::pair<uint32_t, fs::path>>& paths,
                      const char* what) -> Status {
    for (;;) {
      std::vector<uint32_t> missing;
      std::error_code ec;
      for (const auto& [rank, path] : paths) {
        if (!fs::exists(path, ec)) missing.push_back(rank);
      }
      if (missing.empty()) return Status::Ok();
      if (Clock::now() >= deadline) {
        return Aborted(fmt::format(
            "checkpoint {}: {} of rank(s) {} not there after {} s "
            "(zinf.comm.timeout_seconds): a rank failed or is stuck",
            job.step_dir, what, fmt::join(missing, ", "), options_.part_timeout_seconds));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  };
  if (options_.rank == 0) {
    std::vector<std::pair<uint32_t, fs::path>> parts;
    for (uint32_t r = 0; r < options_.world; ++r) {
      parts.emplace_back(r, step_dir / ckpt::RankPartDirName(r) / ckpt::kManifestName);
    }
    ZINF_RETURN_IF_ERROR(wait_for(parts, "the part"));
    ckpt::Manifest global = job.manifest;
    global.rank.reset();
    for (uint32_t r = 0; r < options_.world; ++r) {
      ZINF_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(parts[r].second.string()));
      global.parts.push_back({r, ckpt::RankPartDirName(r), Xxh64(text.data(), text.size())});
    }
    ZINF_RETURN_IF_ERROR(ckpt::Commit(job.step_dir, global));
    ZINF_RETURN_IF_ERROR(FsyncDirectory(options_.root));
    return Status::Ok();
  }
  return wait_for({{0, step_dir / ckpt::kManifestName}}, "the checkpoint's manifest (rank 0 "
                  "commits it once every part is there): rank");
}

}  // namespace zinf::train
