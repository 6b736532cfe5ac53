// offload::GradAccumulator: device gradients summed in fp32 on the host, spilling to NVMe when
// the pinned budget is short, with the finiteness flag for the loss scaler.
#include "offload/grad_accumulator.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/cpu/half_convert.h"
#include "tests/test_util.h"

namespace zinf::offload {
namespace {

TEST(GradAccumulatorTest, SumsMicroBatchesAcrossUnitsThatSpillToNvme) {
  zinf::testing::TempDir dir;
  auto device = MakeHostDevice({.kind = DeviceKind::kHost, .budget_bytes = 16 << 20});
  ASSERT_TRUE(device.ok());
  auto engine = io::Engine::Create({.block_size = 256 << 10, .queue_depth = 8});
  ASSERT_TRUE(engine.ok());
  auto swap = SwapSpace::Create(**engine, {.dirs = {dir.path()}, .size = 32 << 20});
  ASSERT_TRUE(swap.ok());
  constexpr size_t kN = 50000;  // 200 KB of fp32 per unit
  // Pinned room for the staging block and about two accumulators: six units must spill.
  auto pool = PinnedPool::Create({.budget_bytes = 3 * 4 * kN + 3 * 4096 + (64 << 10)});
  ASSERT_TRUE(pool.ok());
  auto tm = TierManager::Create(**device, **pool, swap->get(), {.prefetch = false});
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  auto acc = GradAccumulator::Create(**tm, **device, **pool, kN);
  ASSERT_TRUE(acc.ok()) << acc.status().ToString();
  Stream* up = *(*device)->CreateStream("upload");
  void* staging = *(*device)->AllocatePinned(2 * kN);
  void* dev_grad = *(*device)->Allocate(2 * kN);

  constexpr int kUnits = 6, kMicro = 3;
  std::vector<ShardId> shards;
  std::vector<std::vector<double>> want(kUnits, std::vector<double>(kN, 0.0));
  for (int u = 0; u < kUnits; ++u) {
    shards.push_back(*(*tm)->Register({.name = "grad" + std::to_string(u),
                                       .role = Role::kGrad, .bytes = 4 * kN}));
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  for (int m = 0; m < kMicro; ++m) {
    for (int u = kUnits - 1; u >= 0; --u) {  // backward order
      auto* g = static_cast<uint16_t*>(staging);
      for (size_t i = 0; i < kN; ++i) {
        g[i] = kernels::FloatToBf16(normal(rng));
        want[u][i] += 0.5 * kernels::Bf16ToFloat(g[i]);
      }
      ASSERT_TRUE((*device)->CopyToDevice(up, dev_grad, staging, 2 * kN).ok());
      ASSERT_TRUE((*device)->StreamSynchronize(up).ok());
      auto finite = (*acc)->Accumulate(shards[u], dev_grad, kernels::DType::kBf16, kN, 0.5f, m == 0);
      ASSERT_TRUE(finite.ok()) << finite.status().ToString();
      EXPECT_TRUE(*finite);
    }
  }
  EXPECT_GT((*tm)->stats().writebacks, 0u) << "the pinned budget was meant to force spills";
  ASSERT_TRUE((*tm)->Flush().ok());
  std::vector<float> got(kN);
  for (int u = 0; u < kUnits; ++u) {
    ASSERT_TRUE((*tm)->ReadHome(shards[u], got.data()).ok());
    for (size_t i = 0; i < kN; i += 97) {
      ASSERT_NEAR(got[i], want[u][i], 1e-5 * (1 + std::abs(want[u][i]))) << "unit " << u << " i " << i;
    }
  }
  // One inf in a gradient: reported, so the step can be skipped.
  auto* g = static_cast<uint16_t*>(staging);
  std::memset(g, 0, 2 * kN);
  g[kN / 2] = kernels::FloatToBf16(std::numeric_limits<float>::infinity());
  ASSERT_TRUE((*device)->CopyToDevice(up, dev_grad, staging, 2 * kN).ok());
  ASSERT_TRUE((*device)->StreamSynchronize(up).ok());
  auto finite = (*acc)->Accumulate(shards[0], dev_grad, kernels::DType::kBf16, kN, 1.0f, false);
  ASSERT_TRUE(finite.ok());
  EXPECT_FALSE(*finite);
  ASSERT_TRUE((*device)->Free(dev_grad).ok());
  ASSERT_TRUE((*device)->FreePinned(staging).ok());
}

}  // namespace
}  // namespace zinf::offload
