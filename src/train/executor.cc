#include "src/train/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <set>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "kernels/cpu/cast.h"
#include "src/base/units.h"
#include "src/ckpt/manifest.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

uint64_t PinnedBytesWanted(const Model& d, const ExecutorOptions& o, uint64_t align) {
  auto page = [](uint64_t b) { return (b + 4095) / 4096 * 4096; };
  auto pad = [&](uint64_t b) { return page((b + align - 1) / align * align); };
  const uint64_t max_n = d.MaxUnitParams();
  const uint32_t ranks = o.comm != nullptr ? static_cast<uint32_t>(o.comm->world()) : o.sizing_world;
  const bool reduce = ranks > 1;
  const uint64_t grad_elem = o.micro_batches == 1 && !reduce ? 2 : 4;
  uint64_t total = 0;
  const bool zero1 = reduce && o.partition_optimizer;
  const bool zero2 = zero1 && o.partition_grads;
  const bool zero3 = zero2 && o.partition_params;
  const uint32_t world = reduce ? ranks : 1;
  if (o.optimizer_on_nvme) {
    // Across ranks a slab holds a unit's chunk of the state; rank 0's chunks are the largest
    // (ckpt::ChunkOfUnit).
    uint64_t max_state = 0;
    for (uint32_t u = 0; u < d.units(); ++u) {
      const uint64_t n = d.UnitParams(u);
      max_state = std::max(max_state, zero1 ? ckpt::ChunkOfUnit(n, world, 0).len : n);
    }
    total += o.pipeline_slabs *
             page(offload::OptimizerPipeline::SlabBytes(max_state, align, o.moment_type));
  }
  if (grad_elem == 4) total += 2 * page(2 * max_n);  // the hand-overs' staging blocks
  // Every shard's host copy, sized as RegisterShards registers it (ZeRO-1's gradients padded
  // to world chunks, ZeRO-2's a chunk, ZeRO-3's 16-bit weights a chunk), and for each size one
  // more: the tier manager's slot for a copy in transfer.
  std::set<uint64_t> sizes;
  uint64_t max_per = 0;
  for (uint32_t u = 0; u < d.units(); ++u) {
    const uint64_t n = d.UnitParams(u);
    const uint64_t per = ckpt::ChunkOfUnit(n, world, 0).per;
    max_per = std::max(max_per, per);
    const uint64_t p16 = pad(Param16Bytes(zero3 ? per : n));
    const uint64_t grad = pad(grad_elem * (zero2 ? per : zero1 ? per * world : n));
    total += p16 + grad;
    sizes.insert(p16);
    sizes.insert(grad);
  }
  for (uint64_t size : sizes) total += size;
  if (zero3) total += 2 * page(Param16Bytes(max_per * world));  // the gathered units
  return total;
}

LayerExecutor::LayerExecutor(OffloadRuntime& rt, Backend<float>& be, Stream* s, const Model& d,
                             const ExecutorOptions& o)
    : rt_(rt), be_(be), compute_(s), model_(d), options_(o) {}

LayerExecutor::~LayerExecutor() {
  FinishOptimizerStep().IgnoreError();
  // The tier manager outlives this executor: a derivation queued or running (a prefetch for
  // the next step) reads master_, so each is waited for and no new one starts.
  for (uint32_t u = 0; u < std::min(p16_derived_.size(), p16_.size()); ++u) BeginMasterWrite(u);
  if (compute_ != nullptr) rt_.device->StreamSynchronize(compute_).IgnoreError();
  if (gather_copy_ != nullptr) rt_.device->StreamSynchronize(gather_copy_).IgnoreError();
  be_.Synchronize().IgnoreError();
  accumulator_.reset();
  pipeline_.reset();
  rt_.arena->Free(arena_).IgnoreError();
  rt_.device->FreePinned(host_io_).IgnoreError();
  DropGather().IgnoreError();
  for (auto& b : gathered_host_) rt_.pool->Free(b).IgnoreError();
}

