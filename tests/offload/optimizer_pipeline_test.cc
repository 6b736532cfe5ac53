// offload::OptimizerPipeline: the pipelined step over NVMe-homed state gives bit for bit what
// the same Adam steps give in memory; I/O faults surface as errors, never as silent success.
#include "offload/optimizer_pipeline.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <future>
#include <thread>
#include <cstring>
#include <functional>
#include <mutex>
#include <numeric>
#include <random>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/aligned_buffer.h"
#include "kernels/cpu/cast.h"
#include "io/fault_backend.h"
#include "src/base/hash.h"
#include "tests/test_util.h"

namespace zinf::offload {
namespace {

using kernels::DType;

struct MemUnit {
  std::vector<float> master, m, v, grad;
  std::vector<uint16_t> p16;
};

class OptimizerPipelineTest : public ::testing::TestWithParam<unsigned> {
 protected:
  // Build() over the posix engine behind a fault injector (no faults until a rule is set).
  void BuildWithFaults(io::FaultInjectingBackend** faults) {
    auto raw = io::MakePosixBackend({8, 0});
    ASSERT_TRUE(raw.ok());
    auto fb = std::make_unique<io::FaultInjectingBackend>(std::move(raw).value(), nullptr);
    *faults = fb.get();
    Build(io::Engine::WithBackend(std::move(fb), {.block_size = 128 << 10, .queue_depth = 8}));
  }
  void Build(std::unique_ptr<io::Engine> engine) {
    engine_ = std::move(engine);
    auto space = SwapSpace::Create(*engine_, {.dirs = {dir_.path()}, .size = 64 << 20});
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    space_ = std::move(space).value();
    auto pool = PinnedPool::Create({.budget_bytes = 16 << 20,
                                    .alignment = std::max<uint32_t>(space_->mem_align(), 4096)});
    ASSERT_TRUE(pool.ok()) << pool.status().ToString();
    pool_ = std::move(pool).value();
    ASSERT_TRUE(pool_->RegisterWith(*engine_).ok());
    std::mt19937_64 rng(3);
    std::normal_distribution<float> normal(0.f, 1.f);
    const uint64_t sizes[] = {1000, 150000, 77777, 200000, 4096, 123457};
    for (uint64_t n : sizes) {
      MemUnit mu;
      mu.master.resize(n);
      mu.m.resize(n);
      mu.v.resize(n);
      mu.grad.resize(n);
      mu.p16.resize(n);
      for (uint64_t i = 0; i < n; ++i) {
        mu.master[i] = normal(rng);
        mu.m[i] = 0.1f * normal(rng);
        mu.v[i] = std::abs(0.01f * normal(rng));
        mu.grad[i] = normal(rng);
      }
      OptimizerUnit u;
      u.n = n;
      u.master = *space_->Allocate(4 * n);
      u.exp_avg = *space_->Allocate(4 * n);
      u.exp_avg_sq = *space_->Allocate(4 * n);
      u.param16 = *space_->Allocate(2 * n);
      units_.push_back(u);
      mem_.push_back(std::move(mu));
    }
    for (size_t k = 0; k < units_.size(); ++k) units_[k].grad = mem_[k].grad.data();
    // Write the initial state home.
    for (size_t k = 0; k < units_.size(); ++k) {
      ASSERT_TRUE(WriteHome(units_[k].master, mem_[k].master.data()).ok());
      ASSERT_TRUE(WriteHome(units_[k].exp_avg, mem_[k].m.data()).ok());
      ASSERT_TRUE(WriteHome(units_[k].exp_avg_sq, mem_[k].v.data()).ok());
    }
  }

  Status WriteHome(const Extent& e, const void* src) {
    auto buf = io::AlignedBuffer::Allocate(space_->Padded(e.bytes), 4096);
    if (!buf.ok()) return buf.status();
    std::memcpy(buf->data(), src, e.bytes);
    return engine_->Write(space_->file(), e.offset, buf->data(), space_->Padded(e.bytes));
  }

