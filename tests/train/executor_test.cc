// train::LayerExecutor's use of the device: one allocation (the arena) for the whole run, none
// after start, and no host synchronization per unit (the stream synchronizations of a step do
// not grow with the number of layers). Before the arena and the event-based hand-over, every
// shard copy was a Device::Allocate/Free and every unit's gradient a StreamSynchronize. With the
// state in memory, the optimizer step under the next forward equals the one after backward; so
// does ZeRO-3's step of the state on NVMe across two ranks (threads over the local transport).
#include "src/train/executor.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "src/runtime/offload_runtime.h"
#include "src/train/backend_factory.h"
#include "tests/comm/comm_test_util.h"
#include "tests/test_util.h"

namespace zinf::train {
namespace {

// A runtime, its CPU backend and an executor over them, for config `c` (fails the test on error;
// `ex` is null then), and the test's tokens and targets (4 x 16 of a 64-token vocabulary).
struct Built {
  std::unique_ptr<OffloadRuntime> rt;
  std::unique_ptr<Backend<float>> be;
  std::unique_ptr<LayerExecutor> ex;
};
Built Build(const Config& c, const GptDims& dims, const ExecutorOptions& eo,
            const RuntimeOptions& ro) {
  Built b;
  auto rt = MakeOffloadRuntime(c, ro);
  EXPECT_TRUE(rt.ok()) << rt.status().ToString();
  if (!rt.ok()) return b;
  b.rt = std::move(*rt);
  Stream* compute = *b.rt->device->CreateStream("compute");
  auto be = MakeBackend(*b.rt->device, compute, 1, b.rt->arena.get());
  EXPECT_TRUE(be.ok());
  if (!be.ok()) return b;
  b.be = std::move(*be);
  auto ex = LayerExecutor::Create(*b.rt, *b.be, compute, dims, eo);
  EXPECT_TRUE(ex.ok()) << ex.status().ToString();
  if (ex.ok()) b.ex = std::move(*ex);
  return b;
}
void Tokens(std::vector<int32_t>* x, std::vector<int32_t>* y) {
  x->resize(4 * 16);
  y->resize(4 * 16);
  std::iota(x->begin(), x->end(), 0);
  for (auto& t : *x) t %= 64;
  for (size_t i = 0; i < y->size(); ++i) (*y)[i] = (*x)[(i + 1) % x->size()];
}

struct Counts {
  DeviceCallStats after_create, after_steps;
  uint64_t syncs_per_step = 0;
  uint64_t device_evictions = 0;
};

// Trains `steps` steps of an `layers`-block model with everything on NVMe and a device budget
// that holds a third of the blocks, and counts the device's calls.
Counts TrainAndCount(int layers, int steps, const std::string& dir) {
  Counts out;
  Config c;
  c.zinf.model = {.layers = static_cast<uint32_t>(layers), .width = 32, .heads = 4,
                  .seq_len = 16, .vocab = 64};
  c.zero.offload_param = {.device = OffloadDevice::kNvme, .nvme_path = dir};
  c.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dir};
  c.zinf.budgets.pinned_bytes = 8 << 20;
  const GptDims dims = GptDims::FromConfig(c.zinf.model);
  ExecutorOptions eo;
  eo.batch = 4;
  eo.params_on_nvme = eo.optimizer_on_nvme = true;
  // The least device budget the executor takes (its refusal names it), plus room for a third of
  // the blocks' 16-bit weights: the device tier pages.
  uint64_t least = 0;
  {
    c.zinf.budgets.device_bytes = 64 << 10;
    auto rt = MakeOffloadRuntime(c, {.swap_bytes = 64 << 20, .device_kind = DeviceKind::kHost});
    EXPECT_TRUE(rt.ok()) << rt.status().ToString();
    if (!rt.ok()) return out;
    Stream* compute = *(*rt)->device->CreateStream("compute");
    auto be = MakeBackend(*(*rt)->device, compute, 1, (*rt)->arena.get());
    auto refused = LayerExecutor::Create(**rt, **be, compute, dims, eo);
    EXPECT_FALSE(refused.ok());
    const std::string& m = refused.status().message();
    const size_t at = m.find("expected at least ");
    EXPECT_NE(at, std::string::npos) << m;
    if (at == std::string::npos) return out;
    least = std::stoull(m.substr(at + 18));
  }
  c.zinf.budgets.device_bytes = least + layers / 3 * ((2 * dims.MaxUnitParams() + 255) / 256 * 256);
  Built b = Build(c, dims, eo, {.swap_bytes = 64 << 20, .device_kind = DeviceKind::kHost});
  if (b.ex == nullptr) return out;
  auto& rt = b.rt;
  auto& ex = b.ex;
  EXPECT_TRUE(ex->InitWeights(1).ok());
  out.after_create = rt->device->call_stats();
  std::vector<int32_t> x, y;
  Tokens(&x, &y);
  kernels::AdamHyper h;
  h.lr = 1e-3f;
  uint64_t before = 0;
  for (int s = 0; s < steps; ++s) {
    if (s == 1) before = rt->device->call_stats().stream_synchronizes;
    auto r = ex->ForwardBackward(x.data(), y.data(), 1.0f, 1.0f, true, true);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    h.step = s + 1;
    EXPECT_TRUE(ex->OptimizerStep(h).ok());
    ex->EndStep();
  }
  EXPECT_TRUE(ex->FinishOptimizerStep().ok());
  out.after_steps = rt->device->call_stats();
  out.syncs_per_step = (out.after_steps.stream_synchronizes - before) / (steps - 1);
  out.device_evictions = rt->tiers->stats().device_evictions;
  return out;
}

TEST(LayerExecutorTest, OneDeviceAllocationAndNoHostSyncPerUnit) {
  zinf::testing::TempDir dir;
  const Counts small = TrainAndCount(3, 4, dir.path());
  const Counts large = TrainAndCount(9, 4, dir.path());
  for (const Counts* c : {&small, &large}) {
    // The arena is the device's one allocation; nothing is allocated or freed once running.
    EXPECT_EQ(c->after_create.allocations, 1u);
    EXPECT_EQ(c->after_steps.allocations, 1u);
    EXPECT_EQ(c->after_steps.frees, 0u);
    EXPECT_GT(c->device_evictions, 0u) << "the device tier was meant to page";
  }
  // The host waits once per micro-batch (the loss read-back), whatever the number of units.
  EXPECT_GT(small.syncs_per_step, 0u);
  EXPECT_EQ(small.syncs_per_step, large.syncs_per_step)
      << "stream synchronizations grow with the layers: a host wait per unit";
}

// Trains `steps` steps with every shard in host memory (the 16-bit weights pinned, the optimizer
// state in memory) and returns each unit's fp32 weights, and whether OptimizerStep returned before
// any Adam ran (the step on its own thread).
struct InMemoryRun {
  std::vector<std::vector<float>> weights;
  bool returned_before_adam = true;
};
InMemoryRun TrainInMemory(bool async, int steps) {
  InMemoryRun out;
  Config c;
  c.zinf.model = {.layers = 3, .width = 32, .heads = 4, .seq_len = 16, .vocab = 64};
  c.zero.offload_param = {.device = OffloadDevice::kCpu};
  c.zero.offload_optimizer = {.device = OffloadDevice::kCpu};
  c.zinf.budgets.pinned_bytes = 8 << 20;
  c.zinf.budgets.device_bytes = 16 << 20;
  const GptDims dims = GptDims::FromConfig(c.zinf.model);
  ExecutorOptions eo;
  eo.batch = 4;
  eo.async_optimizer = async;
  Built b = Build(c, dims, eo, {.device_kind = DeviceKind::kHost});
  if (b.ex == nullptr) return out;
  auto& ex = b.ex;
  EXPECT_TRUE(ex->InitWeights(1).ok());
  std::vector<int32_t> x, y;
  Tokens(&x, &y);
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  for (int s = 0; s < steps; ++s) {
    auto r = ex->ForwardBackward(x.data(), y.data(), 1.0f, 1.0f, true, true);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    h.step = s + 1;
    const double adam_before = ex->stats().adam_seconds;
    auto st = ex->OptimizerStep(h);
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    // The async step's stats arrive when it finishes; a synchronous one's at once.
    if (st.ok() && (st->units != 0 || ex->stats().adam_seconds != adam_before)) {
      out.returned_before_adam = false;
    }
    ex->EndStep();
  }
  EXPECT_TRUE(ex->FinishOptimizerStep().ok());
  for (uint32_t u = 0; u < dims.units(); ++u) {
    out.weights.emplace_back(dims.UnitParams(u));
    EXPECT_TRUE(ex->GetUnitWeights(u, out.weights.back().data()).ok());
  }
  return out;
}

// With the state in memory the optimizer step runs on its own thread under the next forward,
// and trains bit for bit as the step after backward.
TEST(LayerExecutorTest, StateInMemoryStepsUnderTheNextForwardBitForBit) {
  const InMemoryRun async = TrainInMemory(true, 4);
  const InMemoryRun sync = TrainInMemory(false, 4);
  EXPECT_TRUE(async.returned_before_adam) << "the in-memory step ran on the training thread";
  EXPECT_FALSE(sync.returned_before_adam);
  ASSERT_EQ(async.weights.size(), sync.weights.size());
  ASSERT_FALSE(async.weights.empty());
  for (size_t u = 0; u < async.weights.size(); ++u) {
    EXPECT_EQ(async.weights[u], sync.weights[u]) << "unit " << u;
  }
  // The weights moved (the test would pass on a run that never stepped otherwise).
  const InMemoryRun one = TrainInMemory(false, 1);
  EXPECT_NE(one.weights[1], sync.weights[1]);
}

// Two ranks (threads over the local transport) train `steps` steps at ZeRO-3 with everything on
// NVMe, the optimizer step under the next forward or after backward; each rank's final
// weights (GetUnitWeights, a collective: the whole units), and whether every OptimizerStep
// returned before its Adam ran.
struct Zero3Run {
  std::vector<std::vector<float>> weights[2];
  bool returned_before_adam[2] = {true, true};
};
Zero3Run TrainZero3(bool async, int steps) {
  Zero3Run out;
  zinf::testing::TempDir dirs[2];
  comm::testing::LocalWorld world(2);
  comm::testing::OnThreads(2, [&](int r) {
    Config c;
    // Width 40: the units' chunks are uneven (rank 1's shorter, padded).
    c.zinf.model = {.layers = 2, .width = 40, .heads = 4, .seq_len = 16, .vocab = 61};
    c.zero.offload_param = {.device = OffloadDevice::kNvme, .nvme_path = dirs[r].path()};
    c.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dirs[r].path()};
    c.zinf.budgets.pinned_bytes = 8 << 20;
    c.zinf.budgets.device_bytes = 16 << 20;
    const GptDims dims = GptDims::FromConfig(c.zinf.model);
    ExecutorOptions eo;
    eo.batch = 4;
    eo.params_on_nvme = eo.optimizer_on_nvme = true;
    eo.async_optimizer = async;
    eo.comm = world.comms[r].get();
    eo.partition_optimizer = eo.partition_grads = eo.partition_params = true;
    Built b = Build(c, dims, eo, {.swap_bytes = 64 << 20, .device_kind = DeviceKind::kHost});
    if (b.ex == nullptr) return;
    auto& ex = b.ex;
    EXPECT_TRUE(ex->InitWeights(1).ok());
    std::vector<int32_t> x, y;
    Tokens(&x, &y);
    for (auto& t : x) t = (t + 7 * r) % 61;  // each rank its own micro-batch
    for (auto& t : y) t = (t + 7 * r) % 61;
    kernels::AdamHyper h;
    h.lr = 1e-2f;
    for (int s = 0; s < steps; ++s) {
      auto fb = ex->ForwardBackward(x.data(), y.data(), 1.0f, 1.0f, true, true);
      EXPECT_TRUE(fb.ok()) << fb.status().ToString();
      h.step = s + 1;
      const double adam_before = ex->stats().adam_seconds;
      auto st = ex->OptimizerStep(h);
      EXPECT_TRUE(st.ok()) << st.status().ToString();
      if (st.ok() && (st->units != 0 || ex->stats().adam_seconds != adam_before)) {
        out.returned_before_adam[r] = false;
      }
      ex->EndStep();
    }
    EXPECT_TRUE(ex->FinishOptimizerStep().ok());
    for (uint32_t u = 0; u < dims.units(); ++u) {
      out.weights[r].emplace_back(dims.UnitParams(u));
      EXPECT_TRUE(ex->GetUnitWeights(u, out.weights[r].back().data()).ok());
    }
  });
  return out;
}