Result<std::unique_ptr<LayerExecutor>> LayerExecutor::Create(OffloadRuntime& rt,
                                                             Backend<float>& be, Stream* compute,
                                                             const Model& model,
                                                             const ExecutorOptions& options) {
  if (options.param16_type != kernels::DType::kBf16 && options.param16_type != kernels::DType::kF16) {
    return InvalidArgument("the working copy of the weights must be bf16 or fp16");
  }
  if (options.batch < 1) return InvalidArgument("micro-batch size must be >= 1");
  if (!model.is_gpt() && !be.HasLlamaOps()) {
    return Unimplemented(fmt::format("zinf.model.arch \"llama\": the {} backend has no "
                                     "Llama-family ops yet; use the CPU backend (--device host)",
                                     be.name()));
  }
  if (options.seq < 0 || options.seq > model.seq()) {
    return InvalidArgument(fmt::format("sequence length {}: expected 1..{} (zinf.model.seq_len)",
                                       options.seq, model.seq()));
  }
  if ((options.optimizer_on_nvme || options.params_on_nvme) && rt.swap == nullptr) {
    return FailedPrecondition("NVMe offload asked for but the runtime has no swap space");
  }
  std::unique_ptr<LayerExecutor> e(new LayerExecutor(rt, be, compute, model, options));
  e->batch_ = options.batch;
  e->seq_ = options.seq == 0 ? model.seq() : options.seq;
  ZINF_RETURN_IF_ERROR(e->Setup());
  return e;
}

LayerExecutor::Chunk LayerExecutor::ChunkOf(uint32_t unit) const {
  const uint64_t n = model_.UnitParams(unit);
  if (!partitioned_) return {0, n, n};
  // The checkpoint format's rule (a checkpoint's parts are these chunks).
  const ckpt::UnitChunk c = ckpt::ChunkOfUnit(n, static_cast<uint32_t>(options_.comm->world()),
                                              static_cast<uint32_t>(options_.comm->rank()));
  return {c.lo, c.len, c.per};
}

uint64_t LayerExecutor::StateElems(uint32_t unit) const { return ChunkOf(unit).len; }

uint64_t LayerExecutor::MaxStateElems() const {
  uint64_t m = 0;
  for (uint32_t u = 0; u < model_.units(); ++u) m = std::max(m, StateElems(u));
  return m;
}

uint64_t LayerExecutor::RoundingStream(uint32_t unit) const {
  // The unit's stream whatever the chunking: a chunk draws from its offset in the unit
  // (AdamBuffers::state_index_base = ChunkOf(unit).lo), so N ranks round as one rank does.
  return uint64_t{unit};
}

uint64_t LayerExecutor::StateBytes(uint32_t unit, int role) const {
  return offload::StateRoleBytes(role, StateElems(unit), options_.moment_type);
}

uint64_t LayerExecutor::Param16ShardBytes() const {
  uint64_t b = 0;
  for (offload::ShardId id : p16_) b += rt_.tiers->spec(id).bytes;
  return b;
}

uint64_t LayerExecutor::Param16DerivedBytes() const {
  uint64_t b = 0;
  for (uint32_t u = 0; u < p16_.size(); ++u) {
    if (Param16Derived(u)) b += rt_.tiers->spec(p16_[u]).bytes;
  }
  return b;
}

uint64_t LayerExecutor::GradShardBytes() const {
  uint64_t b = 0;
  for (offload::ShardId id : grad_) b += rt_.tiers->spec(id).bytes;
  return b;
}

void LayerExecutor::BeginMasterWrite(uint32_t unit) {
  if (Param16Derived(unit)) rt_.tiers->BeginRewrite(p16_[unit]);
}

Status LayerExecutor::Param16Changed(uint32_t unit, const uint16_t* p16) {
  if (Param16Derived(unit)) return rt_.tiers->Invalidate(p16_[unit]);
  return rt_.tiers->WriteHome(p16_[unit], p16);
}

bool LayerExecutor::AnyStateInMemory() const {
  return std::find(in_memory_.begin(), in_memory_.end(), 1) != in_memory_.end();
}

uint64_t LayerExecutor::StateBytesInMemory() const {
  uint64_t b = 0;
  for (uint32_t u = 0; u < model_.units(); ++u) {
    if (StateOnNvme(u)) continue;
    for (int r = 0; r < offload::kStateRoles; ++r) b += StateBytes(u, r);
  }
  return b;
}

uint64_t LayerExecutor::StateBytesOnNvme() const {
  uint64_t b = 0;
  for (uint32_t u = 0; u < model_.units(); ++u) {
    if (!StateOnNvme(u)) continue;
    for (int r = 0; r < offload::kStateRoles; ++r) b += StateBytes(u, r);
  }
  return b;
}

uint64_t LayerExecutor::StateParams() const {
  uint64_t n = 0;
  for (uint32_t u = 0; u < model_.units(); ++u) n += StateElems(u);
  return n;
}