  std::vector<uint8_t> ReadHome(const Extent& e) {
    auto buf = io::AlignedBuffer::Allocate(space_->Padded(e.bytes), 4096);
    EXPECT_TRUE(engine_->Read(space_->file(), e.offset, buf->data(), space_->Padded(e.bytes)).ok());
    return std::vector<uint8_t>(buf->data(), buf->data() + e.bytes);
  }

  // The reference: one in-memory Adam step (fp32 moments) of every unit of mem_.
  void StepInMemory(const kernels::AdamHyper& h) {
    for (auto& mu : mem_) {
      kernels::AdamBuffers b{mu.master.data(), mu.grad.data(), DType::kF32, mu.m.data(),
                             mu.v.data(), DType::kF32, mu.p16.data(), DType::kBf16,
                             mu.master.size()};
      kernels::AdamOptions ao;
      ao.threads = 2;
      ASSERT_TRUE(kernels::AdamStep(h, b, ao).ok());
    }
  }

  zinf::testing::TempDir dir_;
  std::unique_ptr<io::Engine> engine_;
  std::unique_ptr<SwapSpace> space_;
  std::unique_ptr<PinnedPool> pool_;
  std::vector<OptimizerUnit> units_;
  std::vector<MemUnit> mem_;
};

TEST_P(OptimizerPipelineTest, MatchesInMemoryAdamBitForBit) {
  auto e = io::Engine::Create({.block_size = 128 << 10, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  Build(std::move(e).value());
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  o.adam.threads = 2;
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.adamw = true;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    auto stats = (*pipe)->Step(units_, h);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->units, units_.size());
    EXPECT_GT(stats->bytes_read, 0u);
    StepInMemory(h);
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].master).data(), mem_[k].master.data(), 4 * n))
        << "unit " << k;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg).data(), mem_[k].m.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg_sq).data(), mem_[k].v.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].param16).data(), mem_[k].p16.data(), 2 * n));
    // The 16-bit copy is written padded to the alignment: with zeros (the slab held other
    // units' state there before).
    const Extent padded{units_[k].param16.offset, space_->Padded(2 * n)};
    const std::vector<uint8_t> tail = ReadHome(padded);
    EXPECT_TRUE(std::all_of(tail.begin() + 2 * n, tail.end(), [](uint8_t b) { return b == 0; }))
        << "unit " << k << ": the padding after its 16-bit weights is not zero";
  }
  EXPECT_LE(pool_->peak_bytes(), pool_->budget_bytes());
}

