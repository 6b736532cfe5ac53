// offload/eviction_policy.h — which resident copy the tier manager evicts when a tier's slot
// class is full: the seam a new policy plugs into.
//
// Contract:
// - The tier manager calls PickVictim with every copy of the slot class that could go now
//   (resident, no transfer in flight, no lease), each described by an EvictionCandidate, and
//   the request (the tier, whether it is a prefetch, the trace's state). The rules every
//   policy shares are applied here, not in the manager and not in each policy:
//   - a prefetch never evicts a dirty copy (it would wait for the write-back);
//   - a prefetch evicts only with a valid trace, and never a copy the trace needs no later
//     than what the prefetch fetches (next_use <= need_pos);
//   - a clean copy goes before a dirty one: dirty copies are ranked only when no clean one is
//     eligible.
//   Among the eligible copies of a pass, the policy's Rank decides: the highest rank is
//   evicted, the first in candidate order on a tie. No victim: the caller waits or fails.
// - A policy is one file defining its class and a factory, plus one line in
//   eviction_policies.inc; MakeEvictionPolicy finds it by name.
// - Policies: "belady" (the default; the copy used farthest in the future while the trace is
//   valid, else the least recently used), "lru", "cost" (the copy cheapest to lose:
//   distance to its next use over the seconds to fetch it back, and to write it home first
//   when dirty).
//
// Thread-safety: PickVictim is const and keeps no state; the tier manager calls it under its
// mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "offload/access_trace.h"
#include "zinf/status.h"

namespace zinf::offload {

struct EvictionCandidate {
  ShardId id = 0;
  uint64_t bytes = 0;      // the copy's bytes in this tier
  bool dirty = false;      // evicting it writes it home (or to the host tier) first
  uint64_t last_use = 0;   // a tick of the manager's clock: larger is more recent
  size_t next_use = kNever;  // trace position of its next use in this tier (valid trace only)
  double refetch_seconds = 0;    // to bring it back for its next use, at the links' rates
  double writeback_seconds = 0;  // to write it first when dirty (0 when clean)
};

struct EvictionRequest {
  Tier tier{};
  bool prefetch = false;  // a prefetch (not a caller waiting)
  size_t need_pos = 0;    // a prefetch: the trace position of what it fetches
  bool trace_valid = false;
  size_t pos = 0;         // the trace position of the next expected acquire
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // The copy to evict, under the shared rules above; none when no candidate is eligible.
  std::optional<ShardId> PickVictim(const EvictionRequest& request,
                                    std::span<const EvictionCandidate> candidates) const;

 protected:
  // Larger evicts first. Called only for eligible candidates of one request.
  virtual double Rank(const EvictionRequest& request, const EvictionCandidate& c) const = 0;
};

// The policy of that name; InvalidArgument naming the known ones otherwise.
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name);
std::vector<std::string> EvictionPolicyNames();

}  // namespace zinf::offload
