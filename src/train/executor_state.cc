#include "src/train/executor.h"

// The layer executor's optimizer state for checkpoints: what a checkpoint records
// (CheckpointState), putting it back (RestoreState), and the generations that keep a
// checkpoint's NVMe extents untouched.
#include <fmt/format.h>

#include <cstring>

#include "kernels/cpu/cast.h"
#include "src/base/hash.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

namespace {

// The xxHash64 of `bytes` zero bytes (the moments after SetUnitWeights).
uint64_t ZeroHash(uint64_t bytes) {
  static const std::vector<uint8_t> zeros(1 << 16, 0);
  Xxh64Stream s;
  while (bytes > 0) {
    const uint64_t b = std::min<uint64_t>(bytes, zeros.size());
    s.Update(zeros.data(), b);
    bytes -= b;
  }
  return s.Digest();
}

}  // namespace

const offload::Extent& LayerExecutor::StateExtent(uint32_t unit, int role) const {
  return state_ext_[cur_gen_[unit]][unit][role];
}

bool LayerExecutor::Protected(uint32_t unit, int gen) const {
  std::lock_guard<std::mutex> lock(protect_mu_);
  for (const auto& [id, gens] : protections_) {
    if (gens[unit] == gen) return true;
  }
  return false;
}

Result<int> LayerExecutor::WriteGeneration(uint32_t unit) const {
  const int cur = cur_gen_[unit];
  if (!Protected(unit, cur)) return cur;
  const int gens = static_cast<int>(state_ext_.size());
  for (int k = 1; k < gens; ++k) {
    const int g = (cur + k) % gens;
    if (!Protected(unit, g)) return g;
  }
  return FailedPrecondition(fmt::format(
      "optimizer state of unit {} ({}): checkpoints name all {} generations of it in the swap "
      "file, and a step must write one they do not (zinf.checkpoint.keep + 1 are kept)",
      unit, model_.UnitName(unit), gens));
}

Result<bool> LayerExecutor::TakeUnprotectedGeneration(uint32_t unit) {
  ZINF_ASSIGN_OR_RETURN(const int g, WriteGeneration(unit));
  if (g == cur_gen_[unit]) return false;
  cur_gen_[unit] = static_cast<uint8_t>(g);
  return true;
}

std::vector<uint64_t> LayerExecutor::ProtectedCheckpoints() const {
  std::lock_guard<std::mutex> lock(protect_mu_);
  std::vector<uint64_t> ids;
  for (const auto& [id, gens] : protections_) ids.push_back(id);
  return ids;
}

void LayerExecutor::ReleaseCheckpoint(uint64_t id) {
  std::lock_guard<std::mutex> lock(protect_mu_);
  protections_.erase(id);
}

Status LayerExecutor::ProtectCheckpoint(uint64_t id, const std::vector<UnitState>& units) {
  std::vector<int8_t> gens(model_.units(), -1);
  for (const UnitState& s : units) {
    if (s.unit >= model_.units()) {
      return InvalidArgument(fmt::format("protect checkpoint {}: unit {} out of range", id, s.unit));
    }
    if (!StateOnNvme(s.unit)) continue;  // in memory here: no extents to keep
    int gen = -1;
    for (int g = 0; g < static_cast<int>(state_ext_.size()) && gen < 0; ++g) {
      bool same = true;
      for (int r = 0; r < offload::kStateRoles; ++r) {
        same = same && state_ext_[g][s.unit][r].offset == s.extents[r].offset &&
               state_ext_[g][s.unit][r].bytes == s.extents[r].bytes;
      }
      if (same) gen = g;
    }
    if (gen < 0) {
      return InvalidArgument(fmt::format(
          "checkpoint of step {}: unit {} ({}): its master extent (offset {}, {} bytes) is not "
          "where this run keeps that unit's optimizer state", id, s.unit,
          model_.UnitName(s.unit), s.extents[0].offset, s.extents[0].bytes));
    }
    gens[s.unit] = static_cast<int8_t>(gen);
  }
  std::lock_guard<std::mutex> lock(protect_mu_);
  protections_[id] = std::move(gens);
  return Status::Ok();
}

void LayerExecutor::NoteWeightsSet(uint32_t unit, const float* master) {
  const uint64_t n = StateElems(unit);  // master: the state's part of the unit
  if (!StateOnNvme(unit)) {
    hashes_known_[unit] = 0;  // memory is hashed when a checkpoint writes it
    return;
  }
  const uint64_t zero = ZeroHash(StateBytes(unit, offload::kExpAvgState));
  hashes_[unit] = {Xxh64(master, 4 * n), zero, zero};
  hashes_known_[unit] = 1;
}

Status LayerExecutor::ReadStateRole(uint32_t unit, int role, uint8_t* dst) {
  const offload::Extent& e = StateExtent(unit, role);
  return rt_.swap->engine().Read(rt_.swap->file(), e.offset, dst,
                                 rt_.swap->Padded(StateBytes(unit, role)));
}

