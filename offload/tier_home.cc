// TierManager: a shard's home — writes and reads of it through the tier's slots (WriteHome,
// BeginHomeWrite / EndHomeWrite, ReadHome), a home rewritten behind the manager (BeginRewrite,
// HomeRewritten, InstallPending's EndPending), and copies invalidated or discarded. Residency
// records: tier_manager_internal.h; leases and the plan: tier_manager.cc; transfers:
// tier_mover.cc; eviction: tier_eviction.cc.
#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "offload/tier_manager.h"
#include "offload/tier_manager_internal.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::offload {

using Clock = std::chrono::steady_clock;

Status TierManager::WriteHome(ShardId id, const void* src) {
  ZINF_RETURN_IF_ERROR(EnsureSealed());
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  for (;;) {
    // A transfer in flight (a prefetch, a write-back) is waited for; a lease is an error.
    WaitTransfers(lock, s);
    for (auto& c : s.copy) {
      if (c.pins > 0) {
        return FailedPrecondition(fmt::format("WriteHome({}): the shard is leased", s.spec.name));
      }
    }
    if (s.spec.derive) {
      return FailedPrecondition(fmt::format(
          "WriteHome({}): the shard is derived (its content is computed from its source: "
          "BeginRewrite, change the source, then Invalidate)", s.spec.name));
    }
    if (s.spec.home == Tier::kHost) {
      lock.unlock();
      ZINF_ASSIGN_OR_RETURN(void* home, BeginHomeWrite(id));
      std::memcpy(home, src, s.spec.bytes);
      EndHomeWrite(id);
      return Status::Ok();
    }
    FreeCopy(id, Tier::kDevice);
    FreeCopy(id, Tier::kHost);
    Slot slot;
    ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kHost, id, false, trace_.pos(), &slot));
    Copy& h = s.copy[kHostIdx];
    if (h.state != Copy::kAbsent || s.copy[kDev].state != Copy::kAbsent) {
      GiveSlot(id, Tier::kHost, std::move(slot));  // someone loaded the old content meanwhile
      continue;
    }
    // The slot becomes the host copy, written through to home, then kept clean. Loading while
    // it is filled (a device load waits for it), Writing while the home write runs.
    h.slot = std::move(slot);
    h.ptr = h.slot.ptr;
    h.state = Copy::kLoading;
    h.pins++;
    lock.unlock();
    std::memcpy(h.ptr, src, s.spec.bytes);
    std::memset(static_cast<uint8_t*>(h.ptr) + s.spec.bytes, 0, s.host_bytes - s.spec.bytes);
    lock.lock();
    h.state = Copy::kWriting;
    if (s.device_wants_host) StartHostToDevice(id);
    cv_.notify_all();
    lock.unlock();
    Status st = swap_->engine().Write(swap_->file(), s.extent.offset, h.ptr, s.host_bytes);
    lock.lock();
    h.pins--;
    h.state = Copy::kReady;
    Touch(h);
    if (!st.ok()) {
      // The home's content is unknown: trust no copy of the shard.
      for (Tier t : {Tier::kDevice, Tier::kHost}) DropOrMarkStale(id, t);
    } else {
      stats_.nvme_write_bytes += s.host_bytes;
    }
    cv_.notify_all();
    return st.ok() ? st : st.WithContext(fmt::format("WriteHome({})", s.spec.name));
  }
}

Result<void*> TierManager::BeginHomeWrite(ShardId id) {
  ZINF_RETURN_IF_ERROR(EnsureSealed());
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  if (s.spec.home != Tier::kHost) {
    return FailedPrecondition(fmt::format(
        "BeginHomeWrite({}): the home is on NVMe (WriteHome writes it through)", s.spec.name));
  }
  WaitTransfers(lock, s);
  for (auto& c : s.copy) {
    if (c.pins > 0) {
      return FailedPrecondition(fmt::format("BeginHomeWrite({}): the shard is leased",
                                            s.spec.name));
    }
  }
  FreeCopy(id, Tier::kDevice);
  // The home is its host copy: marked loading while the caller fills it, so that a device load
  // (a prefetch) reserves its slot and waits for EndHomeWrite to start the copy.
  Copy& h = s.copy[kHostIdx];
  h.state = Copy::kLoading;
  h.pins++;
  return h.ptr;
}

void TierManager::EndHomeWrite(ShardId id) {
  std::lock_guard lock(mu_);
  if (id >= shards_.size() || shards_[id]->copy[kHostIdx].state != Copy::kLoading ||
      shards_[id]->spec.home != Tier::kHost) {
    Log().critical("tier: EndHomeWrite({}) without a BeginHomeWrite (a bug)", id);
    Log().flush();
    std::abort();
  }
  Shard& s = *shards_[id];
  Copy& h = s.copy[kHostIdx];
  h.pins--;
  h.state = Copy::kReady;
  h.stale = false;  // the home holds the newest content now
  h.dirty = false;
  Touch(h);
  if (s.device_wants_host) StartHostToDevice(id);
  cv_.notify_all();
}