Status LayerExecutor::Setup() {
  partitioned_ = options_.partition_optimizer && ReducesGrads();
  partitioned_grads_ = partitioned_ && options_.partition_grads;
  partitioned_params_ = partitioned_grads_ && options_.partition_params;
  in_memory_.assign(model_.units(), 1);
  if (options_.optimizer_on_nvme) {
    if (options_.state_in_memory.size() > model_.units()) {
      return InvalidArgument(fmt::format("state_in_memory names {} units; the model has {}",
                                         options_.state_in_memory.size(), model_.units()));
    }
    for (uint32_t u = 0; u < model_.units(); ++u) {
      in_memory_[u] = u < options_.state_in_memory.size() && options_.state_in_memory[u] ? 1 : 0;
    }
  }
  if (partitioned_grads_) {
    // ZeRO-2: a hand-over's staged 16-bit gradient (padded to world chunks with zeros, so the
    // padding sums to zero) reduce-scattered into this rank's chunk of the sum, in fp32.
    // Issued on the accumulator's thread and waited for there; the training thread waits
    // only for it to be issued before a collective of its own (WaitIssued).
    reduce_fn_ = [this](void* staged, kernels::DType type, size_t n, float* out,
                        size_t per) -> Result<offload::HandOver::ReduceWait> {
      const auto w = static_cast<size_t>(options_.comm->world());
      std::memset(static_cast<uint8_t*>(staged) + 2 * n, 0, 2 * (w * per - n));
      const auto kind = static_cast<size_t>(comm::OpKind::kReduceScatter);
      const uint64_t sent0 = options_.comm->stats().bytes_sent[kind];
      const auto t0 = Clock::now();
      comm::Work work = options_.comm->ReduceScatter(
          staged, type == kernels::DType::kF16 ? comm::DType::kF16 : comm::DType::kBf16, out,
          comm::DType::kF32, per);
      return offload::HandOver::ReduceWait([this, work, t0, kind, sent0, out,
                                            per]() -> Status {
        Status s = work.Wait();
        // No other reduce-scatter runs meanwhile (the training thread issues none while
        // hand-overs are in flight).
        reduce_sent_bytes_ += options_.comm->stats().bytes_sent[kind] - sent0;
        uint64_t replica_sent = 0;
        if (s.ok()) s = AllReduceOverReplicas(out, per, &replica_sent);
        reduce_sent_bytes_ += replica_sent;
        reduce_nanos_ += static_cast<uint64_t>(Since(t0) * 1e9);
        return s.WithContext("reduce-scattering a gradient over the ranks (ZeRO-2)");
      });
    };
  }
  if (partitioned_) {
    for (uint32_t u = 0; u < model_.units(); ++u) {
      if (ChunkOf(u).len == 0) {
        return InvalidArgument(fmt::format(
            "{} has {} parameters: too few to give each of {} ranks a part of its optimizer "
            "state (ZeRO-1); use fewer ranks or stage 0", model_.UnitName(u),
            model_.UnitParams(u), options_.comm->world()));
      }
    }
  }
  ZINF_RETURN_IF_ERROR(RegisterShards());
  ZINF_RETURN_IF_ERROR(CheckPinnedBudget());
  if (partitioned_params_) {
    for (auto& b : gathered_host_) {
      ZINF_ASSIGN_OR_RETURN(b, rt_.pool->Allocate(Param16Bytes(gather16_.size())));
    }
    ZINF_ASSIGN_OR_RETURN(gather_copy_, rt_.device->CreateStream("gathered units to device"));
  }
  uint64_t max_n = model_.MaxUnitParams();
  // ZeRO-2 stages a unit's gradient padded to world equal chunks.
  uint64_t max_staged = max_n;
  if (partitioned_grads_) {
    for (uint32_t u = 0; u < model_.units(); ++u)
      max_staged = std::max<uint64_t>(
          max_staged, ChunkOf(u).per * static_cast<uint64_t>(options_.comm->world()));
  }
  if (options_.optimizer_on_nvme) {
    offload::OptimizerPipelineOptions po;
    po.depth = options_.pipeline_slabs;
    po.adam = options_.adam;
    po.param16_type = options_.param16_type;
    po.moment_type = options_.moment_type;
    po.stochastic_moments = options_.stochastic_moments;
    po.rounding_seed = options_.rounding_seed;
    po.tracer = options_.tracer;
    po.grads = rt_.tiers.get();
    po.untraced_grads = options_.async_optimizer;  // it may run beside the next forward
    // Across ranks each slab holds a unit's chunk of the state, not the unit.
    ZINF_ASSIGN_OR_RETURN(pipeline_, offload::OptimizerPipeline::Create(
                                         *rt_.swap, *rt_.pool, MaxStateElems(), po));
  }
  ZINF_ASSIGN_OR_RETURN(
      accumulator_,
      offload::GradAccumulator::Create(
          *rt_.tiers, *rt_.device, *rt_.pool,
          {.max_unit_elems = max_staged, .fp32_shards = GradType() == kernels::DType::kF32,
           .depth = kHandOverDepth, .device_grad_bytes = 2}));
  ZINF_RETURN_IF_ERROR(AllocateDevice());
  return SealTiers();
}

