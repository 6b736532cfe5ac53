// offload/tier_manager.h — where every shard lives, and bringing it up just in time.
//
// A shard (one unit's tensors of one role, flattened) has a home — NVMe (an extent in the swap
// space) or pinned host memory — and copies above it while in use: a host copy (a slot of the
// pinned pool, the staging for NVMe and for the device link) and a device copy (a slot of the
// device arena). An NVMe-homed shard may instead be derived (ShardSpec::derive): its content is
// computed from memory its owner keeps (16-bit weights from fp32 master weights in host
// memory), so a load runs that function on the manager's derive thread instead of reading the
// disk, and nothing of it is ever read from or written to NVMe.
//
// Contract:
// - Memory is planned once. Register() every shard first (a shard larger than the device
//   budget or the pinned budget is refused with the numbers); then Seal() carves what is left
//   of the device arena and of the pinned pool into slots of a few size classes
//   (offload/slot_table.h), each class holding at least the leases its roles may hold at once
//   (SealOptions::max_leases, enforced by Acquire) plus a spare for a copy in transfer. A plan
//   that cannot hold that is refused at Seal, naming each class's need, so a sealed manager
//   never fails mid-run for lack of memory, however its callers interleave; the first
//   Acquire/WriteHome/ReadHome/InstallPending seals with the defaults if nobody did.
// - Acquire(shard, tier) returns a Lease at once; Lease::Wait() blocks until the data is in that
//   tier (NVMe -> host by the I/O engine, host -> device by a copy on the device's h2d stream), and
//   no write-back is reading it (a lease may write the copy: a transfer never reads memory a
//   lease writes), and returns its address. Lease::WaitEnqueued() blocks only until the transfer is enqueued and
//   returns the address with the event after which the data is there: the consumer's stream
//   waits on it, so the host never waits for a device copy. A leased copy is pinned: never
//   evicted until Release. Release(dirty, last_use) marks the copy modified (written home
//   device -> host -> NVMe before its memory is reused; marked clean only after its write
//   completed, a failed write leaves it resident and dirty and the error reaches the caller that
//   needed the memory) and records the event after which the releaser's stream is done with the
//   copy: whoever reuses the slot (the next load into it, a write-back reading it) waits for
//   that event on its own stream, never on the host.
// - Budgets are hard: when a class has no free slot, an unpinned copy of that class is evicted,
//   the one TierManagerOptions::eviction_policy picks (offload/eviction_policy.h: a clean copy
//   before a dirty one; by default the one whose next use is farthest, Belady's rule over the
//   recorded trace, or the least recently used while no trace is known). While every slot of the class
//   is pinned, Acquire waits for copies in transfer and for leases other threads hold; only when
//   waiting could not end (the caller's own leases, or holders that all wait themselves) does
//   it fail with ResourceExhausted naming the numbers. A copy whose mover is itself waiting for
//   memory here (a write-back or load that needs the other tier first) counts as leased, so two
//   threads never wait on each other.
// - Prefetch: the first step (up to EndStep) records the order of acquires. In later steps each
//   acquire that matches the trace issues the fetches that follow it, as far ahead as memory
//   allows without evicting anything needed sooner (and within max_inflight_bytes per link),
//   never past the step's end and never for a shard whose home is about to be rewritten
//   (BeginRewrite). An acquire that departs from the trace drops back to on-demand fetches and
//   records anew.
// - Derived shards: loads run ShardSpec::derive on one thread of the manager's (started by Seal
//   when a derived shard exists), demand loads ahead of prefetches; the copy is then used as a
//   read one is. The source must not change while a derivation may run: its owner calls
//   BeginRewrite before changing it (it waits for the derivations queued or running, its
//   ReadHome's too) and HomeRewritten, InstallPending or Invalidate after; in between a
//   demand load or ReadHome of the shard fails (FailedPrecondition) and prefetch leaves it
//   alone. WriteHome and a dirty release of a derived shard are refused (FailedPrecondition):
//   its content is what derive computes. ReadHome runs derive on the calling thread.
// - Device calls: completion callbacks (on the device's stream threads and the I/O engine's
//   reaper) take the manager's mutex and only do bookkeeping (no device call: device.h's rules).
//   The mutex is never held while the device is synchronized or memory is allocated or freed on
//   it (slots are sub-allocated), so those callbacks cannot deadlock against a device-wide sync.
//
// Thread-safety: all methods may be called from any thread. Completions arrive on the I/O
// engine's reaper thread and the device's stream threads; internal state is under one mutex,
// never held while blocking on the device or the disk.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "offload/access_trace.h"
#include "offload/eviction_policy.h"
#include "offload/pinned_pool.h"
#include "offload/slot_table.h"
#include "offload/swap_space.h"
#include "src/base/device.h"
#include "src/base/device_arena.h"
#include "src/base/trace.h"
#include "zinf/status.h"