Status LayerExecutor::RequestCheckpoint(uint64_t id, CheckpointReadyFn ready) {
  if (pending_checkpoint_)
    return FailedPrecondition("a checkpoint is already waiting for the step");
  if (opt_running_) {
    pending_checkpoint_ = std::move(ready);
    pending_checkpoint_id_ = id;
    return Status::Ok();
  }
  ready(TakeCheckpointState(id));
  return Status::Ok();
}

Status LayerExecutor::SyncState() const {
  return rt_.swap != nullptr ? rt_.swap->Sync() : Status::Ok();
}

Result<std::vector<UnitState>> LayerExecutor::TakeCheckpointState(uint64_t id) {
  std::vector<UnitState> out;
  const uint32_t units = model_.units();
  bool any_nvme = false;
  for (uint32_t u = 0; u < units; ++u) any_nvme = any_nvme || StateOnNvme(u);
  if (any_nvme && state_ext_.size() < 2) {
    return FailedPrecondition(
        "a checkpoint of optimizer state on NVMe needs two generations of it "
        "(ExecutorOptions::state_generations)");
  }
  if (any_nvme) {
    // Units whose state no step hashed (a step without HashNextOptimizerStep): read back.
    uint8_t* slab = BounceBuffer();
    for (uint32_t u = 0; u < units; ++u) {
      if (hashes_known_[u] || !StateOnNvme(u)) continue;
      for (int r = 0; r < offload::kStateRoles; ++r) {
        ZINF_RETURN_IF_ERROR(ReadStateRole(u, r, slab));
        hashes_[u][r] = Xxh64(slab, StateBytes(u, r));
      }
      hashes_known_[u] = 1;
    }
    std::vector<int8_t> gens(units, -1);
    for (uint32_t u = 0; u < units; ++u) {
      if (StateOnNvme(u)) gens[u] = static_cast<int8_t>(cur_gen_[u]);
    }
    std::lock_guard<std::mutex> lock(protect_mu_);
    protections_[id] = std::move(gens);
  }
  for (uint32_t u = 0; u < units; ++u) {
    UnitState s;
    s.unit = u;
    s.n = StateElems(u);
    s.moment_type = options_.moment_type;
    if (StateOnNvme(u)) {
      s.extents = state_ext_[cur_gen_[u]][u];
      s.hashes = hashes_[u];
    } else {
      s.arrays = {master_[u].data(), exp_avg_[u].data(), exp_avg_sq_[u].data()};
      // hashes: computed by whoever writes the arrays
    }
    out.push_back(s);
  }
  return out;
}

Status LayerExecutor::StateMismatch(uint32_t u, int role, uint64_t got, uint64_t recorded,
                                    const std::string& where) const {
  return DataLoss(fmt::format(
      "optimizer state of unit {} ({}), {}: xxHash64 {} where the checkpoint recorded {} "
      "({}): the data is corrupt; nothing was trained on it",
      u, model_.UnitName(u), offload::kStateRoleNames[role], Xxh64Hex(got), Xxh64Hex(recorded),
      where));
}

Result<uint16_t*> LayerExecutor::RestoreFromExtents(const UnitState& s, uint64_t id) {
  const uint32_t u = s.unit;
  const uint32_t count = model_.units();
  const uint64_t n = StateElems(u);
  int gen = -1;
  for (int g = 0; g < static_cast<int>(state_ext_.size()) && gen < 0; ++g) {
    bool same = true;
    for (int r = 0; r < offload::kStateRoles; ++r) {
      same = same && state_ext_[g][u][r].offset == s.extents[r].offset &&
             state_ext_[g][u][r].bytes == s.extents[r].bytes;
    }
    if (same) gen = g;
  }
  if (gen < 0) {
    return InvalidArgument(fmt::format(
        "restore: unit {} ({}): the checkpoint's master extent (offset {}, {} bytes) is not "
        "where this run keeps that unit's optimizer state; the model, the swap file or "
        "zinf.checkpoint settings differ from the run that wrote the checkpoint",
        u, model_.UnitName(u), s.extents[0].offset, s.extents[0].bytes));
  }
  cur_gen_[u] = static_cast<uint8_t>(gen);
  {
    std::lock_guard<std::mutex> lock(protect_mu_);
    std::vector<int8_t>& gens = protections_[id];
    gens.resize(count, -1);
    gens[u] = static_cast<int8_t>(gen);
  }
  uint8_t* slab = BounceBuffer();
  const auto layout = pipeline_->LayoutFor(n);
  const uint64_t at[offload::kStateRoles] = {layout.master, layout.exp_avg, layout.exp_avg_sq};
  for (int r = 0; r < offload::kStateRoles; ++r) {
    ZINF_RETURN_IF_ERROR(ReadStateRole(u, r, slab + at[r]));
    const uint64_t got = Xxh64(slab + at[r], StateBytes(u, r));
    if (got != s.hashes[r]) {
      const std::string& file = rt_.swap->swap_file().members()[0]->path();
      return StateMismatch(u, r, got, s.hashes[r],
                           fmt::format("{} at offset {}", file, s.extents[r].offset));
    }
  }
  uint16_t* p16 = reinterpret_cast<uint16_t*>(slab + layout.param16);
  ZINF_RETURN_IF_ERROR(kernels::CastFromF32(reinterpret_cast<const float*>(slab + layout.master),
                                            p16, options_.param16_type, n));
  hashes_[u] = s.hashes;
  hashes_known_[u] = 1;
  return p16;
}

