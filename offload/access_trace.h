// offload/access_trace.h — the order of one step's acquires, recorded in the first step and
// replayed in the next ones: what prefetch reads ahead of, and what the eviction policy uses.
//
// Contract:
// - While recording (the first step, and again after the order changed) every traced acquire
//   is appended by Observe. EndStep ends a recording (the trace becomes valid when not empty)
//   or, when replaying, checks that the step reached the trace's end; an acquire that departs
//   from the trace (Observe returns false) invalidates it until the step ends, after which the
//   next step records anew. While paused (an evaluation between steps) nothing is observed.
// - NextUse(shard, tier, after) is the trace position of the shard's next use in that tier at
//   or after `after`, wrapping into the next step (positions >= size() are the next step's),
//   or kNever.
// - Ahead is the prefetch decision: from trace position `pos`, the acquires of the next
//   `units` units (a unit begins where the trace's unit changes), in trace order, each handed
//   to `fetch(id, tier, q)` unless it is an overwrite, or reads a shard an overwrite ahead of
//   it rewrites (its read would see what the overwrite wrote, not home). `fetch` returns false
//   to stop the walk (no memory, or a limit reached); it decides residency, the tier manager's
//   part. The walk never passes the end of the step: the next step's first units are
//   rewritten by the optimizer (or overwritten) before they are used, and the tier manager
//   walks them from position 0 when the step ends.
// The eviction policies (offload/eviction_policy.h) read NextUse; the tier manager asks.
//
// Thread-safety: none; the tier manager's mutex guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace zinf::offload {

using ShardId = uint32_t;
enum class Tier : uint8_t;

inline constexpr size_t kNever = std::numeric_limits<size_t>::max();

class AccessTrace {
 public:
  // Records or matches one acquire; false when it departed from a valid trace (which is then
  // invalid until EndStep).
  bool Observe(ShardId id, Tier tier, bool overwrite);
  void Pause(bool paused) { paused_ = paused; }
  bool paused() const { return paused_; }
  // Ends a step; true when the trace is valid for the next one.
  bool EndStep();

  bool valid() const { return valid_; }
  bool recording() const { return recording_; }
  size_t pos() const { return pos_; }  // index of the next expected acquire
  size_t size() const { return trace_.size(); }
  std::pair<ShardId, Tier> at(size_t i) const { return trace_[i]; }
  bool overwrite_at(size_t i) const { return overwrite_[i]; }

  size_t NextUse(ShardId id, Tier tier, size_t after) const;
  // REQUIRES: valid(). unit_of(id): the shard's unit.
  void Ahead(size_t pos, uint32_t units, const std::function<uint32_t(ShardId)>& unit_of,
             const std::function<bool(ShardId, Tier, size_t)>& fetch) const;

 private:
  static uint64_t Key(ShardId id, Tier t);
  std::vector<std::pair<ShardId, Tier>> trace_;
  std::vector<bool> overwrite_;  // per entry: an overwrite acquire (nothing to fetch)
  std::unordered_map<uint64_t, std::vector<size_t>> uses_;  // (shard, tier) -> positions
  bool recording_ = true;
  bool paused_ = false;
  bool valid_ = false;
  size_t pos_ = 0;
};

}  // namespace zinf::offload
