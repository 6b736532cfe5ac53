#include "offload/tier_manager.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::offload {

using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kNever = std::numeric_limits<size_t>::max();
constexpr int kDev = static_cast<int>(Tier::kDevice);
constexpr int kHostIdx = static_cast<int>(Tier::kHost);
uint64_t UseKey(ShardId id, Tier t) { return (uint64_t{id} << 2) | static_cast<uint64_t>(t); }
}  // namespace

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

struct TierManager::Copy {
  enum State { kAbsent, kLoading, kReady, kWriting } state = kAbsent;
  void* ptr = nullptr;
  PinnedBlock block;   // host copies: the pool block
  int pins = 0;        // leases, plus transfers that read this copy
  int leases = 0;      // of the pins, those held by leases (the rest end with their transfer)
  // Set while the thread moving this copy waits for memory of the other tier before its
  // transfer can start: then the copy settles only if that thread gets its memory.
  std::thread::id waiter;
  bool dirty = false;  // newer than the copy below it
  uint64_t version = 0;  // bumped by every dirty release (a write-back in flight then stays dirty)
  Status error;        // the last load failed
  bool stale = false;  // the other tier got newer data while this copy was busy: drop when idle
  uint64_t last_use = 0;
};

struct TierManager::Shard {
  ShardSpec spec;
  bool pending = false;     // InstallPending's host copy is held until the home write ends
  Extent extent;            // home on NVMe
  uint64_t host_bytes = 0;  // padded for O_DIRECT
  Copy copy[2];             // [device], [host]
  bool device_wants_host = false;  // an h2d waits for the host copy's load
};

Result<void*> Lease::Wait() {
  if (owner_ == nullptr) return FailedPrecondition("Wait on an empty lease");
  return owner_->WaitFor(shard_, tier_);
}

TierManager::TierManager(Device& d, PinnedPool& p, SwapSpace* s, const TierManagerOptions& o)
    : device_(d), pool_(p), swap_(s), options_(o) {}

Result<std::unique_ptr<TierManager>> TierManager::Create(Device& device, PinnedPool& pool,
                                                         SwapSpace* swap,
                                                         const TierManagerOptions& options) {
  auto tm = std::unique_ptr<TierManager>(new TierManager(device, pool, swap, options));
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
  device_.StreamSynchronize(h2d_).IgnoreError();
  device_.StreamSynchronize(d2h_).IgnoreError();
  std::lock_guard lock(mu_);
  for (ShardId id = 0; id < shards_.size(); ++id) {
    FreeCopy(id, Tier::kDevice);
    if (shards_[id]->spec.home == Tier::kHost) {
      pool_.Free(shards_[id]->copy[kHostIdx].block);
    } else {
      FreeCopy(id, Tier::kHost);
    }
  }
  device_.UnregisterHost(pool_.base()).IgnoreError();
}

