// TierManager: registration, the slot plan (Seal), leases and the residency bookkeeping. The
// transfers (loads, write-backs, the h2d link) are in tier_mover.cc, taking a slot and
// evicting for it in tier_eviction.cc, a shard's home and its rewrites in tier_home.cc.
#include "offload/tier_manager.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "offload/tier_manager_internal.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::offload {

using Clock = std::chrono::steady_clock;

std::string_view TierName(Tier t) {
  switch (t) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

std::string_view RoleName(Role r) {
  switch (r) {
    case Role::kParam16: return "param16";
    case Role::kMaster: return "master";
    case Role::kExpAvg: return "exp_avg";
    case Role::kExpAvgSq: return "exp_avg_sq";
    case Role::kGrad: return "grad";
  }
  return "?";
}

Result<void*> Lease::Wait() {
  if (owner_ == nullptr) return FailedPrecondition("Wait on an empty lease");
  ZINF_ASSIGN_OR_RETURN(Ready r, owner_->WaitFor(shard_, tier_, false));
  return r.ptr;
}

Result<Lease::Ready> Lease::WaitEnqueued() {
  if (owner_ == nullptr) return FailedPrecondition("WaitEnqueued on an empty lease");
  return owner_->WaitFor(shard_, tier_, true);
}

TierManager::TierManager(DeviceArena& a, PinnedPool& p, SwapSpace* s, const TierManagerOptions& o)
    : arena_(a), device_(a.device()), pool_(p), swap_(s), options_(o) {}

Result<std::unique_ptr<TierManager>> TierManager::Create(DeviceArena& arena, PinnedPool& pool,
                                                         SwapSpace* swap,
                                                         const TierManagerOptions& options) {
  auto tm = std::unique_ptr<TierManager>(new TierManager(arena, pool, swap, options));
  ZINF_ASSIGN_OR_RETURN(tm->eviction_, MakeEvictionPolicy(options.eviction_policy));
  Device& device = arena.device();
  ZINF_RETURN_IF_ERROR(device.RegisterHost(pool.base(), pool.budget_bytes()));
  ZINF_ASSIGN_OR_RETURN(tm->h2d_, device.CreateStream("h2d"));
  ZINF_ASSIGN_OR_RETURN(tm->d2h_, device.CreateStream("d2h"));
  if (swap != nullptr) {
    ZINF_RETURN_IF_ERROR(pool.RegisterWith(swap->engine()));
    swap->engine().StartReaper();
  }
  return tm;
}

TierManager::~TierManager() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      for (auto& s : shards_) {
        for (auto& c : s->copy) {
          if (c.state == Copy::kLoading || c.state == Copy::kWriting) return false;
        }
      }
      return true;
    });
  }
  if (derive_thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      derive_stop_ = true;
    }
    derive_cv_.notify_all();
    derive_thread_.join();
  }
  device_.StreamSynchronize(h2d_).IgnoreError();
  device_.StreamSynchronize(d2h_).IgnoreError();
  {
    std::lock_guard lock(mu_);
    for (ShardId id = 0; id < shards_.size(); ++id) {
      FreeCopy(id, Tier::kDevice);
      FreeCopy(id, Tier::kHost);
      pool_.Free(shards_[id]->home_block).IgnoreError();
    }
  }
  arena_.Free(device_region_).IgnoreError();
  pool_.Free(host_region_).IgnoreError();
  device_.UnregisterHost(pool_.base()).IgnoreError();
}