offload::SealOptions LayerExecutor::SealPlan() const {
  offload::SealOptions o;
  for (auto& tier : o.max_leases) tier.fill(0);
  constexpr int kDev = static_cast<int>(Tier::kDevice), kHost = static_cast<int>(Tier::kHost);
  constexpr int kP16 = static_cast<int>(offload::Role::kParam16);
  constexpr int kGrad = static_cast<int>(offload::Role::kGrad);
  // FetchWeights holds one unit's 16-bit weights on the device at a time (ZeRO-3: this rank's
  // chunk of it in the host tier for the all-gather, and the next unit's, gathered ahead).
  if (partitioned_params_) {
    o.max_leases[kHost][kP16] = 2;
  } else {
    o.max_leases[kDev][kP16] = 1;
  }
  // Gradients in the host tier: the hand-overs in flight during backward, or the optimizer
  // pipeline's two (a unit's and the next one's) under the forward. A pipeline started during
  // the last backward (gated) leases one unit's at a time beside the hand-overs (with
  // overlap_adam its Adam runs while backward goes on; across ranks the training thread's
  // reduction of a unit waits for the hand-overs first).
  const bool gated = options_.optimizer_on_nvme && options_.async_optimizer && !partitioned_;
  o.max_leases[kHost][kGrad] = std::max<uint32_t>(kHandOverDepth + (gated ? 1 : 0),
                                                  options_.optimizer_on_nvme ? 2 : 1);
  o.spare = {0, 1};  // one host slot per size for a copy in transfer
  return o;
}

Status LayerExecutor::CheckPinnedBudget() const {
  // Everything the pinned pool must hold at once, checked before anything but the shards homed
  // there is taken: the optimizer pipeline's slabs, the gradient staging blocks (fp32 sums), and
  // the least the tier manager's host slots need (for each size of shard, the leases held at
  // once and one copy in transfer).
  const offload::PinnedPool& pool = *rt_.pool;
  const uint64_t max_n = model_.MaxUnitParams();
  const uint64_t homed = pool.bytes_in_use();
  const uint64_t slabs =
      options_.optimizer_on_nvme
          ? options_.pipeline_slabs *
                pool.BlockBytes(offload::OptimizerPipeline::SlabBytes(
                    MaxStateElems(), rt_.swap->offset_align(), options_.moment_type))
          : 0;
  const uint64_t staging =
      GradType() == kernels::DType::kF32 ? kHandOverDepth * pool.BlockBytes(2 * max_n) : 0;
  const uint64_t copies = rt_.tiers->MinimumSealBytes(SealPlan()).host_bytes;
  // ZeRO-3: the gathered units (world chunks of the largest; the one in use and the next).
  const uint64_t gathered =
      partitioned_params_ ? 2 * pool.BlockBytes(Param16Bytes(gather16_.size())) : 0;
  const uint64_t need = homed + slabs + staging + copies + gathered;
  if (need <= pool.budget_bytes()) return Status::Ok();
  return ResourceExhausted(fmt::format(
      "zinf.budgets.pinned_bytes: {} bytes ({}) cannot hold what a step needs at once: {} bytes "
      "({}) in all = shards homed in pinned memory {} + the optimizer pipeline's {} slabs {} + "
      "gradient staging {} + the shard copies in use at once {} ({} for each size of shard, "
      "plus one copy in transfer) + the gathered units (ZeRO-3) {}; raise "
      "zinf.budgets.pinned_bytes to at least {}{}",
      pool.budget_bytes(), FormatBytesHuman(pool.budget_bytes()), need, FormatBytesHuman(need),
      homed, options_.optimizer_on_nvme ? options_.pipeline_slabs : 0, slabs, staging, copies,
      options_.optimizer_on_nvme ? "the optimizer's two gradient leases"
                                 : "the gradient hand-overs in flight",
      gathered, need, options_.optimizer_on_nvme ? " or lower zinf.pipeline_depth" : ""));
}

