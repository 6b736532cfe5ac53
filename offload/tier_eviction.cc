// TierManager's eviction: the use clock (Touch), the record of a copy the policy ranks
// (Candidate), taking a slot of a class and evicting for it (Reserve, Evict). The policy itself
// is offload/eviction_policy.h. Every function here REQUIRES mu_ held.
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "offload/tier_manager.h"
#include "offload/tier_manager_internal.h"
#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf::offload {

void TierManager::Touch(Copy& c) { c.last_use = ++tick_; }

EvictionCandidate TierManager::Candidate(ShardId id, Tier tier) const {
  const Shard& s = *shards_[id];
  const Copy& c = s.copy[static_cast<int>(tier)];
  const bool device = tier == Tier::kDevice;
  EvictionCandidate e;
  e.id = id;
  e.bytes = device ? s.spec.bytes : s.host_bytes;
  e.dirty = c.dirty;
  e.last_use = c.last_use;
  e.next_use = trace_.valid() ? trace_.NextUse(id, tier, trace_.pos()) : kNever;
  // The links' rates so far (bytes over busy seconds), else nominal ones.
  auto rate = [](uint64_t bytes, double seconds, double nominal) {
    return bytes > 0 && seconds > 0 ? static_cast<double>(bytes) / seconds : nominal;
  };
  const double nvme_read = rate(stats_.nvme_read_bytes, stats_.nvme_read_busy_seconds, 2e9);
  const double nvme_write = rate(stats_.nvme_write_bytes, stats_.nvme_write_busy_seconds, 2e9);
  const double h2d = rate(stats_.h2d_bytes, stats_.h2d_busy_seconds, 20e9);
  const double d2h = rate(stats_.d2h_bytes, stats_.d2h_busy_seconds, 20e9);
  constexpr double kDeriveRate = 10e9;  // a cast from master weights in memory
  const double bytes = static_cast<double>(e.bytes);
  // Bringing the host copy back: a read of the NVMe home, or a derivation.
  const double host_refetch = bytes / (s.spec.derive ? kDeriveRate : nvme_read);
  if (device) {
    const bool host_resident = s.copy[kHostIdx].state == Copy::kReady ||
                               s.spec.home == Tier::kHost;
    e.refetch_seconds = bytes / h2d + (host_resident ? 0 : host_refetch);
    e.writeback_seconds = c.dirty ? bytes / d2h : 0;
  } else {
    e.refetch_seconds = host_refetch;
    e.writeback_seconds = c.dirty ? bytes / nvme_write : 0;
  }
  return e;
}

Status TierManager::Reserve(std::unique_lock<std::mutex>& lock, Tier tier, ShardId id,
                            bool prefetch, size_t need_pos, Slot* out) {
  const int ti = static_cast<int>(tier);
  const int cls = shards_[id]->cls[ti];
  if (cls < 0) {
    return Internal(fmt::format("shard {} has no {} slot class (registered after Seal?)",
                                shards_[id]->spec.name, TierName(tier)));
  }
  SlotTable& t = tables_[ti];
  bool announced = false;  // this call told the other waiters it waits too
  std::vector<EvictionCandidate> candidates;
  while (true) {
    if (t.Take(cls, out)) return Status::Ok();
    // A victim among the unpinned, resident copies of this class.
    bool transient = false;
    int leased = 0;
    candidates.clear();
    for (ShardId j : members_[ti][cls]) {
      Copy& c = shards_[j]->copy[ti];
      if (c.state == Copy::kAbsent) continue;
      if (c.state != Copy::kReady || c.pins > c.leases) {
        // A load, write-back or copy in flight: its end frees or unpins it. Unless the thread
        // moving it is itself waiting here for another thread's release: then it is counted
        // like a lease (waiting on it could be a deadlock).
        if (c.waiter == std::thread::id() || !reserving_.contains(c.waiter)) transient = true;
        else leased++;
        continue;
      }
      if (c.pins > 0) {
        leased++;
        continue;
      }
      candidates.push_back(Candidate(j, tier));
    }
    const EvictionRequest request{.tier = tier,
                                  .prefetch = prefetch,
                                  .need_pos = need_pos,
                                  .trace_valid = trace_.valid(),
                                  .pos = trace_.pos()};
    const std::optional<ShardId> victim = eviction_->PickVictim(request, candidates);
    if (victim) {
      ZINF_RETURN_IF_ERROR(Evict(lock, *victim, tier));
      continue;
    }
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
    const SlotClassInfo& info = t.info(cls);
    const Shard& s = *shards_[id];
    const uint64_t bytes = tier == Tier::kHost ? s.host_bytes : s.spec.bytes;
    return ResourceExhausted(fmt::format(
        "{} tier: shard {} needs a slot of {} bytes ({}; the shard is {} bytes), but all {} "
        "slots of that size are held: {} by leases (of them this thread's own, or by threads "
        "that wait themselves) and {} by transfers that wait on this thread; release shards "
        "before acquiring more, or declare more leases at Seal",
        TierName(tier), s.spec.name, info.slot_bytes, FormatBytesHuman(info.slot_bytes), bytes,
        info.slots, leased, info.slots - static_cast<uint32_t>(leased)));
  }
}

Status TierManager::Evict(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier) {
  Copy& c = shards_[id]->copy[static_cast<int>(tier)];
  if (c.dirty) ZINF_RETURN_IF_ERROR(WriteBack(lock, id, tier));
  // WriteBack released the lock: the copy may have been leased meanwhile.
  if (c.pins > 0 || c.state != Copy::kReady || c.dirty) return Status::Ok();
  FreeCopy(id, tier);
  stats_.evictions++;
  (tier == Tier::kDevice ? stats_.device_evictions : stats_.host_evictions)++;
  cv_.notify_all();
  return Status::Ok();
}

}  // namespace zinf::offload