Result<ShardId> TierManager::Register(const ShardSpec& spec) {
  if (spec.bytes == 0) return InvalidArgument(fmt::format("shard {}: 0 bytes", spec.name));
  if (spec.home != Tier::kNvme && spec.home != Tier::kHost) {
    return InvalidArgument(fmt::format("shard {}: home must be nvme or host", spec.name));
  }
  if (spec.derive && spec.home != Tier::kNvme) {
    return InvalidArgument(fmt::format(
        "shard {}: a derived shard takes the NVMe home's place (home must be nvme)", spec.name));
  }
  if (spec.home == Tier::kNvme && swap_ == nullptr) {
    return FailedPrecondition(fmt::format(
        "shard {} is homed on NVMe but no swap space is configured (set nvme_path)", spec.name));
  }
  if (sealed()) {
    return FailedPrecondition(fmt::format(
        "shard {}: registered after the tier manager was sealed (register every shard before "
        "Seal and the first acquire)", spec.name));
  }
  auto shard = std::make_unique<Shard>();
  shard->spec = spec;
  shard->host_bytes = swap_ ? swap_->Padded(spec.bytes) : spec.bytes;
  if (spec.bytes > arena_.budget_bytes()) {
    return ResourceExhausted(fmt::format(
        "shard {} ({} bytes, {}) is larger than the whole device budget of {} bytes ({}): it "
        "could never be brought to the device; raise the device budget or split the unit",
        spec.name, spec.bytes, FormatBytesHuman(spec.bytes), arena_.budget_bytes(),
        FormatBytesHuman(arena_.budget_bytes())));
  }
  if (shard->host_bytes > pool_.budget_bytes()) {
    return ResourceExhausted(fmt::format(
        "shard {} ({} bytes) is larger than the whole pinned budget of {} bytes ({}): it could "
        "never be staged in host memory; raise zinf.budgets.pinned_bytes or split the unit",
        spec.name, spec.bytes, pool_.budget_bytes(), FormatBytesHuman(pool_.budget_bytes())));
  }
  if (spec.home == Tier::kNvme && spec.home_extent) {
    if (spec.home_extent->bytes < spec.bytes ||
        spec.home_extent->offset % swap_->offset_align() != 0) {
      return InvalidArgument(fmt::format("shard {}: its home extent (offset {}, {} bytes) does "
                                         "not hold {} aligned bytes", spec.name,
                                         spec.home_extent->offset, spec.home_extent->bytes,
                                         spec.bytes));
    }
    shard->extent = *spec.home_extent;
  } else if (spec.home == Tier::kNvme && !spec.derive) {
    ZINF_ASSIGN_OR_RETURN(shard->extent, swap_->Allocate(spec.bytes));
  } else if (spec.home == Tier::kHost) {
    auto block = pool_.Allocate(shard->host_bytes);
    if (!block.ok()) {
      return block.status().WithContext(fmt::format("shard {} homed in pinned memory", spec.name));
    }
    shard->home_block = *block;
    Copy& h = shard->copy[kHostIdx];
    h.ptr = block->data;
    h.state = Copy::kReady;
    std::memset(h.ptr, 0, shard->host_bytes);
  }
  std::lock_guard lock(mu_);
  shards_.push_back(std::move(shard));
  return static_cast<ShardId>(shards_.size() - 1);
}

const ShardSpec& TierManager::spec(ShardId id) const {
  std::lock_guard lock(mu_);
  return shards_.at(id)->spec;
}

namespace {

SlotTableOptions TableOptions(Tier tier, const SealOptions& o, uint64_t alignment) {
  SlotTableOptions t;
  t.tier = std::string(TierName(tier));
  t.alignment = alignment;
  const auto& leases = o.max_leases[static_cast<int>(tier)];
  t.max_leases.assign(leases.begin(), leases.end());
  for (size_t r = 0; r < kRoles; ++r) t.role_names.emplace_back(RoleName(static_cast<Role>(r)));
  t.spare = o.spare[static_cast<int>(tier)];
  return t;
}

}  // namespace

bool TierManager::UsesHostSlots(const Shard& s, const SealOptions& o) {
  // An NVMe-homed shard used in any tier: leased in the host tier, or staged there on its way to
  // the device (and written or read home through a host slot).
  const auto role = static_cast<size_t>(s.spec.role);
  return s.spec.home == Tier::kNvme &&
         (o.max_leases[kHostIdx][role] > 0 || o.max_leases[kDev][role] > 0);
}