Status LayerExecutor::SealTiers() { return rt_.tiers->Seal(SealPlan()); }

Status LayerExecutor::RegisterShards() {
  offload::TierManager& tm = *rt_.tiers;
  const bool p16_nvme = options_.params_on_nvme || options_.optimizer_on_nvme;
  const bool grad_nvme = rt_.swap != nullptr;
  for (uint32_t u = 0; u < model_.units(); ++u) {
    const uint64_t n = model_.UnitParams(u);
    // The optimizer state's elements (this rank's chunk with ZeRO-1) and the gradient's (the
    // unit, padded to world equal chunks with ZeRO-1: reduce-scattered in place).
    const Chunk chunk = ChunkOf(u);
    const uint64_t sn = chunk.len;
    // The 16-bit weights' elements: the unit, or with ZeRO-3 this rank's chunk (padded).
    const uint64_t pn = partitioned_params_ ? chunk.per : n;
    const uint64_t gn = partitioned_grads_ ? chunk.per
                        : partitioned_     ? chunk.per * static_cast<uint64_t>(options_.comm->world())
                                           : n;
    offload::OptimizerUnit ou;
    ou.n = sn;
    ou.grad_type = GradType();
    ou.rounding_stream = RoundingStream(u);
    ou.rounding_index_base = ChunkOf(u).lo;
    offload::Extent p16_home;
    const uint64_t mb = offload::StateRoleBytes(offload::kExpAvgState, sn, options_.moment_type);
    if (StateOnNvme(u)) {
      offload::SwapSpace& sw = *rt_.swap;
      ZINF_ASSIGN_OR_RETURN(ou.master, sw.Allocate(4 * sn));
      ZINF_ASSIGN_OR_RETURN(ou.exp_avg, sw.Allocate(mb));
      ZINF_ASSIGN_OR_RETURN(ou.exp_avg_sq, sw.Allocate(mb));
      master_.emplace_back();
      exp_avg_.emplace_back();
      exp_avg_sq_.emplace_back();
    } else {
      master_.emplace_back(sn);
      exp_avg_.emplace_back(mb);
      exp_avg_sq_.emplace_back(mb);
    }
    if (p16_nvme) {
      ZINF_ASSIGN_OR_RETURN(p16_home, rt_.swap->Allocate(Param16Bytes(pn)));
      // ZeRO-1/2 with the pipeline: it updates a chunk and writes no 16-bit weights home (the
      // gathered unit is, by GatherParam16). ZeRO-3: the shard is the chunk, padded with zeros
      // to `per` values: the pipeline writes its first Param16Bytes(len) (padded with zeros to
      // the alignment) when it steps under the next forward; the padding after stays as the
      // first WriteHome left it, zero.
      if (!(partitioned_ && options_.optimizer_on_nvme)) ou.param16 = p16_home;
      else if (partitioned_params_) ou.param16 = {p16_home.offset, Param16Bytes(sn)};
    }
    offload::ShardSpec p{.name = model_.UnitName(u) + ".param16", .unit = u,
                         .role = offload::Role::kParam16, .bytes = Param16Bytes(pn),
                         .home = p16_nvme ? Tier::kNvme : Tier::kHost};
    if (p16_nvme) p.home_extent = p16_home;
    // The master weights in memory cover the unit's 16-bit weights: those are cast from them
    // when loaded (the cast the optimizer writes), never written to or read from NVMe. Their
    // extent stays allocated (unwritten: no disk), so the swap file's layout, which resumes
    // check, does not depend on the placement's derived units.
    const bool derived = p16_nvme && !StateOnNvme(u) && !partitioned_ && !partitioned_params_;
    p16_derived_.push_back(derived ? 1 : 0);
    if (derived) {
      ou.param16 = {};
      ou.param16_to_caller = true;  // the async step installs the new weights it computes
      p.derive = [this, u, n](void* dst) {
        return kernels::CastFromF32(master_[u].data(), dst, options_.param16_type, n);
      };
    }
    ZINF_ASSIGN_OR_RETURN(offload::ShardId pid, tm.Register(p));
    ZINF_ASSIGN_OR_RETURN(offload::ShardId gid,
                          tm.Register({.name = model_.UnitName(u) + ".grad", .unit = u,
                                       .role = offload::Role::kGrad, .bytes = GradBytes(gn),
                                       .home = grad_nvme ? Tier::kNvme : Tier::kHost}));
    p16_.push_back(pid);
    grad_.push_back(gid);
    ou.grad_shard = gid;
    ou.grad_shard_n = gn;  // ZeRO-2/3: the chunk padded to `per` (ZeRO-1 steps pass a pointer)
    opt_units_.push_back(ou);
  }
  // The 16-bit copy of a unit's new weights, where no slab takes it (state in memory; across
  // ranks, whose slabs hold chunks): 2 bytes a parameter of the largest unit.
  if (AnyStateInMemory() || partitioned_) p16_staging_.resize(model_.MaxUnitParams());
  // Units in memory ride the pipeline with their arrays (when there is one: NVMe state).
  if (options_.optimizer_on_nvme) {
    for (uint32_t u = 0; u < model_.units(); ++u) {
      if (!StateOnNvme(u)) {
        opt_units_[u].in_memory = {master_[u].data(), exp_avg_[u].data(), exp_avg_sq_[u].data()};
      }
    }
  }
  if (partitioned_) {
    uint64_t most = 0;
    for (uint32_t u = 0; u < model_.units(); ++u) most = std::max(most, ChunkOf(u).per);
    gather16_.resize(most * static_cast<uint64_t>(options_.comm->world()));
  }
  const uint32_t units = model_.units();
  state_ext_.resize(1);
  for (uint32_t u = 0; u < units; ++u) {
    all_units_.push_back(u);
    const auto& ou = opt_units_[u];
    state_ext_[0].push_back({ou.master, ou.exp_avg, ou.exp_avg_sq});
  }
  const uint32_t gens = options_.optimizer_on_nvme ? std::max(1u, options_.state_generations) : 1;
  if (gens > 64) {
    return InvalidArgument(fmt::format("{} generations of optimizer state; at most 64", gens));
  }
  // Each further generation after every other extent, in unit order: a resumed run with the
  // same model and swap configuration gets the same offsets.
  for (uint32_t g = 1; g < gens; ++g) {
    state_ext_.emplace_back();
    for (uint32_t u = 0; u < units; ++u) {
      std::array<offload::Extent, offload::kStateRoles> ext{};
      for (int r = 0; r < offload::kStateRoles && StateOnNvme(u); ++r) {
        ZINF_ASSIGN_OR_RETURN(ext[r], rt_.swap->Allocate(StateBytes(u, r)));
      }
      state_ext_[g].push_back(ext);
    }
  }
  cur_gen_.assign(units, 0);
  next_gen_.assign(units, 0);
  hashes_.assign(units, {});
  hashes_known_.assign(units, 0);
  return Status::Ok();
}