// bf16 moments (zinf.optimizer_state_dtype bf16): extents of 2n bytes, read and written as they
// are, and each step bit for bit the in-memory step with bf16 state; a third fewer state bytes
// move than with fp32 moments.
TEST_P(OptimizerPipelineTest, Bf16MomentsMatchInMemoryAdamBitForBit) {
  auto e = io::Engine::Create({.block_size = 128 << 10, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  Build(std::move(e).value());
  std::vector<std::vector<uint16_t>> m16(units_.size()), v16(units_.size());
  uint64_t state_bytes = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    m16[k].resize(n);
    v16[k].resize(n);
    ASSERT_TRUE(kernels::CastFromF32(mem_[k].m.data(), m16[k].data(), DType::kBf16, n).ok());
    ASSERT_TRUE(kernels::CastFromF32(mem_[k].v.data(), v16[k].data(), DType::kBf16, n).ok());
    units_[k].exp_avg = *space_->Allocate(2 * n);
    units_[k].exp_avg_sq = *space_->Allocate(2 * n);
    ASSERT_TRUE(WriteHome(units_[k].exp_avg, m16[k].data()).ok());
    ASSERT_TRUE(WriteHome(units_[k].exp_avg_sq, v16[k].data()).ok());
    state_bytes += space_->Padded(4 * n) + 2 * space_->Padded(2 * n);
  }
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  o.adam.threads = 2;
  o.moment_type = DType::kBf16;
  EXPECT_EQ(OptimizerPipeline::SlabBytes(200000, space_->offset_align(), DType::kBf16),
            space_->Padded(4 * 200000) + 3 * space_->Padded(2 * 200000));
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  {  // fp32-sized moment extents are refused, naming the moment type.
    std::vector<OptimizerUnit> wrong = {units_[0]};
    wrong[0].exp_avg = *space_->Allocate(4 * units_[0].n);
    kernels::AdamHyper h;
    auto r = (*pipe)->Step(wrong, h);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("bf16 moments"), std::string::npos)
        << r.status().ToString();
  }
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.adamw = true;
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    auto stats = (*pipe)->Step(units_, h);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->bytes_read, state_bytes);
    for (size_t k = 0; k < units_.size(); ++k) {
      MemUnit& mu = mem_[k];
      kernels::AdamBuffers b{mu.master.data(), mu.grad.data(), DType::kF32, m16[k].data(),
                             v16[k].data(), DType::kBf16, mu.p16.data(), DType::kBf16,
                             mu.master.size()};
      kernels::AdamOptions ao;
      ao.threads = 2;
      ASSERT_TRUE(kernels::AdamStep(h, b, ao).ok());
    }
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].master).data(), mem_[k].master.data(), 4 * n))
        << "unit " << k;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg).data(), m16[k].data(), 2 * n));
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg_sq).data(), v16[k].data(), 2 * n));
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].param16).data(), mem_[k].p16.data(), 2 * n));
  }
}

// Units whose state is in memory (OptimizerUnit::in_memory) ride the same pipeline beside NVMe
// ones: Adam updates their arrays in place, nothing of their state is read or written, and
// every unit ends bit for bit where in-memory Adam puts it. Units without a param16 extent
// (nothing at all to write) still free their slab for the unit after them: no hang at any
// depth.
TEST_P(OptimizerPipelineTest, UnitsInMemoryRideBesideNvmeOnesBitForBit) {
  auto e = io::Engine::Create({.block_size = 128 << 10, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  Build(std::move(e).value());
  // Units 0, 2, 3 and 5 in memory (copies of the initial state); 1 and 4 stay on NVMe.
  const std::vector<bool> resident = {true, false, true, true, false, true};
  std::vector<MemUnit> home(units_.size());
  uint64_t nvme_state_bytes = 0;
  for (size_t k = 0; k < units_.size(); ++k) {
    if (!resident[k]) {
      nvme_state_bytes += 3 * space_->Padded(4 * units_[k].n);
      continue;
    }
    home[k] = mem_[k];
    units_[k].in_memory = {home[k].master.data(), home[k].m.data(), home[k].v.data()};
    units_[k].master = units_[k].exp_avg = units_[k].exp_avg_sq = Extent{};
  }
  // Unit 3 writes nothing at all: its 16-bit copy goes to the caller only.
  units_[3].param16 = Extent{};
  units_[3].param16_to_caller = true;
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  o.adam.threads = 2;
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  {  // Half a unit in memory is refused.
    std::vector<OptimizerUnit> wrong = {units_[0]};
    wrong[0].in_memory[2] = nullptr;
    auto r = (*pipe)->Step(wrong, kernels::AdamHyper{});
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("all three arrays"), std::string::npos)
        << r.status().ToString();
  }
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.adamw = true;
  std::vector<uint16_t> unit3_p16(units_[3].n);
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    std::mutex mu;
    std::vector<int> written(units_.size(), 0);
    std::function<void(size_t)> on_written = [&](size_t u) {
      std::lock_guard lock(mu);
      ++written[u];
    };
    OptimizerPipeline::UpdatedFn on_updated = [&](size_t u, const void* p16) {
      if (u == 3) std::memcpy(unit3_p16.data(), p16, 2 * units_[3].n);
    };
    auto stats = (*pipe)->Step(units_, h, &on_written, &on_updated);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->bytes_read, nvme_state_bytes);
    EXPECT_EQ(written, std::vector<int>(units_.size(), 1));
    StepInMemory(h);
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    if (resident[k]) {
      EXPECT_EQ(home[k].master, mem_[k].master) << "unit " << k;
      EXPECT_EQ(0, std::memcmp(home[k].m.data(), mem_[k].m.data(), 4 * n)) << "unit " << k;
      EXPECT_EQ(0, std::memcmp(home[k].v.data(), mem_[k].v.data(), 4 * n)) << "unit " << k;
    } else {
      EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].master).data(), mem_[k].master.data(), 4 * n))
          << "unit " << k;
      EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg).data(), mem_[k].m.data(), 4 * n));
      EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg_sq).data(), mem_[k].v.data(), 4 * n));
    }
    if (k == 3) {
      EXPECT_EQ(unit3_p16, mem_[k].p16);
    } else {
      EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].param16).data(), mem_[k].p16.data(), 2 * n))
          << "unit " << k;
    }
  }
}

