// offload/tier_manager.h — where every shard lives, and bringing it up just in time.
//
// A shard (one unit's tensors of one role, flattened) has a home — NVMe (an extent in the swap
// space) or pinned host memory — and copies above it while in use: a host copy (a block of the
// pinned pool, the staging for NVMe and for the device link) and a device copy (device memory).
//
// Contract:
// - Register() refuses, with the numbers, a shard larger than the device budget or the pinned
//   budget: such a configuration could never run, so it is refused at start, not mid-run.
// - Acquire(shard, tier) returns a Lease at once; Lease::Wait() blocks until the data is in that
//   tier (NVMe -> host by the I/O engine, host -> device by a copy on the device's h2d stream) and
//   returns its address. A leased copy is pinned: never evicted until Release. Release(dirty)
//   marks the copy modified: it is written home (device -> host -> NVMe) before its memory is
//   reused, and a copy is marked clean only after its write completed successfully — a failed
//   write leaves it resident and dirty and the error reaches the caller that needed the memory.
// - Budgets are hard: host copies come from the PinnedPool, device copies from Device::Allocate;
//   neither is ever exceeded. When memory is short an unpinned copy is evicted: the one whose
//   next use is farthest (Belady's rule over the recorded trace), or the least recently used
//   while no trace is known. When everything left in the tier is leased, Acquire waits while
//   another thread that is not itself waiting for memory holds a lease in that tier (its
//   Release frees room: the optimizer thread's gradient leases beside the computing thread's);
//   otherwise (only the caller's own leases, or every holder waiting on another) it fails with
//   ResourceExhausted naming the numbers instead of waiting forever. A copy in transfer is
//   waited for, except one whose mover is itself waiting for memory here (a write-back or load
//   that needs the other tier first): it counts as leased, so two threads never wait on each
//   other.
// - Prefetch: the first step (up to EndStep) records the order of acquires. In later steps each
//   acquire that matches the trace issues the fetches that follow it, as far ahead as memory
//   allows without evicting anything needed sooner (and within max_inflight_bytes per link).
//   An acquire that departs from the trace drops back to on-demand fetches and records anew.
//
// Thread-safety: all methods may be called from any thread. Completions arrive on the I/O
// engine's reaper thread and the device's stream threads; internal state is under one mutex,
// never held while blocking on the device.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "src/base/device.h"
#include "src/base/trace.h"
#include "zinf/status.h"

