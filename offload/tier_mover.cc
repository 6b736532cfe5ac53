// TierManager's mover: slots given back, loads from NVMe and over the h2d link, derivations,
// write-backs, prefetch and installs (taking a slot and evicting: tier_eviction.cc). Every function here but DeriveLoop (the
// derive thread's body, which takes it itself) REQUIRES mu_ held; completion callbacks take it
// themselves and make no device call (device.h's rules).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "offload/tier_manager.h"
#include "offload/tier_manager_internal.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::offload {

using Clock = std::chrono::steady_clock;

void TierManager::LinkBusy(int link, int delta) {
  auto now = Clock::now();
  int before = link_active_[link];
  link_active_[link] += delta;
  if (before == 0 && link_active_[link] > 0) link_since_[link] = now;
  if (before > 0 && link_active_[link] == 0) {
    double s = std::chrono::duration<double>(now - link_since_[link]).count();
    (link == 0 ? stats_.nvme_read_busy_seconds : stats_.nvme_write_busy_seconds) += s;
  }
}

void TierManager::GiveSlot(ShardId id, Tier tier, Slot slot) {
  tables_[static_cast<int>(tier)].Give(shards_[id]->cls[static_cast<int>(tier)], std::move(slot));
}

void TierManager::FreeCopy(ShardId id, Tier tier) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  if (tier == Tier::kHost && s.spec.home == Tier::kHost) return;  // the home stays
  if (c.state == Copy::kAbsent) return;
  if (c.state != Copy::kReady) {
    // Its slot would be handed out while a transfer still writes or reads it.
    Log().critical("tier: freeing {} {} while a transfer of it is in flight (a bug)",
                   s.spec.name, TierName(tier));
    Log().flush();
    std::abort();
  }
  Log().debug("tier: free {} {} (dirty {}, stale {})", s.spec.name, TierName(tier), c.dirty,
              c.stale);
  Slot slot = std::move(c.slot);
  // The next user of a device slot waits for the last users of this copy on its own stream.
  if (tier == Tier::kDevice) {
    for (Event& e : c.uses) slot.ready.push_back(std::move(e));
  }
  GiveSlot(id, tier, std::move(slot));
  Copy fresh;
  fresh.last_use = c.last_use;
  fresh.leases = c.leases;
  c = std::move(fresh);
}

Status TierManager::WriteBack(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  if (!c.dirty) return Status::Ok();
  if (c.stale || s.rewrite_pending) {
    // Outdated (dropped before its next use), or about to be (the home is being rewritten,
    // BeginRewrite): never written home, where it could land over the newer content.
    c.dirty = false;
    return Status::Ok();
  }
  if (s.spec.derive) {  // Release refuses a dirty derived copy: never reached
    return Internal(fmt::format("write back of {}: a derived shard has no home to write", s.spec.name));
  }
  Log().debug("tier: write back {} {}", s.spec.name, TierName(tier));
  if (tier == Tier::kDevice) return WriteBackFromDevice(lock, id);
  return WriteBackHome(lock, id);
}