Result<ShardId> TierManager::Register(const ShardSpec& spec) {
  if (spec.bytes == 0) return InvalidArgument(fmt::format("shard {}: 0 bytes", spec.name));
  if (spec.home != Tier::kNvme && spec.home != Tier::kHost) {
    return InvalidArgument(fmt::format("shard {}: home must be nvme or host", spec.name));
  }
  if (spec.home == Tier::kNvme && swap_ == nullptr) {
    return FailedPrecondition(fmt::format(
        "shard {} is homed on NVMe but no swap space is configured (set nvme_path)", spec.name));
  }
  auto shard = std::make_unique<Shard>();
  shard->spec = spec;
  shard->host_bytes = swap_ ? swap_->Padded(spec.bytes) : spec.bytes;
  if (spec.bytes > device_.budget_bytes()) {
    return ResourceExhausted(fmt::format(
        "shard {} ({} bytes, {}) is larger than the whole device budget of {} bytes ({}): it "
        "could never be brought to the device; raise the device budget or split the unit",
        spec.name, spec.bytes, FormatBytesHuman(spec.bytes), device_.budget_bytes(),
        FormatBytesHuman(device_.budget_bytes())));
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
  } else if (spec.home == Tier::kNvme) {
    ZINF_ASSIGN_OR_RETURN(shard->extent, swap_->Allocate(spec.bytes));
  } else {
    auto block = pool_.Allocate(shard->host_bytes);
    if (!block.ok()) {
      return block.status().WithContext(fmt::format("shard {} homed in pinned memory", spec.name));
    }
    Copy& h = shard->copy[kHostIdx];
    h.block = *block;
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

Status TierManager::WriteHome(ShardId id, const void* src) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  for (auto& c : s.copy) {
    // A transfer in flight (a prefetch, a write-back) is waited for; a lease is an error.
    while (c.state == Copy::kLoading || c.state == Copy::kWriting) cv_.wait(lock);
  }
  for (auto& c : s.copy) {
    if (c.pins > 0) {
      return FailedPrecondition(fmt::format("WriteHome({}): the shard is leased", s.spec.name));
    }
  }
  FreeCopy(id, Tier::kDevice);
  if (s.spec.home == Tier::kHost) {
    std::memcpy(s.copy[kHostIdx].ptr, src, s.spec.bytes);
    return Status::Ok();
  }
  FreeCopy(id, Tier::kHost);
  lock.unlock();
  const uint64_t bytes = s.host_bytes;
  const uint64_t offset = s.extent.offset;
  ZINF_ASSIGN_OR_RETURN(auto buf, io::AlignedBuffer::Allocate(bytes, 4096));
  std::memcpy(buf.data(), src, s.spec.bytes);
  ZINF_RETURN_IF_ERROR(swap_->engine().Write(swap_->file(), offset, buf.data(), bytes));
  std::lock_guard relock(mu_);
  stats_.nvme_write_bytes += bytes;
  return Status::Ok();
}

Status TierManager::ReadHome(ShardId id, void* dst) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  if (s.spec.home == Tier::kHost) {
    std::memcpy(dst, s.copy[kHostIdx].ptr, s.spec.bytes);
    return Status::Ok();
  }
  lock.unlock();
  ZINF_ASSIGN_OR_RETURN(auto buf, io::AlignedBuffer::Allocate(s.host_bytes, 4096));
  ZINF_RETURN_IF_ERROR(swap_->engine().Read(swap_->file(), s.extent.offset, buf.data(),
                                            s.host_bytes));
  std::memcpy(dst, buf.data(), s.spec.bytes);
  return Status::Ok();
}

void TierManager::Span(const char* track, const std::string& what, Clock::time_point t0) {
  Tracer* t = options_.tracer;
  if (t != nullptr && t->enabled()) t->Complete(t->Track(track), what, t0, Clock::now(), "io");
}

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

size_t TierManager::NextUse(ShardId id, Tier tier, size_t after) const {
  auto it = uses_.find(UseKey(id, tier));
  if (it == uses_.end() || it->second.empty()) return kNever;
  auto& v = it->second;
  auto p = std::lower_bound(v.begin(), v.end(), after);
  if (p != v.end()) return *p;
  return v.front() + trace_.size();  // the next step repeats the trace
}

void TierManager::FreeCopy(ShardId id, Tier tier) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  if (tier == Tier::kHost && s.spec.home == Tier::kHost) return;  // the home stays
  if (c.state == Copy::kAbsent) return;
  Log().debug("tier: free {} {} (dirty {}, stale {})", s.spec.name, TierName(tier), c.dirty, c.stale);
  if (tier == Tier::kHost) {
    pool_.Free(c.block);
  } else {
    Status st = device_.Free(c.ptr);
    if (!st.ok() && sticky_.ok()) sticky_ = st;
  }
  Copy fresh;
  fresh.last_use = c.last_use;
  fresh.leases = c.leases;
  c = fresh;
}