TEST_P(OptimizerPipelineTest, GradientsFromTierManagerShardsMatchTooBitForBit) {
  auto e = io::Engine::Create({.block_size = 128 << 10, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  Build(std::move(e).value());
  auto device = MakeHostDevice({.kind = DeviceKind::kHost, .budget_bytes = 8 << 20});
  ASSERT_TRUE(device.ok());
  auto arena = DeviceArena::Create(**device);
  ASSERT_TRUE(arena.ok());
  auto tm = TierManager::Create(**arena, *pool_, space_.get(), {.prefetch = false});
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  // The gradients live as fp32 shards homed on NVMe; the pipeline's slabs are taken before the
  // tier manager seals the rest of the pool (the pipeline leases two gradients at once).
  for (size_t k = 0; k < units_.size(); ++k) {
    auto id = (*tm)->Register({.name = "grad" + std::to_string(k), .role = Role::kGrad,
                               .bytes = 4 * units_[k].n});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    units_[k].grad = nullptr;
    units_[k].grad_shard = *id;
  }
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  o.grads = tm->get();
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  SealOptions seal;
  seal.max_leases[static_cast<int>(Tier::kHost)][static_cast<int>(Role::kGrad)] = 2;
  ASSERT_TRUE((*tm)->Seal(seal).ok());
  for (size_t k = 0; k < units_.size(); ++k) {
    ASSERT_TRUE((*tm)->WriteHome(*units_[k].grad_shard, mem_[k].grad.data()).ok());
  }
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  for (int step = 1; step <= 2; ++step) {
    h.step = step;
    auto stats = (*pipe)->Step(units_, h);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    for (auto& mu : mem_) {
      kernels::AdamBuffers b{mu.master.data(), mu.grad.data(), DType::kF32, mu.m.data(),
                             mu.v.data(), DType::kF32, mu.p16.data(), DType::kBf16,
                             mu.master.size()};
      ASSERT_TRUE(kernels::AdamStep(h, b, {}).ok());
    }
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].master).data(), mem_[k].master.data(), 4 * n))
        << "unit " << k;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].param16).data(), mem_[k].p16.data(), 2 * n));
  }
  EXPECT_LE(pool_->peak_bytes(), pool_->budget_bytes());
}

// on_unit_written fires once per unit, after that unit's new state is readable at home; a unit
// whose write failed is never reported.
TEST_P(OptimizerPipelineTest, ReportsEachUnitOnceItsWritesCompleted) {
  io::FaultInjectingBackend* faults = nullptr;
  ASSERT_NO_FATAL_FAILURE(BuildWithFaults(&faults));
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok());
  std::mutex mu;
  std::vector<size_t> seen;
  std::function<void(size_t)> cb = [&](size_t u) {
    std::lock_guard lock(mu);
    seen.push_back(u);
  };
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  auto stats = (*pipe)->Step(units_, h, &cb);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  std::vector<size_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  std::vector<size_t> all(units_.size());
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(sorted, all);
  // A failing write: that unit is not reported.
  const uint64_t bad = units_[1].master.offset;
  faults->set_rule([bad](const io::Piece& p) -> io::Fault {
    if (p.op == io::OpKind::kWrite && p.offset == bad) return {io::Fault::kErrno, EIO, 0};
    return {};
  });
  seen.clear();
  EXPECT_FALSE((*pipe)->Step(units_, h, &cb).ok());
  EXPECT_EQ(std::count(seen.begin(), seen.end(), size_t{1}), 0);
}