Status TierManager::ReadHome(ShardId id, void* dst) {
  ZINF_RETURN_IF_ERROR(EnsureSealed());
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  Copy& h = s.copy[kHostIdx];
  if (s.spec.home == Tier::kHost) {
    // Not while BeginHomeWrite lends it: a read then would mix old and new bytes.
    cv_.wait(lock, [&] { return h.state != Copy::kLoading; });
    std::memcpy(dst, h.ptr, s.spec.bytes);
    return Status::Ok();
  }
  if (s.spec.derive) {
    // Computed again (BeginRewrite waits for it); not while the source is being changed.
    if (s.rewrite_pending) {
      return FailedPrecondition(fmt::format(
          "ReadHome({}): it is derived and its source is being changed", s.spec.name));
    }
    s.deriving++;
    lock.unlock();
    Status st = s.spec.derive(dst);
    lock.lock();
    s.deriving--;
    cv_.notify_all();
    return st.ok() ? st : st.WithContext(fmt::format("ReadHome({}): deriving it", s.spec.name));
  }
  if (h.state == Copy::kReady && !h.dirty && !h.stale) {
    // A clean host copy holds what the home holds: read it, pinned meanwhile.
    h.pins++;
    void* src = h.ptr;
    lock.unlock();
    std::memcpy(dst, src, s.spec.bytes);
    lock.lock();
    h.pins--;
    cv_.notify_all();
    return Status::Ok();
  }
  // The home itself, through a slot of the shard's class taken for the read.
  Slot slot;
  ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kHost, id, false, trace_.pos(), &slot));
  lock.unlock();
  Status st = swap_->engine().Read(swap_->file(), s.extent.offset, slot.ptr, s.host_bytes);
  if (st.ok()) std::memcpy(dst, slot.ptr, s.spec.bytes);
  lock.lock();
  GiveSlot(id, Tier::kHost, std::move(slot));
  if (st.ok()) stats_.nvme_read_bytes += s.host_bytes;
  cv_.notify_all();
  return st.ok() ? st : st.WithContext(fmt::format("ReadHome({})", s.spec.name));
}

Status TierManager::Invalidate(ShardId id) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  WaitTransfers(lock, s);
  for (auto& c : s.copy) {
    if (c.pins > 0 || c.dirty) {
      return FailedPrecondition(fmt::format(
          "Invalidate({}): a copy is {}", s.spec.name, c.pins > 0 ? "leased" : "dirty"));
    }
  }
  FreeCopy(id, Tier::kDevice);
  FreeCopy(id, Tier::kHost);
  s.rewrite_pending = false;
  cv_.notify_all();
  return Status::Ok();
}

void TierManager::BeginRewrite(ShardId id) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return;
  Shard& s = *shards_[id];
  s.rewrite_pending = true;
  // A derivation in flight reads the source the caller is about to change. A write-back in
  // flight (to NVMe, or the device's copy to the host) carries old content that must not land
  // after the caller's home write; none starts from now (WriteBack drops it as outdated).
  cv_.wait(lock, [&] {
    return s.deriving == 0 && s.copy[kHostIdx].state != Copy::kWriting &&
           s.copy[kDev].state != Copy::kWriting;
  });
}

void TierManager::DropOrMarkStale(ShardId id, Tier tier) {
  Copy& c = shards_[id]->copy[static_cast<int>(tier)];
  if (c.state == Copy::kAbsent) return;
  if (c.state == Copy::kReady && c.pins == 0) {
    FreeCopy(id, tier);
  } else {
    c.stale = true;
  }
}

void TierManager::EndPending(ShardId id, bool home_written) {
  std::lock_guard lock(mu_);
  if (id >= shards_.size()) return;
  if (!home_written) shards_[id]->rewrite_pending = false;
  if (!shards_[id]->pending) return;
  EndPendingLocked(id, home_written);
}

void TierManager::EndPendingLocked(ShardId id, bool home_written) {
  Shard& s = *shards_[id];
  s.pending = false;
  Copy& h = s.copy[kHostIdx];
  h.pins--;
  if (!home_written) {
    for (Tier t : {Tier::kDevice, Tier::kHost}) DropOrMarkStale(id, t);
  }
  cv_.notify_all();
}

void TierManager::HomeRewritten(ShardId id) {
  std::lock_guard lock(mu_);
  if (id >= shards_.size()) return;
  Shard& s = *shards_[id];
  s.rewrite_pending = false;
  if (s.pending) {
    EndPendingLocked(id, true);  // every copy now was made from the new content
    return;
  }
  for (Tier t : {Tier::kDevice, Tier::kHost}) {
    Copy& c = s.copy[static_cast<int>(t)];
    if (c.state == Copy::kAbsent || (t == Tier::kHost && s.spec.home == Tier::kHost)) continue;
    c.dirty = false;  // older than the home now
    DropOrMarkStale(id, t);
  }
  cv_.notify_all();
}

Status TierManager::Discard(ShardId id) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  WaitTransfers(lock, s);
  for (auto& c : s.copy) {
    if (c.pins > 0) {
      return FailedPrecondition(fmt::format("Discard({}): a copy is leased", s.spec.name));
    }
  }
  for (auto& c : s.copy) c.dirty = false;
  FreeCopy(id, Tier::kDevice);
  FreeCopy(id, Tier::kHost);
  stats_.discards++;
  cv_.notify_all();
  return Status::Ok();
}

}  // namespace zinf::offload