namespace zinf::offload {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
std::string_view TierName(Tier t);
enum class Role : uint8_t { kParam16, kMaster, kExpAvg, kExpAvgSq, kGrad };
std::string_view RoleName(Role r);

using ShardId = uint32_t;

// kRead: the lease sees the shard's current content. kOverwrite (host tier only): the caller
// overwrites all of it, so an absent copy is not read from home (its content is undefined until
// written) and prefetch skips it; release it dirty.
// kReadUntraced: as kRead, but outside the step's access order (neither recorded nor matched):
// for a thread that runs beside the one whose order the trace follows (the optimizer pipeline
// running under the next forward).
enum class AcquireMode : uint8_t { kRead, kOverwrite, kReadUntraced };

struct ShardSpec {
  std::string name;  // for messages and traces, e.g. "block3.param16"
  uint32_t unit = 0;
  Role role = Role::kParam16;
  uint64_t bytes = 0;
  Tier home = Tier::kNvme;  // kNvme or kHost
  // kNvme: an extent of the swap space that already holds the shard (the optimizer pipeline
  // writes param16 there); unset: one is allocated at registration.
  std::optional<Extent> home_extent;
};

struct TierManagerOptions {
  bool prefetch = true;
  // How far ahead prefetch reaches, in units (ShardSpec::unit) beyond the acquire that
  // triggers it; the config's zinf.prefetch_depth. Budgets bound it too.
  uint32_t prefetch_units = std::numeric_limits<uint32_t>::max();
  uint64_t max_inflight_bytes = 0;  // per link (NVMe read, h2d); 0 = bounded by budgets only
  Tracer* tracer = nullptr;  // spans on "nvme read", "nvme write", "h2d", "d2h", "stall"
};

struct TierStats {
  uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0, h2d_bytes = 0, d2h_bytes = 0;
  double nvme_read_busy_seconds = 0, nvme_write_busy_seconds = 0;
  double h2d_busy_seconds = 0, d2h_busy_seconds = 0;  // the device streams' copy time
  double stall_seconds = 0;  // time callers spent in Lease::Wait
  uint64_t prefetch_hits = 0, prefetch_misses = 0;
  uint64_t evictions = 0, writebacks = 0;
  uint64_t overwrites = 0, discards = 0;  // reads and write-backs saved by those modes
  uint64_t installs = 0;                  // InstallPending copies (NVMe reads saved)
  uint64_t peak_host_bytes = 0, peak_device_bytes = 0;
};

class TierManager;

// One use of a shard in a tier. Move-only; release it with TierManager::Release.
class Lease {
 public:
  Lease() = default;
  Lease(Lease&& o) noexcept { *this = std::move(o); }
  Lease& operator=(Lease&& o) noexcept {
    std::swap(owner_, o.owner_);
    shard_ = o.shard_;
    tier_ = o.tier_;
    holder_ = o.holder_;
    return *this;
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // Blocks until the copy is in place; returns its address (host or device memory).
  Result<void*> Wait();
  ShardId shard() const { return shard_; }
  Tier tier() const { return tier_; }
  bool valid() const { return owner_ != nullptr; }

 private:
  friend class TierManager;
  Lease(TierManager* owner, ShardId shard, Tier tier)
      : owner_(owner), shard_(shard), tier_(tier), holder_(std::this_thread::get_id()) {}
  TierManager* owner_ = nullptr;
  ShardId shard_ = 0;
  Tier tier_ = Tier::kHost;
  std::thread::id holder_;  // the thread that acquired it (counted until Release)
};

class TierManager {
 public:
  // `swap` may be null when no shard is homed on NVMe. The pool's arena is registered with the
  // device (pinned for DMA) and with the swap space's engine by Create.
  static Result<std::unique_ptr<TierManager>> Create(Device& device, PinnedPool& pool,
                                                     SwapSpace* swap,
                                                     const TierManagerOptions& options);
  ~TierManager();  // waits for transfers in flight; dirty copies are NOT flushed (call Flush)

  Result<ShardId> Register(const ShardSpec& spec);
  const ShardSpec& spec(ShardId id) const;

  // Sets the shard's home content (initialisation, or new weights from the optimizer) and drops
  // every copy of it; waits for a transfer of the shard in flight (a prefetch); FailedPrecondition
  // when a copy is leased.
  Status WriteHome(ShardId id, const void* src);
  // Reads the shard's home content (after Flush), for checks and checkpoints.
  Status ReadHome(ShardId id, void* dst);

  Result<Lease> Acquire(ShardId id, Tier tier, AcquireMode mode = AcquireMode::kRead);
  Status Release(Lease lease, bool dirty);

  // The shard's content is dead (gradients the optimizer consumed): drops every copy without
  // writing it home, dirty or not. FailedPrecondition when a copy is leased. The home keeps
  // whatever it held; read the shard again only after overwriting it.
  Status Discard(ShardId id);

  // The home was rewritten behind the manager's back (the optimizer wrote new param16 there):
  // drops every copy. FailedPrecondition when a copy is leased or dirty (it would be lost).
  Status Invalidate(ShardId id);

  // The home was rewritten behind the manager's back and the write has completed: every copy is
  // dropped now if idle, else marked stale (dropped before its next use, or when its transfer
  // ends). Never blocks: may be called from an I/O completion. After InstallPending(id) it
  // instead ends the pending state (the installed copy already holds what the home now holds).
  void HomeRewritten(ShardId id);