Status LayerExecutor::RestoreUnit(const UnitState& s, uint64_t id) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  ZINF_RETURN_IF_ERROR(WaitStateHold());
  const uint32_t count = model_.units();
  if (s.unit >= count) {
    return InvalidArgument(
        fmt::format("restore: unit {} out of range (the model has {})", s.unit, count));
  }
  const uint32_t u = s.unit;
  const uint64_t n = StateElems(u);  // this rank's chunk with ZeRO-1/2
  if (s.n != n) {
    return InvalidArgument(
        fmt::format("restore: unit {} ({}) has {} parameters of optimizer state on this rank, "
                    "the state given {}",
                    u, model_.UnitName(u), n, s.n));
  }
  if (s.moment_type != options_.moment_type) {
    return InvalidArgument(fmt::format(
        "restore: unit {} ({}): the state's moments are {} but this run keeps them in {} "
        "(zinf.optimizer_state_dtype); resume with the setting the checkpoint was written with",
        u, model_.UnitName(u), kernels::DTypeName(s.moment_type),
        kernels::DTypeName(options_.moment_type)));
  }
  auto mismatch = [&](int r, uint64_t got, const std::string& where) {
    return StateMismatch(u, r, got, s.hashes[r], where);
  };
  uint16_t* p16 = p16_staging_.data();
  if (StateOnNvme(u) && s.arrays[0] != nullptr) {
    // Arrays for a unit kept on NVMe: checked, then written home as SetUnitWeights writes.
    for (int r = 0; r < offload::kStateRoles; ++r) {
      if (s.arrays[r] == nullptr) {
        return InvalidArgument(fmt::format("restore: unit {} ({}): no {} array", u,
                                           model_.UnitName(u), offload::kStateRoleNames[r]));
      }
      const uint64_t got = Xxh64(s.arrays[r], StateBytes(u, r));
      if (got != s.hashes[r]) {
        return mismatch(r, got, s.sources[r].empty() ? std::string("as read from the checkpoint")
                                                     : "as read from " + s.sources[r]);
      }
    }
    ZINF_RETURN_IF_ERROR(TakeUnprotectedGeneration(u).status());
    for (int r = 0; r < offload::kStateRoles; ++r) {
      ZINF_RETURN_IF_ERROR(WriteNvme(StateExtent(u, r), s.arrays[r], StateBytes(u, r)));
    }
    // The 16-bit copy in the bounce slab's param16 part (the writes above used its start).
    p16 = reinterpret_cast<uint16_t*>(BounceBuffer() + pipeline_->LayoutFor(n).param16);
    ZINF_RETURN_IF_ERROR(kernels::CastFromF32(static_cast<const float*>(s.arrays[0]), p16,
                                              options_.param16_type, n));
    hashes_[u] = s.hashes;
    hashes_known_[u] = 1;
  } else if (StateOnNvme(u)) {
    ZINF_ASSIGN_OR_RETURN(p16, RestoreFromExtents(s, id));
  } else {
    void* dst[offload::kStateRoles] = {master_[u].data(), exp_avg_[u].data(), exp_avg_sq_[u].data()};
    for (int r = 0; r < offload::kStateRoles; ++r) {
      if (s.arrays[r] == nullptr) {
        return InvalidArgument(fmt::format(
            "restore: unit {} ({}) names NVMe extents but this run keeps its optimizer state "
            "in memory",
            u, model_.UnitName(u)));
      }
      const uint64_t got = Xxh64(s.arrays[r], StateBytes(u, r));
      if (got != s.hashes[r]) {
        return mismatch(r, got, s.sources[r].empty() ? std::string("as read from the checkpoint")
                                                     : "as read from " + s.sources[r]);
      }
    }
    BeginMasterWrite(u);
    for (int r = 0; r < offload::kStateRoles; ++r) {
      std::memcpy(dst[r], s.arrays[r], StateBytes(u, r));
    }
    ZINF_RETURN_IF_ERROR(kernels::CastFromF32(master_[u].data(), p16, options_.param16_type, n));
    hashes_known_[u] = 0;
  }
  moments_zero_at_home_ = false;
  // ZeRO-1/2: the chunk's 16-bit weights, gathered from every rank's (a collective: every rank
  // restores the units in the same order).
  if (Partitioned()) return GatherParam16(u, p16);
  ZINF_RETURN_IF_ERROR(Param16Changed(u, p16));
  return Status::Ok();
}

uint64_t LayerExecutor::SwapStripeBytes() const {
  if (rt_.swap == nullptr || rt_.swap->swap_file().members().size() < 2) return 0;
  return rt_.swap->swap_file().stripe_bytes();
}

std::vector<std::string> LayerExecutor::SwapFilePaths() const {
  if (rt_.swap == nullptr) return {};
  return rt_.swap->Paths();
}

}  // namespace zinf::train