// ZeRO-3 with the state on NVMe: each rank's step runs on its own thread under the next
// forward (whose gathers wait for each unit's new shard), and trains bit for bit as the step
// after backward.
TEST(LayerExecutorTest, Zero3NvmeStepsUnderTheNextForwardBitForBit) {
  const Zero3Run async = TrainZero3(true, 3);
  const Zero3Run sync = TrainZero3(false, 3);
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(async.returned_before_adam[r])
        << "rank " << r << ": the step ran on the training thread";
    EXPECT_FALSE(sync.returned_before_adam[r]) << "rank " << r;
    ASSERT_EQ(async.weights[r].size(), sync.weights[r].size());
    ASSERT_FALSE(async.weights[r].empty());
    for (size_t u = 0; u < async.weights[r].size(); ++u) {
      EXPECT_EQ(async.weights[r][u], sync.weights[r][u]) << "rank " << r << ", unit " << u;
      EXPECT_EQ(async.weights[r][u], async.weights[0][u]) << "the ranks disagree, unit " << u;
    }
  }
  // The weights moved (the test would pass on a run that never stepped otherwise).
  const Zero3Run one = TrainZero3(false, 1);
  EXPECT_NE(one.weights[0][1], sync.weights[0][1]);
}

}  // namespace
}  // namespace zinf::train