// A dirty device copy to the host tier, through a host slot of its class.
Status TierManager::WriteBackFromDevice(std::unique_lock<std::mutex>& lock, ShardId id) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[kDev];
  Copy& h = s.copy[kHostIdx];
  c.pins++;  // nobody may free it while it is read
  // Until a ready host copy is in hand with the lock held since the checks: Reserve and the
  // waits let go of the lock, and meanwhile another thread may write the copy back (then a
  // leaseholder of the host copy may be writing it: this write-back must not land there),
  // or free the host copy.
  while (true) {
    if (!c.dirty || c.stale || s.rewrite_pending) {
      // Written back by another thread meanwhile, or outdated now (as checked above: the
      // waits below let go of the lock, and BeginRewrite does not wait for this one yet).
      c.dirty = false;
      c.pins--;
      cv_.notify_all();
      return Status::Ok();
    }
    if (h.state == Copy::kLoading || h.state == Copy::kWriting) {
      cv_.wait(lock);
      continue;
    }
    if (h.state != Copy::kAbsent) break;
    Slot slot;
    c.waiter = std::this_thread::get_id();
    Status st = Reserve(lock, Tier::kHost, id, false, 0, &slot);
    c.waiter = std::thread::id();
    if (!st.ok()) {
      c.pins--;
      cv_.notify_all();  // a waiter may have seen this pin as a transfer in flight
      return st.WithContext(fmt::format("writing {} back from the device", s.spec.name));
    }
    if (h.state != Copy::kAbsent || !c.dirty) {
      GiveSlot(id, Tier::kHost, std::move(slot));
      continue;
    }
    h.slot = std::move(slot);
    h.ptr = h.slot.ptr;
    h.state = Copy::kReady;
    break;
  }
  const uint64_t copied_version = c.version;  // what the d2h copies
  h.pins++;
  // Readers of the host copy wait until the data has landed (unless a lease already holds it).
  const bool landing = h.leases == 0;
  if (landing) h.state = Copy::kLoading;
  c.state = Copy::kWriting;
  auto done = std::make_shared<bool>(false);
  // The copy's writers (its lease holders' streams) finish before the d2h reads it.
  Status st;
  for (const Event& e : c.uses) {
    if (st.ok()) st = device_.StreamWaitEvent(d2h_, e);
  }
  if (st.ok()) st = device_.CopyToHost(d2h_, h.ptr, c.ptr, s.spec.bytes);
  if (st.ok()) {
    st = device_.Launch(d2h_, [this, done, id, t0 = Clock::now()] {
      std::lock_guard l(mu_);
      Span("d2h", shards_[id]->spec.name, t0);
      *done = true;
      cv_.notify_all();
      return Status::Ok();
    });
  }
  if (st.ok()) {
    cv_.wait(lock, [&] { return *done; });
  }
  c.state = Copy::kReady;
  c.pins--;
  h.pins--;
  if (landing) h.state = Copy::kReady;
  if (!st.ok()) {
    h.stale = true;  // what landed is unknown; the device copy stays dirty
    if (h.pins == 0 && h.state == Copy::kReady) FreeCopy(id, Tier::kHost);
    cv_.notify_all();
    return st.WithContext(fmt::format("copying {} to the host", s.spec.name));
  }
  stats_.d2h_bytes += s.spec.bytes;
  if (c.version == copied_version && c.dirty) {
    c.dirty = false;
    h.stale = false;  // it now holds the newest data
    if (s.spec.home == Tier::kNvme) {
      h.dirty = true;
      h.version++;
    }
  } else {
    // A lease wrote the device copy while it was being copied: what landed may be torn (the
    // device copy stays dirty). Or the home was rewritten meanwhile (HomeRewritten marked the
    // device copy clean and stale; nothing else clears it during the copy): what landed is
    // older than the home. Either way the host copy is outdated (dropped once idle).
    h.stale = true;
    if (h.pins == 0 && h.state == Copy::kReady) FreeCopy(id, Tier::kHost);
  }
  cv_.notify_all();
  return Status::Ok();
}

// A dirty host copy to its NVMe home (a host-homed one is home already).
Status TierManager::WriteBackHome(std::unique_lock<std::mutex>& lock, ShardId id) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[kHostIdx];
  const uint64_t version = c.version;
  if (s.spec.home != Tier::kNvme) {
    c.dirty = false;
    return Status::Ok();
  }
  c.pins++;
  c.state = Copy::kWriting;
  auto result = std::make_shared<std::pair<bool, Status>>(false, Status::Ok());
  LinkBusy(1, +1);
  Status st = swap_->engine().Submit(
      {io::OpKind::kWrite, swap_->file(), s.extent.offset, c.ptr, s.host_bytes},
      [this, result, id, t0 = Clock::now()](const Status& r) {
        std::lock_guard l(mu_);
        Span("nvme write", shards_[id]->spec.name, t0);
        *result = {true, r};
        LinkBusy(1, -1);
        cv_.notify_all();
      });
  if (st.ok()) {
    cv_.wait(lock, [&] { return result->first; });
    st = result->second;
  } else {
    LinkBusy(1, -1);
  }
  c.state = Copy::kReady;
  c.pins--;
  cv_.notify_all();
  if (!st.ok()) {
    // Not written: the copy stays resident and dirty.
    return st.WithContext(fmt::format("writing shard {} home", s.spec.name));
  }
  stats_.nvme_write_bytes += s.host_bytes;
  stats_.writebacks++;
  if (c.version == version) c.dirty = false;
  return Status::Ok();
}