Status TierManager::Reserve(std::unique_lock<std::mutex>& lock, Tier tier, uint64_t bytes,
                            bool prefetch, size_t need_pos, void** out, PinnedBlock* block) {
  bool announced = false;  // this call told the other waiters it waits too
  while (true) {
    if (tier == Tier::kHost) {
      auto b = pool_.Allocate(bytes);
      if (b.ok()) {
        *block = *b;
        *out = b->data;
        return Status::Ok();
      }
    } else {
      auto p = device_.Allocate(bytes);
      if (p.ok()) {
        *out = *p;
        return Status::Ok();
      }
    }
    // Pick a victim: unpinned, resident, not a home; farthest next use (or least recent).
    const int ti = static_cast<int>(tier);
    ShardId victim = 0;
    bool found = false;
    size_t best_next = 0;
    uint64_t best_tick = std::numeric_limits<uint64_t>::max();
    bool transient = false;
    uint64_t leased_bytes = 0;
    int leased = 0;
    uint64_t home_bytes = 0;
    for (ShardId j = 0; j < shards_.size(); ++j) {
      Shard& s = *shards_[j];
      Copy& c = s.copy[ti];
      if (tier == Tier::kHost && s.spec.home == Tier::kHost) {
        home_bytes += s.host_bytes;
        continue;
      }
      if (c.state == Copy::kAbsent) continue;
      if (c.state != Copy::kReady || c.pins > c.leases) {
        // A load, write-back or copy in flight: its end frees or unpins it. Unless the thread
        // moving it is itself waiting here for another thread's release: then it is counted
        // like a lease (waiting on it could be a deadlock).
        if (c.waiter == std::thread::id() || !reserving_.contains(c.waiter)) {
          transient = true;
        } else {
          leased++;
          leased_bytes += tier == Tier::kHost ? s.host_bytes : s.spec.bytes;
        }
        continue;
      }
      if (c.pins > 0) {
        leased++;
        leased_bytes += tier == Tier::kHost ? s.host_bytes : s.spec.bytes;
        continue;
      }
      if (prefetch && c.dirty) continue;  // a prefetch never waits for a write-back
      if (trace_valid_) {
        size_t next = NextUse(j, tier, pos_);
        if (prefetch && next <= need_pos) continue;  // needed no later than what we fetch
        if (!found || next > best_next) {
          found = true;
          victim = j;
          best_next = next;
        }
      } else {
        if (prefetch) continue;
        if (!found || c.last_use < best_tick) {
          found = true;
          victim = j;
          best_tick = c.last_use;
        }
      }
    }
    if (found) {
      ZINF_RETURN_IF_ERROR(Evict(lock, victim, tier));
      continue;
    }
    uint64_t budget = tier == Tier::kHost ? pool_.budget_bytes() : device_.budget_bytes();
    if (prefetch) {
      return ResourceExhausted(fmt::format("prefetch: no room in the {} tier", TierName(tier)));
    }
    if (transient) {
      cv_.wait(lock);  // a load or write-back in flight will settle
      continue;
    }
    if (OtherHolderCanRelease(tier)) {
      const auto me = std::this_thread::get_id();
      reserving_.insert(me);
      if (!announced) {
        // A waiter for this thread's leases re-checks: waiting may no longer end. Once per
        // call, so two waiters on a third do not wake each other in turn.
        cv_.notify_all();
        announced = true;
      }
      cv_.wait(lock);
      reserving_.erase(me);
      continue;
    }
    const uint64_t in_use = tier == Tier::kHost ? pool_.bytes_in_use() : device_.bytes_in_use();
    const std::string largest =
        tier == Tier::kHost ? fmt::format(", largest free block {}", pool_.largest_free_block())
                            : std::string();
    return ResourceExhausted(fmt::format(
        "{} tier: {} bytes needed, but of its {}-byte budget {} is held by {} leased shard(s) "
        "and {} by shards homed there ({} in use in all{}), and nothing else can be evicted; "
        "release shards before acquiring more, or raise the budget", TierName(tier), bytes,
        budget, leased_bytes, leased, home_bytes, in_use, largest));
  }
}

Lease TierManager::NewLease(ShardId id, Tier tier) {
  holders_[static_cast<int>(tier)][std::this_thread::get_id()]++;
  shards_[id]->copy[static_cast<int>(tier)].leases++;
  return Lease(this, id, tier);
}