void TierManager::Demands(const SealOptions& o, std::vector<SlotDemand>* dev,
                          std::vector<SlotDemand>* host) const {
  for (const auto& s : shards_) {
    const auto role = static_cast<uint32_t>(s->spec.role);
    if (o.max_leases[kDev][role] > 0) dev->push_back({s->spec.bytes, role});
    if (UsesHostSlots(*s, o)) host->push_back({s->host_bytes, role});
  }
}

SealNeed TierManager::MinimumSealBytes(const SealOptions& options) const {
  std::lock_guard lock(mu_);
  std::vector<SlotDemand> dev, host;
  Demands(options, &dev, &host);
  return {SlotTable::MinimumBytes(dev, TableOptions(Tier::kDevice, options, kDeviceAlignment)),
          SlotTable::MinimumBytes(host, TableOptions(Tier::kHost, options, pool_.alignment()))};
}

Status TierManager::Seal(const SealOptions& options) {
  std::lock_guard lock(mu_);
  if (sealed_) return FailedPrecondition("Seal: the tier manager is already sealed");
  return SealLocked(options);
}

Status TierManager::EnsureSealed() {
  std::lock_guard lock(mu_);
  return sealed_ ? Status::Ok() : SealLocked(SealOptions{});
}

Status TierManager::SealLocked(const SealOptions& options) {
  seal_ = options;
  const bool any_derived =
      std::any_of(shards_.begin(), shards_.end(), [](const auto& s) { return !!s->spec.derive; });
  if (any_derived && !derive_thread_.joinable()) {
    derive_thread_ = std::thread([this] { DeriveLoop(); });
  }
  std::vector<SlotDemand> dev, host;
  Demands(options, &dev, &host);
  auto [dptr, dbytes] = arena_.AllocateRest();
  device_region_ = dptr;
  auto dt = SlotTable::Create(dptr, dbytes, dev,
                              TableOptions(Tier::kDevice, options, kDeviceAlignment));
  if (!dt.ok()) {
    arena_.Free(dptr).IgnoreError();
    device_region_ = nullptr;
    return dt.status().WithContext(fmt::format(
        "zinf.budgets.device_bytes: the device budget of {} bytes holds {} bytes of fixed "
        "buffers (activations, working weights, backend workspace)",
        arena_.budget_bytes(), arena_.bytes_in_use()));
  }
  tables_[kDev] = std::move(*dt);
  if (!host.empty()) {
    host_region_ = pool_.AllocateRest();
    auto ht = SlotTable::Create(host_region_.data, host_region_.bytes, host,
                                TableOptions(Tier::kHost, options, pool_.alignment()));
    if (!ht.ok()) {
      arena_.Free(dptr).IgnoreError();
      device_region_ = nullptr;
      pool_.Free(host_region_).IgnoreError();
      host_region_ = {};
      return ht.status().WithContext(fmt::format(
          "zinf.budgets.pinned_bytes: the pinned budget of {} bytes holds {} bytes taken for "
          "the whole run (optimizer slabs, gradient staging, shards homed in pinned memory)",
          pool_.budget_bytes(), pool_.bytes_in_use()));
    }
    tables_[kHostIdx] = std::move(*ht);
  }
  fixed_bytes_[kDev] = arena_.bytes_in_use() - dbytes;
  fixed_bytes_[kHostIdx] = pool_.bytes_in_use() - host_region_.bytes;
  for (int t : {kDev, kHostIdx}) {
    members_[t].assign(tables_[t].classes(), {});
  }
  for (ShardId id = 0; id < shards_.size(); ++id) {
    Shard& s = *shards_[id];
    const auto role = static_cast<size_t>(s.spec.role);
    if (options.max_leases[kDev][role] > 0) {
      s.cls[kDev] = tables_[kDev].ClassFor(s.spec.bytes);
      members_[kDev][s.cls[kDev]].push_back(id);
    }
    if (UsesHostSlots(s, options)) {
      s.cls[kHostIdx] = tables_[kHostIdx].ClassFor(s.host_bytes);
      members_[kHostIdx][s.cls[kHostIdx]].push_back(id);
    }
  }
  sealed_ = true;
  Log().debug("tier: sealed; device slots: {}; host slots: {}", tables_[kDev].Describe(),
              tables_[kHostIdx].Describe());
  return Status::Ok();
}