namespace {

struct DevicePart {
  float** ptr;
  uint64_t elems;
};

// The executor's device buffers in the order AllocateDevice carves them (ptr null: sizing only).
// scratch: the layer scratch (Model::LayerScratchElems).
std::vector<DevicePart> DeviceParts(const Model& d, int B, int T, uint64_t scratch,
                                    std::array<float**, 9> ptrs = {}) {
  const uint64_t N = static_cast<uint64_t>(B) * T, NC = N * d.width();
  return {
      {ptrs[0], NC * (d.layers() + 1)},
      {ptrs[1], d.LayerActsElems(B, T)},
      {ptrs[2], d.HeadActsElems(B, T)},
      {ptrs[3], NC},
      {ptrs[4], scratch},
      {ptrs[5], d.MaxUnitParams()},
      {ptrs[6], d.UnitParams(0)},
      {ptrs[7], d.MaxUnitParams()},
      {ptrs[8], d.UnitParams(0)},
  };
}

uint64_t Round256(uint64_t b) { return (b + 255) / 256 * 256; }

}  // namespace

uint64_t DeviceBufferBytes(const Model& d, int B, int T, uint64_t layer_scratch,
                           uint64_t gathered_elems) {
  const uint64_t N = static_cast<uint64_t>(B) * T;
  const uint64_t token_floats = 2 * N;  // tokens and targets, int32 each
  // One unit's 16-bit gradient for the hand-over; ZeRO-3: a gathered unit's 16-bit weights.
  uint64_t total = token_floats * 4 + Round256(2 * d.MaxUnitParams()) +
                   (gathered_elems > 0 ? Round256(Param16Bytes(gathered_elems)) : 0);
  for (const DevicePart& p : DeviceParts(d, B, T, layer_scratch)) total += Round256(p.elems * 4);
  return total;
}