bool TierManager::OtherHolderCanRelease(Tier tier) const {
  const auto me = std::this_thread::get_id();
  for (const auto& [thread, count] : holders_[static_cast<int>(tier)]) {
    if (thread != me && count > 0 && !reserving_.contains(thread)) return true;
  }
  return false;
}

Status TierManager::WriteBack(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier) {
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  if (!c.dirty) return Status::Ok();
  const uint64_t version = c.version;
  Log().debug("tier: write back {} {}", s.spec.name, TierName(tier));
  if (tier == Tier::kDevice) {
    Copy& h = s.copy[kHostIdx];
    c.pins++;  // nobody may free it while it is read
    if (h.state == Copy::kAbsent) {
      void* p = nullptr;
      PinnedBlock b;
      c.waiter = std::this_thread::get_id();
      Status st = Reserve(lock, Tier::kHost, s.host_bytes, false, 0, &p, &b);
      c.waiter = std::thread::id();
      if (!st.ok()) {
        c.pins--;
        cv_.notify_all();  // a waiter may have seen this pin as a transfer in flight
        return st.WithContext(fmt::format("writing {} back from the device", s.spec.name));
      }
      if (h.state == Copy::kAbsent) {
        h.block = b;
        h.ptr = p;
        h.state = Copy::kReady;
      } else {
        pool_.Free(b);
      }
    }
    while (h.state == Copy::kLoading || h.state == Copy::kWriting) cv_.wait(lock);
    h.pins++;
    c.state = Copy::kWriting;
    auto done = std::make_shared<bool>(false);
    Status st = device_.CopyToHost(d2h_, h.ptr, c.ptr, s.spec.bytes);
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
    if (!st.ok()) return st.WithContext(fmt::format("copying {} to the host", s.spec.name));
    stats_.d2h_bytes += s.spec.bytes;
    if (c.version == version) c.dirty = false;
    h.stale = false;  // it now holds the newest data
    if (s.spec.home == Tier::kNvme) {
      h.dirty = true;
      h.version++;
    }
    cv_.notify_all();
    return Status::Ok();
  }
  // Host copy to its NVMe home.
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

Status TierManager::Evict(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier) {
  Copy& c = shards_[id]->copy[static_cast<int>(tier)];
  if (c.dirty) ZINF_RETURN_IF_ERROR(WriteBack(lock, id, tier));
  // WriteBack released the lock: the copy may have been leased meanwhile.
  if (c.pins > 0 || c.state != Copy::kReady || c.dirty) return Status::Ok();
  FreeCopy(id, tier);
  stats_.evictions++;
  cv_.notify_all();
  return Status::Ok();
}

void TierManager::StartHostToDevice(ShardId id) {
  Shard& s = *shards_[id];
  Copy& d = s.copy[kDev];
  Copy& h = s.copy[kHostIdx];
  s.device_wants_host = false;
  Log().debug("tier: h2d {}", s.spec.name);
  inflight_bytes_[1] += s.spec.bytes;
  Status st = device_.CopyToDevice(h2d_, d.ptr, h.ptr, s.spec.bytes);
  if (st.ok()) {
    st = device_.Launch(h2d_, [this, id, t0 = Clock::now()] {
      std::lock_guard l(mu_);
      Shard& sh = *shards_[id];
      Span("h2d", sh.spec.name, t0);
      sh.copy[kDev].state = Copy::kReady;
      sh.copy[kHostIdx].pins--;
      if (sh.copy[kDev].stale && sh.copy[kDev].pins == 0) FreeCopy(id, Tier::kDevice);
      if (sh.copy[kHostIdx].stale && sh.copy[kHostIdx].pins == 0 &&
          sh.copy[kHostIdx].state == Copy::kReady) {
        FreeCopy(id, Tier::kHost);
      }
      stats_.h2d_bytes += sh.spec.bytes;
      inflight_bytes_[1] -= sh.spec.bytes;
      cv_.notify_all();
      return Status::Ok();
    });
  }
  if (!st.ok()) {
    inflight_bytes_[1] -= s.spec.bytes;
    AbandonDeviceLoad(id, st);
  }
}

void TierManager::AbandonDeviceLoad(ShardId id, Status error) {
  Shard& s = *shards_[id];
  Copy& d = s.copy[kDev];
  s.device_wants_host = false;
  s.copy[kHostIdx].pins--;  // the staging pin taken when the device load started
  device_.Free(d.ptr).IgnoreError();
  d.ptr = nullptr;
  d.state = Copy::kAbsent;
  d.error = std::move(error);
  cv_.notify_all();
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
      // The newest data is on the device, not at home: copy it down instead of reading NVMe.
      if (prefetch) return ResourceExhausted("prefetch: newer data on the device");
      while (d.state == Copy::kLoading || d.state == Copy::kWriting) cv_.wait(lock);
      if (d.dirty) return WriteBack(lock, id, Tier::kDevice);
    }
  }
  if (c.state != Copy::kAbsent) return Status::Ok();
  c.error = Status::Ok();
  if (tier == Tier::kHost) {
    if (s.spec.home == Tier::kHost) return Status::Ok();
    void* p = nullptr;
    PinnedBlock b;
    ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kHost, s.host_bytes, prefetch, need_pos, &p, &b));
    if (c.state != Copy::kAbsent) {  // someone else started it while we waited
      pool_.Free(b);
      return Status::Ok();
    }
    c.block = b;
    c.ptr = p;
    c.state = Copy::kLoading;
    Log().debug("tier: read {} from nvme (prefetch {})", s.spec.name, prefetch);
    inflight_bytes_[0] += s.host_bytes;
    LinkBusy(0, +1);
    Status st = swap_->engine().Submit(
        {io::OpKind::kRead, swap_->file(), s.extent.offset, c.ptr, s.host_bytes},
        [this, id, t0 = Clock::now()](const Status& r) {
          std::lock_guard l(mu_);
          Shard& sh = *shards_[id];
          Copy& hc = sh.copy[kHostIdx];
          Span("nvme read", sh.spec.name, t0);
          LinkBusy(0, -1);
          inflight_bytes_[0] -= sh.host_bytes;
          if (r.ok()) {
            stats_.nvme_read_bytes += sh.host_bytes;
            hc.state = Copy::kReady;
            if (sh.device_wants_host) StartHostToDevice(id);
            if (hc.stale && hc.pins == 0) FreeCopy(id, Tier::kHost);
          } else {
            pool_.Free(hc.block);
            hc.block = {};
            hc.ptr = nullptr;
            hc.state = Copy::kAbsent;
            hc.error = r.WithContext(fmt::format("loading shard {}", sh.spec.name));
            if (sh.device_wants_host) AbandonDeviceLoad(id, hc.error);
          }
          cv_.notify_all();
        });
    if (!st.ok()) {
      LinkBusy(0, -1);
      inflight_bytes_[0] -= s.host_bytes;
      pool_.Free(c.block);
      c.block = {};
      c.ptr = nullptr;
      c.state = Copy::kAbsent;
      return st;
    }
    return Status::Ok();
  }
  // Device copy: device memory, then the host copy (loaded if needed), then the h2d copy.
  if (options_.max_inflight_bytes && prefetch &&
      inflight_bytes_[1] + s.spec.bytes > options_.max_inflight_bytes) {
    return ResourceExhausted("prefetch: h2d link full");
  }
  void* p = nullptr;
  ZINF_RETURN_IF_ERROR(Reserve(lock, Tier::kDevice, s.spec.bytes, prefetch, need_pos, &p, nullptr));
  if (c.state != Copy::kAbsent) {
    device_.Free(p).IgnoreError();
    return Status::Ok();
  }
  c.ptr = p;
  c.state = Copy::kLoading;
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
  if (!trace_valid_ || !options_.prefetch) return;
  const size_t n = trace_.size();
  uint32_t units_ahead = 0;
  uint32_t last_unit = pos > 0 ? shards_[trace_[pos - 1].first]->spec.unit
                               : std::numeric_limits<uint32_t>::max();
  // Shards overwritten ahead: their later reads see what the overwrite wrote, not home.
  std::vector<ShardId> overwritten;
  // Not past the end of the step: the next step's first units are rewritten by the optimizer
  // (or overwritten) before they are used; EndStep prefetches them.
  for (size_t q = pos; q < n; ++q) {
    auto [id, tier] = trace_[q];
    Shard& s = *shards_[id];
    if (s.spec.unit != last_unit) {
      last_unit = s.spec.unit;
      if (++units_ahead > options_.prefetch_units) break;
    }
    Copy& c = s.copy[static_cast<int>(tier)];
    if (trace_overwrite_[q]) {
      overwritten.push_back(id);
      continue;
    }
    if (c.state != Copy::kAbsent ||
        std::find(overwritten.begin(), overwritten.end(), id) != overwritten.end()) {
      continue;
    }
    if (tier == Tier::kHost && options_.max_inflight_bytes &&
        inflight_bytes_[0] + s.host_bytes > options_.max_inflight_bytes) {
      break;
    }
    if (!StartLoad(lock, id, tier, /*prefetch=*/true, q).ok()) break;
  }
}