TEST_P(OptimizerPipelineTest, WriteErrorReachesTheCallerWithoutHanging) {
  io::FaultInjectingBackend* faults = nullptr;
  ASSERT_NO_FATAL_FAILURE(BuildWithFaults(&faults));
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok());
  const uint64_t bad = units_[2].exp_avg.offset;
  faults->set_rule([bad](const io::Piece& p) -> io::Fault {
    if (p.op == io::OpKind::kWrite && p.offset == bad) return {io::Fault::kErrno, EIO, 0};
    return {};
  });
  auto stats = (*pipe)->Step(units_, kernels::AdamHyper{});
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().errno_value(), EIO);
  EXPECT_NE(stats.status().message().find("offset " + std::to_string(bad)), std::string::npos)
      << stats.status().message();
  EXPECT_EQ(engine_->requests_in_flight(), 0u);
}

// A step started before its gradients are final (the executor starts it during the last
// backward): each unit's state is read while its gate is shut, the gates open in any order of
// time, and the result is bit for bit the ungated step; hyper may be set until the first gate
// opens. A gate that fails stops the step with its error: the units before it are written, that
// one and the ones after it are not, and nothing is left in flight.
TEST_P(OptimizerPipelineTest, GatedStepReadsAheadAndWaitsForEachGradient) {
  auto e = io::Engine::Create({.block_size = 128 << 10, .queue_depth = 8});
  ASSERT_TRUE(e.ok());
  Build(std::move(e).value());
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  o.adam.threads = 2;
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  kernels::AdamHyper h;  // set while the step already runs, before its first gate opens
  std::mutex mu;
  std::condition_variable cv;
  size_t opened = 0;
  std::vector<uint64_t> read_at_gate;
  OptimizerPipeline::GateFn gate = [&](size_t i, std::array<Extent, kStateRoles>*) -> Status {
    read_at_gate.push_back(engine_->stats().bytes_read);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return opened > i; });
    return Status::Ok();
  };
  const uint64_t before = engine_->stats().bytes_read;
  auto step = std::async(std::launch::async, [&] {
    return (*pipe)->Step(units_, h, nullptr, nullptr, nullptr, &gate);
  });
  // Unit 0's gate is shut: the first `depth` units' state is read meanwhile.
  uint64_t ahead = 0;
  for (size_t k = 0; k < std::min<size_t>(o.depth, units_.size()); ++k) {
    ahead += 12 * units_[k].n;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_->stats().bytes_read - before < ahead &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE(engine_->stats().bytes_read - before, ahead);
  {
    std::lock_guard lock(mu);
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    h.adamw = true;
    h.step = 1;
  }
  for (size_t k = 0; k < units_.size(); ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard lock(mu);
    ++opened;
    cv.notify_all();
  }
  auto stats = step.get();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->units, units_.size());
  EXPECT_EQ(read_at_gate.size(), units_.size());
  StepInMemory(h);
  for (size_t k = 0; k < units_.size(); ++k) {
    const uint64_t n = units_[k].n;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].master).data(), mem_[k].master.data(), 4 * n))
        << "unit " << k;
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].exp_avg_sq).data(), mem_[k].v.data(), 4 * n));
    EXPECT_EQ(0, std::memcmp(ReadHome(units_[k].param16).data(), mem_[k].p16.data(), 2 * n));
  }

  // A gate that says where unit 0's new state goes (another generation): it is written there,
  // and its extents as the step was given keep the state above.
  const std::vector<uint8_t> step1_master = ReadHome(units_[0].master);
  const uint64_t n0 = units_[0].n;
  std::array<Extent, kStateRoles> elsewhere = {*space_->Allocate(4 * n0),
                                               *space_->Allocate(4 * n0),
                                               *space_->Allocate(4 * n0)};
  OptimizerPipeline::GateFn redirect = [&](size_t i, std::array<Extent, kStateRoles>* out) {
    if (i == 0) *out = elsewhere;
    return Status::Ok();
  };
  h.step = 2;
  auto redirected = (*pipe)->Step(units_, h, nullptr, nullptr, nullptr, &redirect);
  ASSERT_TRUE(redirected.ok()) << redirected.status().ToString();
  StepInMemory(h);
  EXPECT_EQ(0, std::memcmp(ReadHome(elsewhere[kMasterState]).data(), mem_[0].master.data(), 4 * n0));
  EXPECT_EQ(0, std::memcmp(ReadHome(elsewhere[kExpAvgState]).data(), mem_[0].m.data(), 4 * n0));
  EXPECT_TRUE(ReadHome(units_[0].master) == step1_master);
  EXPECT_EQ(0, std::memcmp(ReadHome(units_[1].master).data(), mem_[1].master.data(),
                           4 * units_[1].n));
  // A gate given extents of the wrong size is refused, naming the unit.
  OptimizerPipeline::GateFn wrong = [&](size_t i, std::array<Extent, kStateRoles>* out) {
    if (i == 1) (*out)[kMasterState] = elsewhere[kMasterState];  // unit 0's size
    return Status::Ok();
  };
  auto refused = (*pipe)->Step(units_, h, nullptr, nullptr, nullptr, &wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("optimizer unit 1"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(engine_->requests_in_flight(), 0u);

  // A gate that fails at unit 2: units 0 and 1 updated again, 2.. keep the state above.
  const std::vector<uint8_t> kept = ReadHome(units_[2].master);
  OptimizerPipeline::GateFn failing = [](size_t i, std::array<Extent, kStateRoles>*) -> Status {
    return i == 2 ? Aborted("backward failed") : Status::Ok();
  };
  std::vector<size_t> written;
  std::function<void(size_t)> on_written = [&](size_t i) {
    std::lock_guard lock(mu);
    written.push_back(i);
  };
  h.step = 3;
  auto failed = (*pipe)->Step(units_, h, &on_written, nullptr, nullptr, &failing);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kAborted);
  EXPECT_NE(failed.status().message().find("backward failed"), std::string::npos);
  std::sort(written.begin(), written.end());
  EXPECT_EQ(written, (std::vector<size_t>{0, 1}));
  EXPECT_TRUE(ReadHome(units_[2].master) == kept);
  EXPECT_NE(0, std::memcmp(ReadHome(units_[0].master).data(), mem_[0].master.data(),
                           4 * units_[0].n));
  EXPECT_EQ(engine_->requests_in_flight(), 0u);
}