Status LayerExecutor::AllocateDevice() {
  const Model& d = model_;
  const int B = batch_, T = seq_;
  const uint64_t N = static_cast<uint64_t>(B) * T;
  const uint64_t att = d.LayerScratchElems(be_, B, T);
  const uint64_t token_floats = 2 * N;  // tokens and targets, int32 each
  const std::vector<DevicePart> parts = DeviceParts(
      d, B, T, att, {&xs_, &acts_, &head_, &dres_, &scratch_, &wbuf_, &wemb_, &gbuf_, &gemb_});
  const uint64_t g16_bytes = Round256(2 * d.MaxUnitParams());
  const uint64_t total =
      DeviceBufferBytes(d, B, T, att, partitioned_params_ ? gather16_.size() : 0);
  stats_.device_buffer_bytes = total;
  // Everything the device budget must hold at once, checked before anything is taken: the
  // buffers above, the backend's own (the CUDA backend's per-row loss gradient; its cuBLAS
  // workspace is already in the arena), and the 16-bit weights the tier manager's slots need at
  // the least (one copy of each unit size: the one in use).
  DeviceArena& arena = *rt_.arena;
  const uint64_t backend = be_.ReserveBytes(N);
  const uint64_t weights = rt_.tiers->MinimumSealBytes(SealPlan()).device_bytes;
  stats_.device_reserved_bytes = arena.bytes_in_use() + arena.BlockBytes(total) + backend;
  const uint64_t need = stats_.device_reserved_bytes + weights;
  if (need > arena.budget_bytes()) {
    return ResourceExhausted(fmt::format(
        "zinf.budgets.device_bytes: {} bytes ({}) cannot hold the executor's buffers ({} bytes, "
        "{}: activations for a micro-batch of {}x{} tokens, fp32 weights and gradients of the "
        "largest unit){} plus the 16-bit weights that must fit at once ({} bytes, {}: one copy of "
        "each unit size, the one in use); expected at least {} or a smaller model / "
        "micro-batch",
        arena.budget_bytes(), FormatBytesHuman(arena.budget_bytes()), total,
        FormatBytesHuman(total), B, T,
        arena.bytes_in_use() + backend > 0
            ? fmt::format(", the backend's buffers and workspace ({} bytes)",
                          arena.bytes_in_use() + backend)
            : std::string(),
        weights, FormatBytesHuman(weights), need));
  }
  ZINF_ASSIGN_OR_RETURN(arena_, arena.Allocate(total, "the executor's buffers"));
  auto* base = static_cast<uint8_t*>(arena_);
  d_tokens_ = reinterpret_cast<int32_t*>(base);
  d_targets_ = d_tokens_ + N;
  g16_ = base + token_floats * 4;
  uint64_t off = token_floats * 4 + g16_bytes;
  for (const DevicePart& p : parts) {
    *p.ptr = reinterpret_cast<float*>(base + off);
    off += Round256(p.elems * 4);
  }
  if (partitioned_params_) gathered_dev_ = base + off;
  ZINF_RETURN_IF_ERROR(be_.Reserve(N));  // within what was counted above
  ZINF_ASSIGN_OR_RETURN(host_io_, rt_.device->AllocatePinned(std::max<uint64_t>(12 * N, 4096)));
  return Status::Ok();
}

Status LayerExecutor::ComputeWaits(const Event& event) {
  if (!event.recorded()) return Status::Ok();
  if (be_.RunsOnCallingThread()) return rt_.device->EventSynchronize(event);
  return rt_.device->StreamWaitEvent(compute_, event);
}

Result<Event> LayerExecutor::ComputeDone() {
  if (be_.RunsOnCallingThread()) return Event();
  return rt_.device->Record(compute_);
}

kernels::DType LayerExecutor::GradType() const {
  return options_.micro_batches == 1 && !ReducesGrads() ? options_.param16_type
                                                         : kernels::DType::kF32;
}

uint64_t LayerExecutor::GradBytes(uint64_t n) const { return kernels::DTypeSize(GradType()) * n; }

}  // namespace zinf::train