bool TierManager::sealed() const {
  std::lock_guard lock(mu_);
  return sealed_;
}

std::string TierManager::DescribeSlots() const {
  std::lock_guard lock(mu_);
  return fmt::format("device: {}; host: {}", tables_[kDev].Describe(),
                     tables_[kHostIdx].classes() ? tables_[kHostIdx].Describe() : "none");
}

void TierManager::WaitTransfers(std::unique_lock<std::mutex>& lock, const Shard& s) {
  // Both copies at once: while one is waited for, a prefetch may start on the other.
  cv_.wait(lock, [&] {
    for (const Copy& c : s.copy) {
      if (c.state == Copy::kLoading || c.state == Copy::kWriting) return false;
    }
    return true;
  });
}

Lease TierManager::NewLease(ShardId id, Tier tier) {
  const int ti = static_cast<int>(tier);
  holders_[ti][std::this_thread::get_id()]++;
  role_leases_[ti][static_cast<int>(shards_[id]->spec.role)]++;
  shards_[id]->copy[ti].leases++;
  return Lease(this, id, tier);
}

bool TierManager::OtherHolderCanRelease(Tier tier) const {
  const auto me = std::this_thread::get_id();
  for (const auto& [thread, count] : holders_[static_cast<int>(tier)]) {
    if (thread != me && count > 0 && !reserving_.contains(thread)) return true;
  }
  return false;
}

void TierManager::Span(const char* track, const std::string& what, Clock::time_point t0) {
  Tracer* t = options_.tracer;
  if (t != nullptr && t->enabled()) t->Complete(t->Track(track), what, t0, Clock::now(), "io");
}