void TierManager::StartWriteBehind(ShardId id) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[kHostIdx];
  if (s.spec.home != Tier::kNvme || swap_ == nullptr || !c.dirty || c.stale || c.pins > 0 ||
      c.state != Copy::kReady || s.rewrite_pending) {
    return;
  }
  const uint64_t version = c.version;
  c.pins++;  // not freed while the engine reads it
  c.state = Copy::kWriting;
  LinkBusy(1, +1);
  // Behind demand reads and prefetches (a forward waiting for weights goes first).
  Status st = swap_->engine().Submit(
      {io::OpKind::kWrite, swap_->file(), s.extent.offset, c.ptr, s.host_bytes,
       io::Priority::kBackground},
      [this, id, version, t0 = Clock::now()](const Status& r) {
        std::lock_guard l(mu_);
        Shard& sh = *shards_[id];
        Copy& hc = sh.copy[kHostIdx];
        Span("nvme write", sh.spec.name, t0);
        LinkBusy(1, -1);
        hc.state = Copy::kReady;
        hc.pins--;
        if (r.ok()) {
          stats_.nvme_write_bytes += sh.host_bytes;
          stats_.writebacks++;
          stats_.write_behinds++;
          if (hc.version == version) hc.dirty = false;  // else a lease wrote it meanwhile
        } else if (sticky_.ok()) {
          // Not written: the copy stays dirty (its eviction writes it again); the next Acquire
          // reports the failure.
          sticky_ = r.WithContext(fmt::format("writing {} home in the background", sh.spec.name));
        }
        if (hc.stale && hc.pins == 0) FreeCopy(id, Tier::kHost);
        cv_.notify_all();
      });
  if (!st.ok()) {
    LinkBusy(1, -1);
    c.state = Copy::kReady;
    c.pins--;
    if (sticky_.ok()) sticky_ = st.WithContext(fmt::format("writing {} home", s.spec.name));
  }
}

void TierManager::StartHostToDevice(ShardId id) {
  Shard& s = *shards_[id];
  Copy& d = s.copy[kDev];
  Copy& h = s.copy[kHostIdx];
  s.device_wants_host = false;
  Log().debug("tier: h2d {}", s.spec.name);
  inflight_bytes_[1] += s.spec.bytes;
  // The slot's previous users finish before the copy overwrites it: a stream wait, not a host
  // wait.
  Status st;
  for (const Event& e : d.slot.ready) {
    if (st.ok()) st = device_.StreamWaitEvent(h2d_, e);
  }
  if (st.ok()) d.slot.ready.clear();
  if (st.ok()) st = device_.CopyToDevice(h2d_, d.ptr, h.ptr, s.spec.bytes);
  if (st.ok()) {
    auto ev = device_.Record(h2d_);
    if (ev.ok()) {
      d.loaded = *ev;
      d.enqueued = true;
    } else {
      st = ev.status();
    }
  }
  if (st.ok()) {
    s.h2d_reading = true;  // the callback, which clears it, cannot run before mu_ is released
    st = device_.Launch(h2d_, [this, id, t0 = Clock::now()] {
      std::lock_guard l(mu_);
      Shard& sh = *shards_[id];
      Copy& dc = sh.copy[kDev];
      Copy& hc = sh.copy[kHostIdx];
      sh.h2d_reading = false;
      Span("h2d", sh.spec.name, t0);
      dc.state = Copy::kReady;
      dc.enqueued = false;
      dc.loaded = Event();
      hc.pins--;
      if (dc.stale && dc.pins == 0) FreeCopy(id, Tier::kDevice);
      if (hc.stale && hc.pins == 0 && hc.state == Copy::kReady) FreeCopy(id, Tier::kHost);
      stats_.h2d_bytes += sh.spec.bytes;
      inflight_bytes_[1] -= sh.spec.bytes;
      cv_.notify_all();
      return Status::Ok();
    });
  }
  if (!st.ok()) {
    s.h2d_reading = false;
    inflight_bytes_[1] -= s.spec.bytes;
    AbandonDeviceLoad(id, st);
  }
  cv_.notify_all();  // waiters for the transfer being enqueued
}