namespace zinf::offload {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
std::string_view TierName(Tier t);
enum class Role : uint8_t { kParam16, kMaster, kExpAvg, kExpAvgSq, kGrad };
inline constexpr size_t kRoles = 5;
std::string_view RoleName(Role r);

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
  // kNvme only: the shard's content is computed, never read from or written to NVMe: fills
  // `dst` with `bytes` bytes (see the contract; called without the manager's lock, on its
  // derive thread or a ReadHome caller's). A home_extent given is left untouched; none is
  // allocated otherwise.
  std::function<Status(void* dst)> derive;
};

struct TierManagerOptions {
  bool prefetch = true;
  // How far ahead prefetch reaches, in units (ShardSpec::unit) beyond the acquire that
  // triggers it; the config's zinf.prefetch_depth. Budgets bound it too.
  uint32_t prefetch_units = std::numeric_limits<uint32_t>::max();
  uint64_t max_inflight_bytes = 0;  // per link (NVMe read, h2d); 0 = bounded by budgets only
  Tracer* tracer = nullptr;  // spans on "nvme read", "nvme write", "h2d", "d2h", "stall"
  // Release(lease, dirty = true) of a host copy of an NVMe-homed shard submits its write home
  // at once, without waiting (the copy pinned until it lands; a lease taken meanwhile still
  // works, and a write the lease then dirties again leaves the copy dirty); its eviction later
  // finds it clean. A failed background write leaves the copy dirty and is returned by the next
  // Acquire.
  bool write_behind = false;
  // Which copy goes when a slot class is full (offload/eviction_policy.h); the config's
  // zinf.eviction_policy. An unknown name fails Create.
  std::string eviction_policy = "belady";
};

// Seal's plan: the leases held at once, by every thread together, per tier ([0] device, [1]
// host) and role; Acquire refuses a lease beyond it (FailedPrecondition: a caller that declared
// too few). A role with 0 leases on the device gets no device slots; an NVMe-homed role gets host
// slots when it is leased in either tier (its device loads are staged in the host tier). `spare` slots per class and tier
// beyond the leases hold copies in transfer: a host class needs one (a device load stages its
// data there, a device write-back lands there, while the leases are held); a device class needs
// none (its only copies in transfer are loads, which end by themselves).
struct SealOptions {
  std::array<std::array<uint32_t, kRoles>, 2> max_leases = {{{1, 1, 1, 1, 1}, {1, 1, 1, 1, 1}}};
  std::array<uint32_t, 2> spare = {0, 1};
};

// What Seal would need beyond the fixed allocations, per tier (for start-up checks).
struct SealNeed {
  uint64_t device_bytes = 0, host_bytes = 0;
};

struct TierStats {
  uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0, h2d_bytes = 0, d2h_bytes = 0;
  double nvme_read_busy_seconds = 0, nvme_write_busy_seconds = 0;
  double h2d_busy_seconds = 0, d2h_busy_seconds = 0;  // the device streams' copy time
  double stall_seconds = 0;  // time callers spent in Lease::Wait
  uint64_t prefetch_hits = 0, prefetch_misses = 0;
  uint64_t evictions = 0, writebacks = 0;  // evictions: both tiers
  uint64_t write_behinds = 0;  // of writebacks: started by the release (write_behind)
  uint64_t device_evictions = 0, host_evictions = 0;
  uint64_t overwrites = 0, discards = 0;  // reads and write-backs saved by those modes
  uint64_t installs = 0;                  // InstallPending copies (NVMe reads saved)
  uint64_t derived_bytes = 0;             // host copies of derived shards computed (not read)
  uint64_t derive_promotions = 0;  // queued prefetch derivations moved ahead for a waiter
  uint64_t read_promotions = 0;    // prefetch NVMe reads made demand reads for a waiter
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
  // Device leases: blocks only until the copy's transfer is enqueued; its address and the event
  // after which the data is there (consumers wait on it on their stream). Host leases: Wait,
  // with a complete event.
  struct Ready {
    void* ptr = nullptr;
    Event event;
  };
  Result<Ready> WaitEnqueued();
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
  static Result<std::unique_ptr<TierManager>> Create(DeviceArena& arena, PinnedPool& pool,
                                                     SwapSpace* swap,
                                                     const TierManagerOptions& options);
  ~TierManager();  // waits for transfers in flight; dirty copies are NOT flushed (call Flush)