  // New content for an NVMe-homed shard whose home write (by someone else: the optimizer
  // pipeline writing param16) is starting: installs `data` (spec.bytes) as its host copy so it
  // can be used before that write completes. The copy is clean and held (never evicted) until
  // HomeRewritten(id) reports the write done (or EndPending(id, false) gives up on it: the copy
  // is dropped) — evicting it earlier could re-read the old home. Old copies are dropped. Never
  // waits: returns false, installing nothing, when a copy of the shard is leased or in transfer,
  // or when the host tier has no room without evicting a dirty copy or one needed sooner than
  // this shard's next use (the caller then waits for the home write as before).
  Result<bool> InstallPending(ShardId id, const void* data);
  // Ends InstallPending's hold: home_written true keeps the copy (as HomeRewritten), false drops
  // it. No-op when nothing is pending. Never blocks.
  void EndPending(ShardId id, bool home_written);

  // Writes every dirty copy home and waits; the first error.
  Status Flush();
  // Marks the end of a step: the first call ends the recording of the trace.
  void EndStep();
  // While paused, acquires are neither recorded nor matched against the trace (an evaluation
  // pass between steps must not make the next step lose its prefetch).
  void PauseTrace(bool paused);

  TierStats stats() const;
  bool has_trace() const;

 private:
  friend class Lease;
  struct Copy;
  struct Shard;
  TierManager(Device& d, PinnedPool& p, SwapSpace* s, const TierManagerOptions& o);

  Result<void*> WaitFor(ShardId id, Tier tier);
  // All REQUIRE mu_ held (the lock is passed where the call may wait).
  Status StartLoad(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier, bool prefetch,
                   size_t need_pos);
  Status Reserve(std::unique_lock<std::mutex>& lock, Tier tier, uint64_t bytes, bool prefetch,
                 size_t need_pos, void** out, PinnedBlock* block);
  Status Evict(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier);
  Status WriteBack(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier);
  void FreeCopy(ShardId id, Tier tier);
  size_t NextUse(ShardId id, Tier tier, size_t after) const;
  void Prefetch(std::unique_lock<std::mutex>& lock, size_t pos);
  void StartHostToDevice(ShardId id);
  // Undoes a device load that cannot finish: unpins the host staging, frees the device memory,
  // leaves the copy absent with `error` for its waiters.
  void AbandonDeviceLoad(ShardId id, Status error);
  void LinkBusy(int link, int delta);
  void EndPendingLocked(ShardId id, bool home_written);
  // A copy holding outdated content: freed now when idle, else marked stale (dropped before its
  // next use, or when its transfer or lease ends). No-op when absent.
  void DropOrMarkStale(ShardId id, Tier tier);
  // Makes the lease `id`/`tier` for the calling thread (counted in holders_).
  Lease NewLease(ShardId id, Tier tier);
  // True when a thread other than the caller holds a lease in `tier` and is not itself waiting
  // in Reserve: waiting for its Release can succeed.
  bool OtherHolderCanRelease(Tier tier) const;
  void Span(const char* track, const std::string& what, std::chrono::steady_clock::time_point t0);

  Device& device_;
  PinnedPool& pool_;
  SwapSpace* swap_;
  TierManagerOptions options_;
  Stream* h2d_ = nullptr;
  Stream* d2h_ = nullptr;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a copy changed state
  std::vector<std::unique_ptr<Shard>> shards_;
  uint64_t tick_ = 0;
  // The trace: recorded in the first step, replayed after.
  std::vector<std::pair<ShardId, Tier>> trace_;
  std::vector<bool> trace_overwrite_;  // per trace entry: an overwrite acquire (nothing to fetch)
  bool recording_ = true;
  bool trace_paused_ = false;
  bool trace_valid_ = false;
  size_t pos_ = 0;  // replay position: index of the next expected acquire
  std::unordered_map<uint64_t, std::vector<size_t>> uses_;  // (shard, tier) -> positions
  uint64_t inflight_bytes_[2] = {0, 0};  // [0] NVMe reads, [1] h2d
  int link_active_[2] = {0, 0};          // [0] NVMe read, [1] NVMe write
  std::chrono::steady_clock::time_point link_since_[2];
  TierStats stats_;
  Status sticky_;  // an asynchronous failure nobody waited on yet
  // Leases held, per tier ([0] device, [1] host) and acquiring thread; threads waiting in
  // Reserve for another's Release.
  std::unordered_map<std::thread::id, int> holders_[2];
  std::unordered_set<std::thread::id> reserving_;
};

}  // namespace zinf::offload
