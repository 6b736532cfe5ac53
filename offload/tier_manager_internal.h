// offload/tier_manager_internal.h — the TierManager's residency records, shared by its source
// files (tier_manager.cc: registration, plan, leases; tier_mover.cc: transfers;
// tier_eviction.cc: slots and eviction; tier_home.cc: the home and its rewrites). Not for
// other users.
#pragma once

#include <thread>
#include <vector>

#include "offload/tier_manager.h"

namespace zinf::offload {

inline constexpr int kDev = static_cast<int>(Tier::kDevice);
inline constexpr int kHostIdx = static_cast<int>(Tier::kHost);

struct TierManager::Copy {
  enum State { kAbsent, kLoading, kReady, kWriting } state = kAbsent;
  void* ptr = nullptr;
  Slot slot;           // the slot holding the copy (not for a shard's pinned home)
  int pins = 0;        // leases, plus transfers that read this copy
  int leases = 0;      // of the pins, those held by leases (the rest end with their transfer)
  // Set while the thread moving this copy waits for memory of the other tier before its
  // transfer can start: then the copy settles only if that thread gets its memory.
  std::thread::id waiter;
  bool dirty = false;    // newer than the copy below it
  uint64_t version = 0;  // bumped by every dirty release (a write-back in flight then stays dirty)
  Status error;          // the last load failed
  bool stale = false;    // the other tier got newer data while this copy was busy: drop when idle
  uint64_t last_use = 0;
  // Device copies: the h2d transfer is enqueued (Loading) and completes with `loaded`; `uses`
  // are the releasers' last-use events, handed with the slot to its next user.
  bool enqueued = false;
  Event loaded;
  // Host copies: the NVMe read loading it, while Loading (0: none); a waiter promotes it to a
  // demand read (Engine::Promote refuses one that already is).
  uint64_t read_ticket = 0;
  std::vector<Event> uses;
};

struct TierManager::Shard {
  ShardSpec spec;
  bool pending = false;          // InstallPending's host copy is held until the home write ends
  bool rewrite_pending = false;  // BeginRewrite: prefetch leaves it alone
  Extent extent;                 // home on NVMe
  uint64_t host_bytes = 0;       // padded for O_DIRECT
  PinnedBlock home_block;        // home in pinned memory
  int cls[2] = {-1, -1};         // slot class per tier (after Seal)
  Copy copy[2];                  // [device], [host]
  bool device_wants_host = false;  // an h2d waits for the host copy's load
  bool h2d_reading = false;  // an h2d copy reads the host copy: a host lease waits for it
  int deriving = 0;  // derivations reading the source: a host copy's (queued or running), ReadHome's
};

}  // namespace zinf::offload