void TierManager::AbandonDeviceLoad(ShardId id, Status error) {
  Shard& s = *shards_[id];
  Copy& d = s.copy[kDev];
  s.device_wants_host = false;
  s.copy[kHostIdx].pins--;  // the staging pin taken when the device load started
  Slot slot = std::move(d.slot);
  // A copy already enqueued still writes the slot: its next user waits for it.
  if (d.loaded.recorded()) slot.ready.push_back(d.loaded);
  for (Event& e : d.uses) slot.ready.push_back(std::move(e));
  GiveSlot(id, Tier::kDevice, std::move(slot));
  d.slot = Slot();
  d.uses.clear();
  d.ptr = nullptr;
  d.state = Copy::kAbsent;
  d.enqueued = false;
  d.loaded = Event();
  // The marks were about the content it would have had: the next load starts clean (a stale
  // mark left here would drop the next copy, and the writes of its first lease, at release).
  d.stale = false;
  d.dirty = false;
  d.error = std::move(error);
  cv_.notify_all();
}

void TierManager::FinishHostLoad(ShardId id, const Status& r) {
  Shard& sh = *shards_[id];
  Copy& hc = sh.copy[kHostIdx];
  hc.read_ticket = 0;  // nothing left to promote
  if (r.ok()) {
    hc.state = Copy::kReady;
    if (sh.device_wants_host) {
      // Outdated while it loaded (the home was rewritten): the device copy must not be made
      // from it; its waiters start over (an OK error means "retry").
      if (hc.stale) AbandonDeviceLoad(id, Status::Ok());
      else StartHostToDevice(id);
    }
    if (hc.stale && hc.pins == 0) FreeCopy(id, Tier::kHost);
  } else {
    GiveSlot(id, Tier::kHost, std::move(hc.slot));  // pins and leases stay
    hc.slot = Slot();
    hc.ptr = nullptr;
    hc.state = Copy::kAbsent;
    hc.stale = false;  // no content: the next load starts clean
    hc.dirty = false;
    hc.error = r.WithContext(fmt::format("loading shard {}", sh.spec.name));
    if (sh.device_wants_host) AbandonDeviceLoad(id, hc.error);
  }
  cv_.notify_all();
}

void TierManager::DeriveLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    derive_cv_.wait(lock, [&] { return derive_stop_ || !derive_queue_.empty(); });
    if (derive_queue_.empty()) return;  // stopped, nothing left
    const auto [id, t0] = derive_queue_.front();
    derive_queue_.pop_front();
    Shard& s = *shards_[id];
    // The copy is loading: its slot stays put and nobody else writes it until it is ready.
    void* dst = s.copy[kHostIdx].ptr;
    lock.unlock();
    Status r = s.spec.derive(dst);
    if (r.ok() && s.host_bytes > s.spec.bytes) {
      std::memset(static_cast<uint8_t*>(dst) + s.spec.bytes, 0, s.host_bytes - s.spec.bytes);
    }
    lock.lock();
    Span("derive", s.spec.name, t0);
    s.deriving--;
    if (r.ok()) stats_.derived_bytes += s.spec.bytes;
    FinishHostLoad(id, r);
  }
}

void TierManager::PromoteDerivation(ShardId id) {
  auto it = std::find_if(derive_queue_.begin(), derive_queue_.end(),
                         [id](const auto& e) { return e.first == id; });
  if (it == derive_queue_.end() || it == derive_queue_.begin()) return;  // running, or next
  const auto entry = *it;
  derive_queue_.erase(it);
  derive_queue_.push_front(entry);
  stats_.derive_promotions++;
}

Status TierManager::StartLoad(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier,
                              bool prefetch, size_t need_pos) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  if (tier == Tier::kHost) {
    Copy& d = s.copy[kDev];
    // The newest data is on the device: a missing host copy, or a home in pinned memory,
    // is refreshed from it rather than from NVMe.
    if (d.dirty && d.state != Copy::kAbsent &&
        (c.state == Copy::kAbsent || s.spec.home == Tier::kHost)) {
      if (prefetch) return ResourceExhausted("prefetch: newer data on the device");
      while (d.state == Copy::kLoading || d.state == Copy::kWriting) cv_.wait(lock);
      if (d.dirty) return WriteBack(lock, id, Tier::kDevice);
    }
  }
  if (c.state != Copy::kAbsent) return Status::Ok();
  c.error = Status::Ok();
  if (tier == Tier::kHost) {
    if (s.spec.home == Tier::kHost) return Status::Ok();
    return StartHostLoad(lock, id, prefetch, need_pos);
  }
  return StartDeviceLoad(lock, id, prefetch, need_pos);
}