Result<Lease> TierManager::Acquire(ShardId id, Tier tier, AcquireMode mode) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("Acquire: unknown shard {}", id));
  if (tier != Tier::kHost && tier != Tier::kDevice) {
    return InvalidArgument("Acquire: the tier must be host or device");
  }
  const bool overwrite = mode == AcquireMode::kOverwrite;
  if (overwrite && (tier != Tier::kHost || shards_[id]->copy[kDev].state != Copy::kAbsent)) {
    return InvalidArgument(fmt::format("Acquire({}): overwrite is for the host tier of a shard "
                                       "with no device copy", shards_[id]->spec.name));
  }
  if (!sticky_.ok()) return std::exchange(sticky_, Status::Ok());
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  // Trace bookkeeping and prefetch accounting.
  if (trace_paused_ || mode == AcquireMode::kReadUntraced) {
    // Outside the step's order: no bookkeeping.
  } else if (recording_) {
    trace_.push_back({id, tier});
    trace_overwrite_.push_back(overwrite);
  } else if (trace_valid_) {
    if (pos_ < trace_.size() && trace_[pos_] == std::make_pair(id, tier)) {
      pos_++;
    } else {
      trace_valid_ = false;  // the order changed: on demand until the step ends, then record
    }
  }
  // A copy made stale by a newer write elsewhere is dropped before it is used.
  while (c.stale && (c.state == Copy::kLoading || c.state == Copy::kWriting)) cv_.wait(lock);
  if (c.stale && c.state == Copy::kReady && c.pins == 0) FreeCopy(id, tier);
  if (overwrite && c.state == Copy::kAbsent && s.spec.home != Tier::kHost) {
    // Nothing to read: take the memory, and the caller fills it.
    void* p = nullptr;
    PinnedBlock b;
    c.pins++;
    Status st = Reserve(lock, Tier::kHost, s.host_bytes, false, pos_, &p, &b);
    if (!st.ok()) {
      c.pins--;
      cv_.notify_all();
      return st;
    }
    if (c.state == Copy::kAbsent) {
      c.block = b;
      c.ptr = p;
      c.state = Copy::kReady;
      stats_.overwrites++;
    } else {
      pool_.Free(b);  // someone loaded it while we waited for memory
    }
    c.last_use = ++tick_;
    Prefetch(lock, pos_);
    return NewLease(id, tier);
  }
  const bool present = c.state != Copy::kAbsent;
  if (present) stats_.prefetch_hits++;
  else stats_.prefetch_misses++;
  c.pins++;
  c.last_use = ++tick_;
  Status st = StartLoad(lock, id, tier, false, pos_);
  if (!st.ok()) {
    c.pins--;
    cv_.notify_all();
    return st;
  }
  Prefetch(lock, pos_);
  return NewLease(id, tier);
}

