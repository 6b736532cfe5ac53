#include "src/train/sizing.h"

#include <algorithm>

#include "src/ckpt/manifest.h"
#include "src/runtime/offload_runtime.h"

namespace zinf::train {

kernels::DType MomentType(const Config& c) {
  return c.zinf.optimizer_state_dtype == "bf16" ? kernels::DType::kBf16 : kernels::DType::kF32;
}

uint64_t StateBytesPerParam(const Config& c) { return 4 + 2 * kernels::DTypeSize(MomentType(c)); }

uint64_t SwapBytes(const GptDims& d, const Config& c, uint32_t generations,
                   const std::vector<char>& state_in_memory, const RankShare& share) {
  const uint64_t slack = c.zinf.stripe_bytes + 4096;
  const bool ranks = share.world > 1 && share.optimizer;
  uint64_t total = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    const uint64_t n = d.UnitParams(u);
    const ckpt::UnitChunk chunk = ckpt::ChunkOfUnit(n, ranks ? share.world : 1, ranks ? share.rank : 0);
    const uint64_t state_n = ranks ? chunk.len : n;
    const uint64_t p16_n = ranks && share.params ? chunk.per : n;
    const uint64_t grad_n = !ranks ? n : share.grads ? chunk.per : chunk.per * share.world;
    total += 2 * p16_n + 4 * grad_n + 2 * slack;
    if (u < state_in_memory.size() && state_in_memory[u]) continue;
    total += generations * (StateBytesPerParam(c) * state_n + 3 * slack);
  }
  return total;
}

uint64_t AutoPinnedBudget(const GptDims& d, const Config& c, const ExecutorOptions& eo) {
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