// A host copy of an NVMe-homed shard: a host slot, then its NVMe read or its derivation.
Status TierManager::StartHostLoad(std::unique_lock<std::mutex>& lock, ShardId id, bool prefetch,
                                  size_t need_pos) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[kHostIdx];
  if (s.spec.derive && s.rewrite_pending) {
    // Its source is being changed (BeginRewrite): a copy now could mix old and new.
    if (prefetch) return ResourceExhausted("prefetch: the source of a derived shard is changing");
    return FailedPrecondition(fmt::format(
        "loading {}: it is derived and its source is being changed (BeginRewrite without "
        "HomeRewritten, InstallPending or Invalidate yet)", s.spec.name));
  }
  Slot slot;
  ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kHost, id, prefetch, need_pos, &slot));
  if (c.state != Copy::kAbsent) {  // someone else started it while we waited
    GiveSlot(id, Tier::kHost, std::move(slot));
    return Status::Ok();
  }
  c.slot = std::move(slot);
  c.ptr = c.slot.ptr;
  c.state = Copy::kLoading;
  if (s.spec.derive) {
    // Computed on the derive thread; a demand load goes ahead of the prefetches queued.
    Log().debug("tier: derive {} (prefetch {})", s.spec.name, prefetch);
    s.deriving++;
    if (prefetch) derive_queue_.emplace_back(id, Clock::now());
    else derive_queue_.emplace_front(id, Clock::now());
    derive_cv_.notify_one();
    return Status::Ok();
  }
  Log().debug("tier: read {} from nvme (prefetch {})", s.spec.name, prefetch);
  inflight_bytes_[0] += s.host_bytes;
  LinkBusy(0, +1);
  // A prefetch waits behind what callers wait for now (io/request.h's priorities).
  Status st = swap_->engine().Submit(
      {io::OpKind::kRead, swap_->file(), s.extent.offset, c.ptr, s.host_bytes,
       prefetch ? io::Priority::kPrefetch : io::Priority::kDemand},
      [this, id, t0 = Clock::now()](const Status& r) {
        std::lock_guard l(mu_);
        Shard& sh = *shards_[id];
        Span("nvme read", sh.spec.name, t0);
        LinkBusy(0, -1);
        inflight_bytes_[0] -= sh.host_bytes;
        if (r.ok()) stats_.nvme_read_bytes += sh.host_bytes;
        FinishHostLoad(id, r);
      },
      &c.read_ticket);
  if (!st.ok()) {
    LinkBusy(0, -1);
    inflight_bytes_[0] -= s.host_bytes;
    GiveSlot(id, Tier::kHost, std::move(c.slot));
    c.slot = Slot();
    c.ptr = nullptr;
    c.state = Copy::kAbsent;
    return st;
  }
  return Status::Ok();
}

// Device copy: a device slot, then the host copy (loaded if needed), then the h2d copy.
Status TierManager::StartDeviceLoad(std::unique_lock<std::mutex>& lock, ShardId id,
                                    bool prefetch, size_t need_pos) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[kDev];
  if (options_.max_inflight_bytes && prefetch &&
      inflight_bytes_[1] + s.spec.bytes > options_.max_inflight_bytes) {
    return ResourceExhausted("prefetch: h2d link full");
  }
  {
    // An outdated host copy (its home was rewritten) must not be copied up: it goes first.
    Copy& h = s.copy[kHostIdx];
    if (h.stale && h.state != Copy::kAbsent) {
      if (prefetch) return ResourceExhausted("prefetch: the host copy is outdated");
      while (h.stale && (h.state == Copy::kLoading || h.state == Copy::kWriting ||
                         h.pins > h.leases)) {
        cv_.wait(lock);
      }
      if (h.stale && h.state == Copy::kReady && h.pins == 0) FreeCopy(id, Tier::kHost);
      if (h.stale && h.state != Copy::kAbsent) {
        return FailedPrecondition(fmt::format(
            "loading {} to the device: its host copy is outdated and still leased", s.spec.name));
      }
    }
    if (c.state != Copy::kAbsent) return Status::Ok();  // loaded meanwhile
  }
  if (prefetch && s.copy[kHostIdx].leases > 0) {
    // A leaseholder may be writing the host copy: an h2d must not read it now.
    return ResourceExhausted("prefetch: the host copy is leased");
  }
  Slot slot;
  ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kDevice, id, prefetch, need_pos, &slot));
  if (c.state != Copy::kAbsent) {
    GiveSlot(id, Tier::kDevice, std::move(slot));
    return Status::Ok();
  }
  c.slot = std::move(slot);
  c.ptr = c.slot.ptr;
  c.state = Copy::kLoading;
  c.enqueued = false;
  Copy& h = s.copy[kHostIdx];
  h.pins++;  // the staging must stay until the h2d copy is done
  if (h.state == Copy::kReady || h.state == Copy::kWriting) {
    StartHostToDevice(id);
    return Status::Ok();
  }
  s.device_wants_host = true;
  if (h.state == Copy::kLoading) return Status::Ok();
  c.waiter = std::this_thread::get_id();  // the h2d cannot start before the host copy
  Status st = StartLoad(lock, id, Tier::kHost, prefetch, need_pos);
  c.waiter = std::thread::id();
  if (!st.ok() && s.device_wants_host) AbandonDeviceLoad(id, Status::Ok());  // st goes up
  return st;
}

