// offload/eviction_lru.cc — least recently used, trace or not (the baseline a trace-driven
// policy is measured against).
#include "offload/eviction_policy.h"

namespace zinf::offload {
namespace {

class LruPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }

 protected:
  double Rank(const EvictionRequest&, const EvictionCandidate& c) const override {
    return -static_cast<double>(c.last_use);
  }
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace zinf::offload