Result<void*> TierManager::WaitFor(ShardId id, Tier tier) {
  auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  Shard& s = *shards_[id];
  Copy& c = s.copy[static_cast<int>(tier)];
  bool waited = false;
  while (c.state != Copy::kReady && c.state != Copy::kWriting) {
    if (c.state == Copy::kAbsent) {
      if (!c.error.ok()) return c.error;
      ZINF_RETURN_IF_ERROR(StartLoad(lock, id, tier, false, pos_));
      continue;
    }
    waited = true;
    cv_.wait(lock);
  }
  if (waited) {
    stats_.stall_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    Span("stall", s.spec.name, t0);
  }
  return c.ptr;
}

Status TierManager::Release(Lease lease, bool dirty) {
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
  c.pins--;
  c.leases--;
  c.last_use = ++tick_;
  Log().debug("tier: release {} {} dirty {}", s.spec.name, TierName(lease.tier_), dirty);
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
  cv_.notify_all();
  return Status::Ok();
}

Status TierManager::Invalidate(ShardId id) {
  std::unique_lock lock(mu_);
  if (id >= shards_.size()) return InvalidArgument(fmt::format("unknown shard {}", id));
  Shard& s = *shards_[id];
  for (auto& c : s.copy) {
    while (c.state == Copy::kLoading || c.state == Copy::kWriting) cv_.wait(lock);
    if (c.pins > 0 || c.dirty) {
      return FailedPrecondition(fmt::format(
          "Invalidate({}): a copy is {}", s.spec.name, c.pins > 0 ? "leased" : "dirty"));
    }
  }
  FreeCopy(id, Tier::kDevice);
  FreeCopy(id, Tier::kHost);
  cv_.notify_all();
  return Status::Ok();
}