TEST(OptimizerPipelineCreateTest, RefusesSlabsThatDoNotFitTheBudget) {
  zinf::testing::TempDir dir;
  auto engine = io::Engine::Create({});
  ASSERT_TRUE(engine.ok());
  auto space = SwapSpace::Create(**engine, {.dirs = {dir.path()}, .size = 4 << 20});
  ASSERT_TRUE(space.ok());
  auto pool = PinnedPool::Create({.budget_bytes = 4 << 20});
  ASSERT_TRUE(pool.ok());
  OptimizerPipelineOptions o;
  o.depth = 3;
  auto pipe = OptimizerPipeline::Create(**space, **pool, 1 << 20, o);
  ASSERT_FALSE(pipe.ok());
  EXPECT_EQ(pipe.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(pipe.status().message().find("pinned_bytes"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Depths, OptimizerPipelineTest, ::testing::Values(1u, 2u, 3u, 4u));

}  // namespace
}  // namespace zinf::offload

namespace zinf::offload {
namespace {

// Two generations: the step reads one set of extents and writes another (a checkpoint's extents
// stay untouched), computing the xxHash64 of each unit's new state; the next step reads the new
// generation and checks those hashes; a flipped byte in it is caught before the unit is written.
TEST_P(OptimizerPipelineTest, WritesTheOtherGenerationHashesItAndChecksItOnTheWayBack) {
  io::FaultInjectingBackend* faults = nullptr;
  BuildWithFaults(&faults);
  if (HasFatalFailure()) return;
  OptimizerPipelineOptions o;
  o.depth = GetParam();
  auto pipe = OptimizerPipeline::Create(*space_, *pool_, 200000, o);
  ASSERT_TRUE(pipe.ok()) << pipe.status().ToString();
  // Generation 1: fresh extents for every unit's fp32 state.
  std::vector<OptimizerUnit> next = units_;
  for (auto& u : next) {
    u.master_out = *space_->Allocate(4 * u.n);
    u.exp_avg_out = *space_->Allocate(4 * u.n);
    u.exp_avg_sq_out = *space_->Allocate(4 * u.n);
  }
  std::vector<std::vector<uint8_t>> before;
  for (const auto& u : units_) before.push_back(ReadHome(u.master));
  kernels::AdamHyper h;
  h.lr = 1e-2f;
  h.step = 1;
  StepHashing hashing;
  hashing.compute = true;
  auto stats = (*pipe)->Step(next, h, nullptr, nullptr, &hashing);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ASSERT_EQ(hashing.written.size(), units_.size());
  for (size_t k = 0; k < units_.size(); ++k) {
    EXPECT_EQ(ReadHome(units_[k].master), before[k]) << "generation 0 was written: unit " << k;
    const auto m = ReadHome(next[k].master_out), v = ReadHome(next[k].exp_avg_sq_out);
    EXPECT_EQ(hashing.written[k][kMasterState], Xxh64(m.data(), m.size())) << k;
    EXPECT_EQ(hashing.written[k][kExpAvgSqState], Xxh64(v.data(), v.size())) << k;
    EXPECT_NE(ReadHome(next[k].master_out), before[k]) << "the step changed nothing: unit " << k;
  }
  // Step 2 reads generation 1 and checks it against the hashes of step 1.
  std::vector<OptimizerUnit> back = units_;
  for (size_t k = 0; k < units_.size(); ++k) {
    back[k].master = next[k].master_out;
    back[k].exp_avg = next[k].exp_avg_out;
    back[k].exp_avg_sq = next[k].exp_avg_sq_out;
  }
  StepHashing check;
  check.expected = hashing.written;
  h.step = 2;
  auto again = (*pipe)->Step(back, h, nullptr, nullptr, &check);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_GT(again->hash_seconds, 0);
  // A flipped byte in unit 3's exp_avg: refused before unit 3 writes anything.
  check.expected.assign(units_.size(), {});
  StepHashing fresh;
  fresh.compute = true;
  h.step = 3;
  ASSERT_TRUE((*pipe)->Step(back, h, nullptr, nullptr, &fresh).ok());
  auto v = ReadHome(back[3].exp_avg);
  v[100] ^= 0x40;
  ASSERT_TRUE(WriteHome(back[3].exp_avg, v.data()).ok());
  const auto master3 = ReadHome(back[3].master);
  check.expected = fresh.written;
  h.step = 4;
  auto bad = (*pipe)->Step(back, h, nullptr, nullptr, &check);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("optimizer unit 3: its exp_avg"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find(fmt::format("offset {}", back[3].exp_avg.offset)),
            std::string::npos) << bad.status().message();
  EXPECT_EQ(ReadHome(back[3].master), master3) << "unit 3 was written after the mismatch";
}

}  // namespace
}  // namespace zinf::offload
