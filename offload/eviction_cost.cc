// offload/eviction_cost.cc — cost-aware eviction: the copy cheapest to lose. Its value is the
// seconds it would cost to bring it back (and to write it home first when dirty) spread over
// the distance to its next use: bytes × refetch cost ÷ distance. The lowest value goes first,
// so a copy needed soon or expensive to refetch (a device copy whose host copy is gone, an
// NVMe read rather than a cast) stays. Without a valid trace: the least recently used.
#include <limits>

#include "offload/eviction_policy.h"

namespace zinf::offload {
namespace {

class CostAwarePolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "cost"; }

 protected:
  double Rank(const EvictionRequest& r, const EvictionCandidate& c) const override {
    if (!r.trace_valid) return -static_cast<double>(c.last_use);
    if (c.next_use == kNever) return std::numeric_limits<double>::infinity();
    const double distance = static_cast<double>(c.next_use - r.pos) + 1.0;
    const double cost = c.refetch_seconds + c.writeback_seconds;
    if (!(cost > 0)) return distance * 1e30;  // free to bring back: first to go, farthest first
    return distance / cost;  // the inverse of the value kept: larger evicts first
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeCostAwarePolicy() {
  return std::make_unique<CostAwarePolicy>();
}

}  // namespace zinf::offload
