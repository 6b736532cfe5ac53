#include "offload/eviction_policy.h"

#include <fmt/format.h>

namespace zinf::offload {

#define ZINF_EVICTION_POLICY(name, factory) std::unique_ptr<EvictionPolicy> factory();
#include "offload/eviction_policies.inc"
#undef ZINF_EVICTION_POLICY

namespace {

struct Entry {
  const char* name;
  std::unique_ptr<EvictionPolicy> (*make)();
};

constexpr Entry kPolicies[] = {
#define ZINF_EVICTION_POLICY(name, factory) {name, &factory},
#include "offload/eviction_policies.inc"
#undef ZINF_EVICTION_POLICY
};

}  // namespace

std::optional<ShardId> EvictionPolicy::PickVictim(
    const EvictionRequest& request, std::span<const EvictionCandidate> candidates) const {
  if (request.prefetch && !request.trace_valid) return std::nullopt;
  for (const bool dirty_pass : {false, true}) {
    if (dirty_pass && request.prefetch) break;  // a prefetch never waits for a write-back
    std::optional<ShardId> best;
    double best_rank = 0;
    for (const EvictionCandidate& c : candidates) {
      if (c.dirty != dirty_pass) continue;
      // Needed no later than what the prefetch fetches: evicting it would only cost a read.
      if (request.prefetch && c.next_use <= request.need_pos) continue;
      const double rank = Rank(request, c);
      if (!best || rank > best_rank) {
        best = c.id;
        best_rank = rank;
      }
    }
    if (best) return best;
  }
  return std::nullopt;
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name) {
  for (const Entry& e : kPolicies) {
    if (name == e.name) return e.make();
  }
  std::string known;
  for (const Entry& e : kPolicies) known += fmt::format("{}\"{}\"", known.empty() ? "" : ", ", e.name);
  return InvalidArgument(
      fmt::format("eviction policy \"{}\" is not one zinf has; expected one of {}", name, known));
}

std::vector<std::string> EvictionPolicyNames() {
  std::vector<std::string> names;
  for (const Entry& e : kPolicies) names.emplace_back(e.name);
  return names;
}

}  // namespace zinf::offload