void TierManager::Prefetch(std::unique_lock<std::mutex>& lock, size_t pos) {
  if (!trace_.valid() || !options_.prefetch) return;
  // What to fetch and in which order is the trace's (AccessTrace::Ahead); whether a copy is
  // there already, and the in-flight limit, are residency's.
  trace_.Ahead(
      pos, options_.prefetch_units, [&](ShardId id) { return shards_[id]->spec.unit; },
      [&](ShardId id, Tier tier, size_t q) {
        Shard& s = *shards_[id];
        const Copy& c = s.copy[static_cast<int>(tier)];
        if (c.state != Copy::kAbsent || s.rewrite_pending) return true;
        if (tier == Tier::kHost && options_.max_inflight_bytes &&
            inflight_bytes_[0] + s.host_bytes > options_.max_inflight_bytes) {
          return false;
        }
        return StartLoad(lock, id, tier, /*prefetch=*/true, q).ok();
      });
}

Result<bool> TierManager::InstallPending(ShardId id, const void* data) {
  ZINF_RETURN_IF_ERROR(EnsureSealed());
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  if (s.spec.home != Tier::kNvme) {
    return InvalidArgument(fmt::format("InstallPending({}): the shard is not homed on NVMe",
                                       s.spec.name));
  }
  if (s.pending) {
    return FailedPrecondition(fmt::format("InstallPending({}): already pending", s.spec.name));
  }
  for (const Copy& c : s.copy) {
    if (c.state != Copy::kAbsent && (c.state != Copy::kReady || c.pins > 0)) return false;
  }
  // The old copies go first: their memory may be what the new one needs.
  for (Copy& c : s.copy) c.dirty = false;  // older than the new content
  FreeCopy(id, Tier::kDevice);
  FreeCopy(id, Tier::kHost);
  Slot slot;
  // Its next use in either tier (one rank's 16-bit weights are used on the device, ZeRO-3's
  // shards in the host tier, gathered from there).
  const size_t next = trace_.valid() ? std::min(trace_.NextUse(id, Tier::kDevice, trace_.pos()),
                                                trace_.NextUse(id, Tier::kHost, trace_.pos()))
                                     : 0;
  Status st = Reserve(lock, Tier::kHost, id, /*prefetch=*/true, next, &slot);
  if (!st.ok()) {
    if (st.code() == StatusCode::kResourceExhausted) return false;
    return st;
  }
  Copy& h = s.copy[kHostIdx];
  if (h.state != Copy::kAbsent) {  // Reserve never waits when prefetching, but be sure
    GiveSlot(id, Tier::kHost, std::move(slot));
    return false;
  }
  // Loading (users wait for it) while the bytes are copied outside the lock: a unit's weights
  // can be 100 MB, and completions and acquires must not stall behind that.
  h.slot = std::move(slot);
  h.ptr = h.slot.ptr;
  void* p = h.ptr;
  h.state = Copy::kLoading;
  h.pins++;  // held (not a lease) until the home write ends; an acquirer may hold a pin too
  Touch(h);
  s.pending = true;
  s.rewrite_pending = false;
  stats_.installs++;
  lock.unlock();
  std::memcpy(p, data, s.spec.bytes);
  if (s.host_bytes > s.spec.bytes) {
    std::memset(static_cast<uint8_t*>(p) + s.spec.bytes, 0, s.host_bytes - s.spec.bytes);
  }
  lock.lock();
  h.state = Copy::kReady;
  if (s.device_wants_host) StartHostToDevice(id);
  cv_.notify_all();
  return true;
}

}  // namespace zinf::offload
