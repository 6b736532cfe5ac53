#include "src/train/sizing.h"

#include <algorithm>

#include "src/ckpt/manifest.h"
#include "src/runtime/offload_runtime.h"

namespace zinf::train {

kernels::DType MomentType(const Config& c) {
  return c.zinf.optimizer_state_dtype == "bf16" ? kernels::DType::kBf16 : kernels::DType::kF32;
}

uint64_t StateBytesPerParam(const Config& c) { return 4 + 2 * kernels::DTypeSize(MomentType(c)); }

UnitShare ShareOfUnit(uint64_t n, const RankShare& share) {
  if (share.world < 2 || !share.optimizer) return {n, n, n, n};
  const ckpt::UnitChunk k = ckpt::ChunkOfUnit(n, share.world, share.rank);
  return {.state = k.len,
          .param16 = share.params ? k.per : n,
          .grad = share.grads ? k.per : k.per * share.world,
          .per = k.per};
}

uint64_t SwapBytes(const Model& d, const Config& c, uint32_t generations,
                   const std::vector<char>& state_in_memory, const RankShare& share) {
  const uint64_t slack = c.zinf.stripe_bytes + 4096;
  uint64_t total = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    const UnitShare s = ShareOfUnit(d.UnitParams(u), share);
    total += 2 * s.param16 + 4 * s.grad + 2 * slack;
    if (u < state_in_memory.size() && state_in_memory[u]) continue;
    total += generations * (StateBytesPerParam(c) * s.state + 3 * slack);
  }
  return total;
}

uint64_t AutoPinnedBudget(const Model& d, const Config& c, const ExecutorOptions& eo) {
  if (c.zinf.budgets.pinned_bytes) return *c.zinf.budgets.pinned_bytes;
  const uint64_t wanted =
      std::max<uint64_t>(PinnedBytesWanted(d, eo), UsesNvme(c) ? c.aio.block_size : 0);
  return std::min(wanted, AutoPinnedCap());
}

uint64_t AutoHostBytes(uint64_t available, uint64_t pinned_budget, uint64_t device_budget) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const uint64_t taken = pinned_budget + device_budget + 2 * kGiB;
  const uint64_t spare = available > taken ? available - taken : 0;
  return spare / kGiB * kGiB;
}

}  // namespace zinf::train