  // REQUIRES: not sealed yet (FailedPrecondition otherwise).
  Result<ShardId> Register(const ShardSpec& spec);
  const ShardSpec& spec(ShardId id) const;
  // Carves the rest of the device arena and of the pinned pool into slots for the registered
  // shards (see the contract); ResourceExhausted with each class's need when they cannot hold
  // the minimum. Idempotent only in the sense that a second call fails (FailedPrecondition).
  Status Seal(const SealOptions& options = {});
  // The minimum bytes Seal would carve per tier for the shards registered so far.
  SealNeed MinimumSealBytes(const SealOptions& options = {}) const;
  bool sealed() const;
  // One line per tier with its slot classes (after Seal).
  std::string DescribeSlots() const;

  // Sets the shard's home content (initialisation, or new weights from the optimizer) and drops
  // every other copy of it; waits for a transfer of the shard in flight (a prefetch);
  // FailedPrecondition when a copy is leased. An NVMe home is written through a host slot of the
  // shard's class (no memory outside the budget), which then stays as its clean host copy.
  Status WriteHome(ShardId id, const void* src);
  // WriteHome in place, for a shard homed in host memory: lends the home for the caller to fill
  // (the optimizer's new 16-bit weights, written there without a staging copy). Waits for a
  // transfer of the shard in flight and drops its device copy; FailedPrecondition when a copy is
  // leased or the home is on NVMe. Until EndHomeWrite the shard is being loaded: a device load of
  // it waits, and Acquire/ReadHome/WriteHome/Invalidate of it wait as for a transfer in flight.
  // Exactly one EndHomeWrite follows each BeginHomeWrite that succeeded (another aborts).
  Result<void*> BeginHomeWrite(ShardId id);
  void EndHomeWrite(ShardId id);
  // Reads what the shard's home holds (dirty copies not included: Flush first to see them), from
  // a clean host copy when there is one, else from NVMe through a host slot of its class; for
  // checks and checkpoints.
  Status ReadHome(ShardId id, void* dst);

  Result<Lease> Acquire(ShardId id, Tier tier, AcquireMode mode = AcquireMode::kRead);
  // last_use: recorded on the stream that used a device copy after its last use of it (empty:
  // the user is done, e.g. the host synchronized).
  Status Release(Lease lease, bool dirty, Event last_use = Event());

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

  // The shard's home is about to be rewritten by someone else (the optimizer pipeline): prefetch
  // leaves it alone until HomeRewritten, InstallPending or EndPending(false) says the new
  // content is known (reading the old one would be wasted, and would keep InstallPending out).
  // A derived shard: also waits for its derivations queued or running (its source may change
  // on return); until one of those three calls (or Invalidate) no load of it starts.
  // The old content is dead from here: BeginRewrite waits for a write-back of the shard in
  // flight (an NVMe write of its host copy, a device-to-host copy), and until one of those
  // calls a dirty copy is dropped instead of written back, so that nothing old lands on the
  // home after the caller's write.
  void BeginRewrite(ShardId id);

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
  TierManager(DeviceArena& a, PinnedPool& p, SwapSpace* s, const TierManagerOptions& o);