Result<Lease> TierManager::Acquire(ShardId id, Tier tier, AcquireMode mode) {
  ZINF_RETURN_IF_ERROR(EnsureSealed());
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("Acquire: unknown shard {}", id));
  if (tier != Tier::kHost && tier != Tier::kDevice) {
    return InvalidArgument("Acquire: the tier must be host or device");
  }
  Shard& s = *shards_[id];
  const bool overwrite = mode == AcquireMode::kOverwrite;
  if (overwrite && tier != Tier::kHost) {
    return InvalidArgument(fmt::format("Acquire({}): overwrite is for the host tier",
                                       s.spec.name));
  }
  const int ti = static_cast<int>(tier);
  const int role = static_cast<int>(s.spec.role);
  if (role_leases_[ti][role] >= seal_.max_leases[ti][role]) {
    return FailedPrecondition(fmt::format(
        "Acquire({}): {} lease(s) of role {} are already held in the {} tier, the most declared "
        "at Seal (SealOptions::max_leases); release one first or declare more",
        s.spec.name, role_leases_[ti][role], RoleName(s.spec.role), TierName(tier)));
  }
  if (!sticky_.ok()) return std::exchange(sticky_, Status::Ok());
  if (overwrite) {
    // The caller rewrites the whole shard, so a device copy is about to be outdated: once its
    // transfers are over it is dropped (a dirty one too: the rewrite supersedes it), unless a
    // lease still uses it.
    Copy& d = s.copy[kDev];
    while (d.state == Copy::kLoading || d.state == Copy::kWriting || d.pins > d.leases) {
      cv_.wait(lock);
    }
    if (d.leases > 0) {
      return FailedPrecondition(fmt::format(
          "Acquire({}): overwrite while its device copy is leased; release that lease first",
          s.spec.name));
    }
    if (d.state != Copy::kAbsent) FreeCopy(id, Tier::kDevice);
  }
  Copy& c = s.copy[ti];
  if (mode != AcquireMode::kReadUntraced) trace_.Observe(id, tier, overwrite);
  // A copy made stale by a newer write elsewhere is dropped before it is used: once its
  // transfers (a load, a write-back, the staging of a device copy) are over.
  while (c.stale && (c.state == Copy::kLoading || c.state == Copy::kWriting ||
                     c.pins > c.leases)) {
    cv_.wait(lock);
  }
  if (c.stale && c.state == Copy::kReady && c.pins == 0) FreeCopy(id, tier);
  if (c.stale && c.state != Copy::kAbsent) {
    return FailedPrecondition(fmt::format(
        "Acquire({}): the {} copy is outdated (the other tier has newer data) and still leased; "
        "release it first", s.spec.name, TierName(tier)));
  }
  if (overwrite && c.state == Copy::kAbsent && s.spec.home != Tier::kHost) {
    // Nothing to read: take the memory, and the caller fills it.
    c.pins++;
    Slot slot;
    Status st = Reserve(lock, Tier::kHost, id, false, trace_.pos(), &slot);
    if (!st.ok()) {
      c.pins--;
      cv_.notify_all();
      return st;
    }
    if (c.state == Copy::kAbsent) {
      c.slot = std::move(slot);
      c.ptr = c.slot.ptr;
      c.state = Copy::kReady;
      stats_.overwrites++;
    } else {
      GiveSlot(id, Tier::kHost, std::move(slot));  // someone loaded it while we waited
    }
    Touch(c);
    Prefetch(lock, trace_.pos());
    return NewLease(id, tier);
  }
  const bool present = c.state != Copy::kAbsent;
  if (present) stats_.prefetch_hits++;
  else stats_.prefetch_misses++;
  c.pins++;
  Touch(c);
  Status st = StartLoad(lock, id, tier, false, trace_.pos());
  if (!st.ok()) {
    c.pins--;
    cv_.notify_all();
    return st;
  }
  Prefetch(lock, trace_.pos());
  return NewLease(id, tier);
}

Result<Lease::Ready> TierManager::WaitFor(ShardId id, Tier tier, bool enqueued_ok) {
  auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  bool waited = false;
  // Not while a write-back reads the copy (kWriting): the lease may write it, and a transfer
  // must never read memory a lease writes.
  // Nor while an h2d copy reads the host copy (h2d_reading), for the same reason.
  auto usable = [&] {
    if (tier == Tier::kHost && s.h2d_reading) return false;
    return c.state == Copy::kReady ||
           (enqueued_ok && tier == Tier::kDevice && c.state == Copy::kLoading && c.enqueued);
  };
  while (!usable()) {
    if (c.state == Copy::kAbsent) {
      if (!c.error.ok()) return c.error;
      ZINF_RETURN_IF_ERROR(StartLoad(lock, id, tier, false, trace_.pos()));
      continue;
    }
    // A waiter for a derived shard's copy (a device copy waits for the host one) takes the
    // derivation ahead of the prefetches queued before it.
    // So does a waiter for a prefetch's NVMe read: it becomes a demand read in the engine.
    Copy& h = s.copy[kHostIdx];
    if (!waited && h.state == Copy::kLoading) {
      if (s.spec.derive) {
        PromoteDerivation(id);
      } else if (h.read_ticket != 0 &&
                 swap_->engine().Promote(h.read_ticket, io::Priority::kDemand)) {
        stats_.read_promotions++;
      }
    }
    waited = true;
    cv_.wait(lock);
  }
  if (waited) {
    stats_.stall_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    Span("stall", s.spec.name, t0);
  }
  Lease::Ready r;
  r.ptr = c.ptr;
  if (c.state == Copy::kLoading) r.event = c.loaded;
  return r;
}

