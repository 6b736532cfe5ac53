#include "offload/access_trace.h"

#include <algorithm>

#include "offload/tier_manager.h"

namespace zinf::offload {

uint64_t AccessTrace::Key(ShardId id, Tier t) {
  return (uint64_t{id} << 2) | static_cast<uint64_t>(t);
}

bool AccessTrace::Observe(ShardId id, Tier tier, bool overwrite) {
  if (paused_) return true;
  if (recording_) {
    trace_.push_back({id, tier});
    overwrite_.push_back(overwrite);
    return true;
  }
  if (!valid_) return true;
  if (pos_ < trace_.size() && trace_[pos_] == std::make_pair(id, tier)) {
    pos_++;
    return true;
  }
  valid_ = false;  // the order changed: on demand until the step ends, then record
  return false;
}

bool AccessTrace::EndStep() {
  if (recording_) {
    recording_ = false;
    valid_ = !trace_.empty();
  } else if (valid_ && pos_ != trace_.size()) {
    valid_ = false;  // a shorter step than the trace: record the next one
  }
  uses_.clear();
  pos_ = 0;
  if (!valid_) {
    recording_ = true;
    trace_.clear();
    overwrite_.clear();
    return false;
  }
  for (size_t i = 0; i < trace_.size(); ++i) uses_[Key(trace_[i].first, trace_[i].second)].push_back(i);
  return true;
}

size_t AccessTrace::NextUse(ShardId id, Tier tier, size_t after) const {
  auto it = uses_.find(Key(id, tier));
  if (it == uses_.end() || it->second.empty()) return kNever;
  const auto& v = it->second;
  auto p = std::lower_bound(v.begin(), v.end(), after);
  if (p != v.end()) return *p;
  return v.front() + trace_.size();  // the next step repeats the trace
}

void AccessTrace::Ahead(size_t pos, uint32_t units,
                        const std::function<uint32_t(ShardId)>& unit_of,
                        const std::function<bool(ShardId, Tier, size_t)>& fetch) const {
  uint32_t units_ahead = 0;
  uint32_t last_unit =
      pos > 0 ? unit_of(trace_[pos - 1].first) : std::numeric_limits<uint32_t>::max();
  std::vector<ShardId> overwritten;  // shards overwritten ahead
  for (size_t q = pos; q < trace_.size(); ++q) {
    const auto [id, tier] = trace_[q];
    const uint32_t unit = unit_of(id);
    if (unit != last_unit) {
      last_unit = unit;
      if (++units_ahead > units) break;
    }
    if (overwrite_[q]) {
      overwritten.push_back(id);
      continue;
    }
    if (std::find(overwritten.begin(), overwritten.end(), id) != overwritten.end()) continue;
    if (!fetch(id, tier, q)) break;
  }
}

}  // namespace zinf::offload
