// offload::GradAccumulator: device gradients summed in fp32 on the host, spilling to NVMe when
// the pinned budget is short, with the finiteness flag for the loss scaler.
#include "offload/grad_accumulator.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kernels/cpu/half_convert.h"
#include "kernels/cpu/grad_ops.h"
#include "tests/test_util.h"

namespace zinf::offload {
namespace {

// A host device, an engine and a swap file in a temporary directory, a pinned pool of the
// given budget and a tier manager over them (no prefetch).
struct Rig {
  zinf::testing::TempDir dir;
  std::unique_ptr<Device> device;
  std::unique_ptr<DeviceArena> arena;  // half the device budget; the test allocates the rest
  std::unique_ptr<io::Engine> engine;
  std::unique_ptr<SwapSpace> swap;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<TierManager> tm;

  Status Make(uint64_t pinned_budget) {
    ZINF_ASSIGN_OR_RETURN(device, MakeHostDevice({.kind = DeviceKind::kHost,
                                                  .budget_bytes = 16 << 20}));
    ZINF_ASSIGN_OR_RETURN(engine, io::Engine::Create({.block_size = 256 << 10, .queue_depth = 8}));
    ZINF_ASSIGN_OR_RETURN(swap, SwapSpace::Create(*engine, {.dirs = {dir.path()},
                                                            .size = 32 << 20}));
    ZINF_ASSIGN_OR_RETURN(pool, PinnedPool::Create({.budget_bytes = pinned_budget}));
    ZINF_ASSIGN_OR_RETURN(arena, DeviceArena::Create(*device, 8 << 20));
    ZINF_ASSIGN_OR_RETURN(tm, TierManager::Create(*arena, *pool, swap.get(), {.prefetch = false}));
    return Status::Ok();
  }
};

TEST(GradAccumulatorTest, SumsMicroBatchesAcrossUnitsThatSpillToNvme) {
  Rig rig;
  constexpr size_t kN = 50000;  // 200 KB of fp32 per unit
  // Pinned room for two 16-bit staging blocks and two accumulators (the one in use and one in
  // transfer): six units must spill.
  ASSERT_TRUE(rig.Make(2 * 2 * kN + 2 * (4 * kN + 4096) + (16 << 10)).ok());
  auto acc = GradAccumulator::Create(*rig.tm, *rig.device, *rig.pool,
                                     {.max_unit_elems = kN, .device_grad_bytes = 2});
  ASSERT_TRUE(acc.ok()) << acc.status().ToString();
  Stream* up = *rig.device->CreateStream("upload");
  void* staging = *rig.device->AllocatePinned(2 * kN);
  void* dev_grad = *rig.device->Allocate(2 * kN);

  constexpr int kUnits = 6, kMicro = 3;
  std::vector<ShardId> shards;
  std::vector<std::vector<double>> want(kUnits, std::vector<double>(kN, 0.0));
  for (int u = 0; u < kUnits; ++u) {
    shards.push_back(*rig.tm->Register({.name = "grad" + std::to_string(u),
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
      ASSERT_TRUE(rig.device->CopyToDevice(up, dev_grad, staging, 2 * kN).ok());
      ASSERT_TRUE(rig.device->StreamSynchronize(up).ok());
      auto finite = (*acc)->Accumulate(shards[u], dev_grad, kernels::DType::kBf16, kN, 0.5f, m == 0);
      ASSERT_TRUE(finite.ok()) << finite.status().ToString();
      EXPECT_TRUE(*finite);
    }
  }
  EXPECT_GT(rig.tm->stats().writebacks, 0u) << "the pinned budget was meant to force spills";
  ASSERT_TRUE(rig.tm->Flush().ok());
  std::vector<float> got(kN);
  for (int u = 0; u < kUnits; ++u) {
    ASSERT_TRUE(rig.tm->ReadHome(shards[u], got.data()).ok());
    for (size_t i = 0; i < kN; i += 97) {
      ASSERT_NEAR(got[i], want[u][i], 1e-5 * (1 + std::abs(want[u][i]))) << "unit " << u << " i " << i;
    }
  }
  // One inf in a gradient: reported, so the step can be skipped.
  auto* g = static_cast<uint16_t*>(staging);
  std::memset(g, 0, 2 * kN);
  g[kN / 2] = kernels::FloatToBf16(std::numeric_limits<float>::infinity());
  ASSERT_TRUE(rig.device->CopyToDevice(up, dev_grad, staging, 2 * kN).ok());
  ASSERT_TRUE(rig.device->StreamSynchronize(up).ok());
  auto finite = (*acc)->Accumulate(shards[0], dev_grad, kernels::DType::kBf16, kN, 1.0f, false);
  ASSERT_TRUE(finite.ok());
  EXPECT_FALSE(*finite);
  ASSERT_TRUE(rig.device->Free(dev_grad).ok());
  ASSERT_TRUE(rig.device->FreePinned(staging).ok());
}

// Shards of 16-bit values (one micro-batch a step): the device's values stored as they are,
// through NVMe spills, with the norm's sum of squares and the finiteness flag; no staging block.
TEST(GradAccumulatorTest, SixteenBitShardsStoreTheGradientAsItComes) {
  Rig rig;
  constexpr size_t kN = 50000;
  // Two 16-bit shards' room (the one in use and one in transfer) and one fp32 shard's.
  ASSERT_TRUE(rig.Make(2 * (2 * kN + 4096) + (4 * kN + 4096)).ok());
  auto acc = GradAccumulator::Create(*rig.tm, *rig.device, *rig.pool,
                                     {.max_unit_elems = kN, .fp32_shards = false, .depth = 1});
  ASSERT_TRUE(acc.ok()) << acc.status().ToString();
  EXPECT_EQ(rig.pool->bytes_in_use(), 0u) << "no staging block for 16-bit shards";
  Stream* up = *rig.device->CreateStream("upload");
  void* dev_grad = *rig.device->Allocate(2 * kN);
  void* staging = *rig.device->AllocatePinned(2 * kN);
  // Uploads n 16-bit values to dev_grad through the pinned staging.
  auto upload = [&](const std::vector<uint16_t>& v) {
    std::memcpy(staging, v.data(), 2 * kN);
    return rig.device->CopyToDevice(up, dev_grad, staging, 2 * kN).ok() &&
           rig.device->StreamSynchronize(up).ok();
  };
  constexpr int kUnits = 5;
  const kernels::DType types[] = {kernels::DType::kBf16, kernels::DType::kF16};
  std::vector<ShardId> shards[2];
  for (int t = 0; t < 2; ++t) {
    for (int u = 0; u < kUnits; ++u) {
      auto id = rig.tm->Register({.name = fmt::format("{}grad{}", kernels::DTypeName(types[t]), u),
                                 .role = Role::kGrad, .bytes = 2 * kN});
      ASSERT_TRUE(id.ok());
      shards[t].push_back(*id);
    }
  }
  auto f32 = rig.tm->Register({.name = "f32grad", .role = Role::kGrad, .bytes = 4 * kN});
  ASSERT_TRUE(f32.ok());
  for (int t = 0; t < 2; ++t) {
    const kernels::DType type = types[t];
    SCOPED_TRACE(std::string(kernels::DTypeName(type)));
    std::vector<std::vector<uint16_t>> want(kUnits, std::vector<uint16_t>(kN));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0, 1);
    double sum_squares = 0, want_sum_squares = 0;
    for (int u = 0; u < kUnits; ++u) {
      std::vector<float> w(kN);
      for (size_t i = 0; i < kN; ++i) {
        const float x = normal(rng);
        want[u][i] =
            type == kernels::DType::kBf16 ? kernels::FloatToBf16(x) : kernels::FloatToF16(x);
        w[i] = type == kernels::DType::kBf16 ? kernels::Bf16ToFloat(want[u][i])
                                             : kernels::F16ToFloat(want[u][i]);
      }
      want_sum_squares += kernels::cpu::SumSquares(w.data(), kN);
      ASSERT_TRUE(upload(want[u]));
      auto finite = (*acc)->Accumulate(shards[t][u], dev_grad, type, kN, 1.0f, true, &sum_squares);
      ASSERT_TRUE(finite.ok()) << finite.status().ToString();
      EXPECT_TRUE(*finite);
    }
    EXPECT_EQ(sum_squares, want_sum_squares);
    EXPECT_GT(rig.tm->stats().writebacks, 0u) << "five shards in room for two must spill";
    ASSERT_TRUE(rig.tm->Flush().ok());
    std::vector<uint16_t> got(kN);
    for (int u = 0; u < kUnits; ++u) {
      ASSERT_TRUE(rig.tm->ReadHome(shards[t][u], got.data()).ok());
      EXPECT_TRUE(got == want[u]) << "unit " << u;
    }
    // A NaN is reported; a later micro-batch or a scale other than 1 cannot be stored.
    std::vector<uint16_t> bad(kN, 0);
    bad[kN / 3] = 0x7fc0;  // NaN in bf16; in fp16 0x7fc0 is a NaN too
    ASSERT_TRUE(upload(bad));
    auto finite = (*acc)->Accumulate(shards[t][0], dev_grad, type, kN, 1.0f, true);
    ASSERT_TRUE(finite.ok());
    EXPECT_FALSE(*finite);
    EXPECT_EQ((*acc)->Accumulate(shards[t][0], dev_grad, type, kN, 1.0f, false).status().code(),
              StatusCode::kInvalidArgument);
    EXPECT_EQ((*acc)->Accumulate(shards[t][0], dev_grad, type, kN, 0.5f, true).status().code(),
              StatusCode::kInvalidArgument);
  }
  // An fp32 shard needs the staging blocks this accumulator was made without.
  EXPECT_EQ(
      (*acc)->Accumulate(*f32, dev_grad, kernels::DType::kBf16, kN, 1.0f, true).status().code(),
      StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rig.device->Free(dev_grad).ok());
  ASSERT_TRUE(rig.device->FreePinned(staging).ok());
}

// ZeRO-2's reduction over ranks, issued on the worker: WaitIssued returns once it is issued,
// while it is still running, and the shard then takes what the reduction wrote; a reduction
// refused at issue is returned by WaitIssued and Finish, never waited for.
TEST(GradAccumulatorTest, WaitIssuedReturnsBeforeTheReductionEnds) {
  Rig rig;
  constexpr size_t kN = 4096, kOut = 1024;
  ASSERT_TRUE(rig.Make(8 << 20).ok());
  auto acc = GradAccumulator::Create(*rig.tm, *rig.device, *rig.pool,
                                     {.max_unit_elems = kN, .device_grad_bytes = 2});
  ASSERT_TRUE(acc.ok()) << acc.status().ToString();
  Stream* up = *rig.device->CreateStream("upload");
  void* staging = *rig.device->AllocatePinned(2 * kN);
  void* dev_grad = *rig.device->Allocate(2 * kN);
  auto* g = static_cast<uint16_t*>(staging);
  for (size_t i = 0; i < kN; ++i) g[i] = kernels::FloatToBf16(static_cast<float>(i % 64));
  ASSERT_TRUE(rig.device->CopyToDevice(up, dev_grad, staging, 2 * kN).ok());
  ASSERT_TRUE(rig.device->StreamSynchronize(up).ok());
  auto shard = rig.tm->Register({.name = "grad", .role = Role::kGrad, .bytes = 4 * kN});
  ASSERT_TRUE(shard.ok());

  std::atomic<int> issued{0};
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  bool refuse = false;
  // "Reduces" by taking every fourth staged value, doubled, once the gate opens.
  HandOver::ReduceFn reduce = [&](void* st, kernels::DType type, size_t n, float* out,
                                  size_t out_n) -> Result<HandOver::ReduceWait> {
    EXPECT_EQ(type, kernels::DType::kBf16);
    EXPECT_EQ(n, kN);
    if (refuse) return Aborted("the communicator is broken");
    issued++;
    const auto* v = static_cast<const uint16_t*>(st);
    return HandOver::ReduceWait([=]() -> Status {
      opened.wait();
      for (size_t i = 0; i < out_n; ++i) out[i] = 2 * kernels::Bf16ToFloat(v[4 * i]);
      return Status::Ok();
    });
  };
  HandOver h{.shard = *shard, .device_grad = dev_grad, .type = kernels::DType::kBf16, .n = kN,
             .sum_squares = true, .reduce = &reduce, .out_n = kOut};
  ASSERT_TRUE((*acc)->Submit(h).ok());
  auto waited = std::async(std::launch::async, [&] { return (*acc)->WaitIssued(); });
  EXPECT_EQ(waited.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "WaitIssued waited for the reduction to end";
  EXPECT_EQ(issued.load(), 1);
  gate.set_value();
  EXPECT_TRUE(waited.get().ok());
  auto totals = (*acc)->Finish();
  ASSERT_TRUE(totals.ok()) << totals.status().ToString();
  std::vector<float> got(kN);
  ASSERT_TRUE(rig.tm->ReadHome(*shard, got.data()).ok());  // a clean copy or the home
  ASSERT_TRUE(rig.tm->Flush().ok());
  ASSERT_TRUE(rig.tm->ReadHome(*shard, got.data()).ok());
  double want_ss = 0;
  for (size_t i = 0; i < kOut; ++i) {
    const float want = 2 * static_cast<float>((4 * i) % 64);
    ASSERT_EQ(got[i], want) << i;
    want_ss += static_cast<double>(want) * want;
  }
  EXPECT_EQ(totals->sum_squares, want_ss);
  // Nothing submitted: nothing to wait for.
  EXPECT_TRUE((*acc)->WaitIssued().ok());

  refuse = true;
  ASSERT_TRUE((*acc)->Submit(h).ok());
  Status s = (*acc)->WaitIssued();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_EQ((*acc)->Finish().status().code(), StatusCode::kAborted);
  ASSERT_TRUE(rig.device->Free(dev_grad).ok());
  ASSERT_TRUE(rig.device->FreePinned(staging).ok());
}

}  // namespace
}  // namespace zinf::offload