Status TierManager::Release(Lease lease, bool dirty, Event last_use) {
  if (lease.owner_ != this) return InvalidArgument("Release: a lease of another tier manager");
  std::lock_guard lock(mu_);
  Shard& s = *shards_[lease.shard_];
  const int ti = static_cast<int>(lease.tier_);
  Copy& c = s.copy[ti];
  lease.owner_ = nullptr;
  auto& held = holders_[ti];
  if (auto h = held.find(lease.holder_); h != held.end() && --h->second <= 0) held.erase(h);
  if (c.pins <= 0 || c.leases <= 0) {
    return Internal(fmt::format("Release: shard {} was not leased", s.spec.name));
  }
  role_leases_[ti][static_cast<int>(s.spec.role)]--;
  c.pins--;
  c.leases--;
  Touch(c);
  if (last_use.recorded()) {
    // The newest event of a stream covers that stream's older ones.
    std::erase_if(c.uses, [&](const Event& e) { return e.stream() == last_use.stream(); });
    c.uses.push_back(std::move(last_use));
  }
  Log().debug("tier: release {} {} dirty {}", s.spec.name, TierName(lease.tier_), dirty);
  if (dirty && s.spec.derive) {
    // Nothing can take the change home: the copy no longer holds what derive computes.
    DropOrMarkStale(lease.shard_, lease.tier_);
    cv_.notify_all();
    return FailedPrecondition(fmt::format(
        "Release({}, dirty): the shard is derived and cannot be written home", s.spec.name));
  }
  if (dirty && c.state != Copy::kAbsent) {
    if (!(lease.tier_ == Tier::kHost && s.spec.home == Tier::kHost)) {
      c.dirty = true;
      c.version++;
    }
    // The other tier's copy is now stale: drop it (it is reloaded from the newer one).
    const Tier other_tier = lease.tier_ == Tier::kDevice ? Tier::kHost : Tier::kDevice;
    const bool is_home = other_tier == Tier::kHost && s.spec.home == Tier::kHost;
    if (!is_home) DropOrMarkStale(lease.shard_, other_tier);
  }
  if (c.stale && c.pins == 0 && c.state == Copy::kReady) FreeCopy(lease.shard_, lease.tier_);
  if (dirty && options_.write_behind && lease.tier_ == Tier::kHost) StartWriteBehind(lease.shard_);
  cv_.notify_all();
  return Status::Ok();
}

Status TierManager::Flush() {
  std::unique_lock lock(mu_);
  Status first;
  for (ShardId id = 0; id < shards_.size(); ++id) {
    for (Tier t : {Tier::kDevice, Tier::kHost}) {
      Copy& c = shards_[id]->copy[static_cast<int>(t)];
      while (c.state == Copy::kLoading || c.state == Copy::kWriting) cv_.wait(lock);
      if (!c.dirty) continue;
      Status st = WriteBack(lock, id, t);
      if (!st.ok() && first.ok()) first = st;
    }
  }
  return first;
}

void TierManager::PauseTrace(bool paused) {
  std::lock_guard lock(mu_);
  trace_.Pause(paused);
}

void TierManager::EndStep() {
  std::unique_lock lock(mu_);
  if (trace_.EndStep()) Prefetch(lock, 0);  // the start of the next step
}

TierStats TierManager::stats() const {
  std::lock_guard lock(mu_);
  TierStats s = stats_;
  if (sealed_) {
    s.peak_device_bytes = fixed_bytes_[kDev] + tables_[kDev].peak_bytes();
    s.peak_host_bytes = fixed_bytes_[kHostIdx] + tables_[kHostIdx].peak_bytes();
  } else {
    s.peak_device_bytes = arena_.peak_bytes();
    s.peak_host_bytes = pool_.peak_bytes();
  }
  s.h2d_busy_seconds = h2d_->stats().copy_seconds;
  s.d2h_busy_seconds = d2h_->stats().copy_seconds;
  return s;
}

bool TierManager::has_trace() const {
  std::lock_guard lock(mu_);
  return trace_.valid();
}

}  // namespace zinf::offload