Result<bool> TierManager::InstallPending(ShardId id, const void* data) {
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
  void* p = nullptr;
  PinnedBlock block;
  const size_t next = trace_valid_ ? NextUse(id, Tier::kDevice, pos_) : 0;
  Status st = Reserve(lock, Tier::kHost, s.host_bytes, /*prefetch=*/true, next, &p, &block);
  if (!st.ok()) {
    if (st.code() == StatusCode::kResourceExhausted) return false;
    return st;
  }
  Copy& h = s.copy[kHostIdx];
  if (h.state != Copy::kAbsent) {  // Reserve never waits when prefetching, but be sure
    pool_.Free(block);
    return false;
  }
  // Loading (users wait for it) while the bytes are copied outside the lock: a unit's weights
  // can be 100 MB, and completions and acquires must not stall behind that.
  h.block = block;
  h.ptr = p;
  h.state = Copy::kLoading;
  h.pins = 1;  // held (not a lease) until the home write ends
  h.last_use = ++tick_;
  s.pending = true;
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
  if (id >= shards_.size() || !shards_[id]->pending) return;
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
  for (auto& c : s.copy) {
    while (c.state == Copy::kLoading || c.state == Copy::kWriting) cv_.wait(lock);
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
  trace_paused_ = paused;
}

void TierManager::EndStep() {
  std::unique_lock lock(mu_);
  if (recording_) {
    recording_ = false;
    trace_valid_ = !trace_.empty();
  } else if (trace_valid_ && pos_ != trace_.size()) {
    trace_valid_ = false;  // a shorter step than the trace: record the next one
  }
  if (!trace_valid_) {
    if (!recording_ || !trace_.empty()) {
      recording_ = true;
      trace_.clear();
      trace_overwrite_.clear();
    }
    uses_.clear();
    pos_ = 0;
    return;
  }
  uses_.clear();
  for (size_t i = 0; i < trace_.size(); ++i) {
    uses_[UseKey(trace_[i].first, trace_[i].second)].push_back(i);
  }
  pos_ = 0;
  Prefetch(lock, 0);  // the start of the next step
}

TierStats TierManager::stats() const {
  std::lock_guard lock(mu_);
  TierStats s = stats_;
  s.peak_host_bytes = pool_.peak_bytes();
  s.peak_device_bytes = device_.peak_bytes();
  s.h2d_busy_seconds = h2d_->stats().copy_seconds;
  s.d2h_busy_seconds = d2h_->stats().copy_seconds;
  return s;
}

bool TierManager::has_trace() const {
  std::lock_guard lock(mu_);
  return trace_valid_;
}

}  // namespace zinf::offload