  // The lease's copy once in place (enqueued_ok: a device copy whose h2d is enqueued will do).
  Result<Lease::Ready> WaitFor(ShardId id, Tier tier, bool enqueued_ok);
  // All REQUIRE mu_ held (the lock is passed where the call may wait).
  Status SealLocked(const SealOptions& options);
  // Whether the shard gets host slots (it is NVMe-homed and its role is leased in some tier).
  static bool UsesHostSlots(const Shard& s, const SealOptions& o);
  // The shards each tier's slots are planned for (roles with leases there).
  void Demands(const SealOptions& o, std::vector<SlotDemand>* dev,
               std::vector<SlotDemand>* host) const;
  Status EnsureSealed();  // takes the lock
  Status StartLoad(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier, bool prefetch,
                   size_t need_pos);
  // StartLoad's two paths (its checks done, the copy absent).
  Status StartHostLoad(std::unique_lock<std::mutex>& lock, ShardId id, bool prefetch,
                       size_t need_pos);
  Status StartDeviceLoad(std::unique_lock<std::mutex>& lock, ShardId id, bool prefetch,
                         size_t need_pos);
  // A slot of the shard's class in `tier`, evicting (or waiting) as needed.
  Status Reserve(std::unique_lock<std::mutex>& lock, Tier tier, ShardId id, bool prefetch,
                 size_t need_pos, Slot* out);
  Status Evict(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier);
  Status WriteBack(std::unique_lock<std::mutex>& lock, ShardId id, Tier tier);
  // WriteBack's two paths (its checks done): device to host, host to NVMe.
  Status WriteBackFromDevice(std::unique_lock<std::mutex>& lock, ShardId id);
  Status WriteBackHome(std::unique_lock<std::mutex>& lock, ShardId id);
  // write_behind: submits the idle dirty host copy's write home without waiting.
  void StartWriteBehind(ShardId id);
  // Returns the copy's slot to its class (device slots keep the copy's last-use events).
  // REQUIRES: no transfer of the copy in flight (a bug otherwise: aborts).
  void FreeCopy(ShardId id, Tier tier);
  // Waits until neither copy of the shard is in transfer.
  void WaitTransfers(std::unique_lock<std::mutex>& lock, const Shard& s);
  void GiveSlot(ShardId id, Tier tier, Slot slot);
  void Prefetch(std::unique_lock<std::mutex>& lock, size_t pos);
  void StartHostToDevice(ShardId id);
  // Undoes a device load that cannot finish: unpins the host staging, returns the device slot,
  // leaves the copy absent with `error` for its waiters.
  void AbandonDeviceLoad(ShardId id, Status error);
  void LinkBusy(int link, int delta);
  // A host load ended (an NVMe read or a derivation): the copy is ready or, on error, absent
  // with the error for its waiters; a device load waiting for it goes on.
  void FinishHostLoad(ShardId id, const Status& r);
  // The derive thread: runs queued derivations until stopped with an empty queue.
  void DeriveLoop();
  // A derivation of `id` queued and not started moves to the queue's front (a caller waits for
  // it). REQUIRES mu_ held.
  void PromoteDerivation(ShardId id);
  void EndPendingLocked(ShardId id, bool home_written);
  // A copy holding outdated content: freed now when idle, else marked stale (dropped before its
  // next use, or when its transfer or lease ends). No-op when absent.
  void DropOrMarkStale(ShardId id, Tier tier);
  // Makes the lease `id`/`tier` for the calling thread (counted in holders_ and per role).
  Lease NewLease(ShardId id, Tier tier);
  // True when a thread other than the caller holds a lease in `tier` and is not itself waiting
  // in Reserve: waiting for its Release can succeed.
  bool OtherHolderCanRelease(Tier tier) const;
  // Writes (or reads) the shard's NVMe home through a host slot of its class. The lock is
  // released for the I/O.
  Status BounceHome(std::unique_lock<std::mutex>& lock, ShardId id, const void* src, void* dst);
  SlotTable& table(Tier tier) { return tables_[static_cast<int>(tier)]; }
  // Stamps the copy as used now: the one place the eviction clock advances.
  void Touch(Copy& c);
  // The eviction policy's record of a resident copy (tier_mover.cc).
  EvictionCandidate Candidate(ShardId id, Tier tier) const;
  void Span(const char* track, const std::string& what, std::chrono::steady_clock::time_point t0);

  DeviceArena& arena_;
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
  AccessTrace trace_;
  std::unique_ptr<EvictionPolicy> eviction_;
  bool sealed_ = false;
  SealOptions seal_;
  SlotTable tables_[2];               // [device], [host]
  void* device_region_ = nullptr;     // the arena block the device slots are carved from
  PinnedBlock host_region_;           // the pool block the host slots are carved from
  uint64_t fixed_bytes_[2] = {0, 0};  // at Seal: the tier's memory outside its slots, in use
  std::vector<std::vector<ShardId>> members_[2];  // per tier and class: the shards using it
  uint64_t inflight_bytes_[2] = {0, 0};  // [0] NVMe reads, [1] h2d
  int link_active_[2] = {0, 0};          // [0] NVMe read, [1] NVMe write
  std::chrono::steady_clock::time_point link_since_[2];
  TierStats stats_;
  Status sticky_;  // an asynchronous failure nobody waited on yet
  // Leases held, per tier ([0] device, [1] host) and acquiring thread, and per role; threads
  // waiting in Reserve for another's Release.
  std::unordered_map<std::thread::id, int> holders_[2];
  std::array<std::array<uint32_t, kRoles>, 2> role_leases_{};
  std::unordered_set<std::thread::id> reserving_;
  // Derived shards whose host copy is loading, demand loads first; the thread running them.
  std::deque<std::pair<ShardId, std::chrono::steady_clock::time_point>> derive_queue_;
  std::condition_variable derive_cv_;
  bool derive_stop_ = false;
  std::thread derive_thread_;
};

}  // namespace zinf::offload
