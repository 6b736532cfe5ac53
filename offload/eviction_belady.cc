// offload/eviction_belady.cc — Belady's rule, the default eviction policy: with a valid trace
// the copy whose next use is farthest away (optimal for the number of refetches when copies
// cost the same to bring back); without one, the least recently used.
#include "offload/eviction_policy.h"

namespace zinf::offload {
namespace {

class BeladyPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "belady"; }

 protected:
  double Rank(const EvictionRequest& r, const EvictionCandidate& c) const override {
    if (r.trace_valid) return static_cast<double>(c.next_use);
    return -static_cast<double>(c.last_use);
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeBeladyPolicy() { return std::make_unique<BeladyPolicy>(); }

}  // namespace zinf::offload
