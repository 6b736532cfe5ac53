#include "src/train/executor.h"

// The layer executor's weights (init, set, get through the pipeline's slab) and optimizer step
// (the NVMe pipeline, on its own thread under the next forward, or in memory).
#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "kernels/cpu/cast.h"
#include "src/base/units.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

uint8_t* LayerExecutor::BounceBuffer() const {
  return pipeline_ != nullptr ? pipeline_->slabs()[0].data : nullptr;
}

Status LayerExecutor::WriteNvme(const offload::Extent& e, const void* src, uint64_t bytes) {
  const uint64_t padded = rt_.swap->Padded(bytes);
  uint8_t* buf = BounceBuffer();
  if (buf == nullptr || padded > pipeline_->slab_bytes()) {
    return Internal("WriteNvme: no bounce slab for this extent");
  }
  if (src != buf) std::memcpy(buf, src, bytes);
  std::memset(buf + bytes, 0, padded - bytes);
  return rt_.swap->engine().Write(rt_.swap->file(), e.offset, buf, padded);
}

Status LayerExecutor::ReadNvme(const offload::Extent& e, void* dst, uint64_t bytes) {
  const uint64_t padded = rt_.swap->Padded(bytes);
  uint8_t* buf = BounceBuffer();
  if (buf == nullptr || padded > pipeline_->slab_bytes()) {
    return Internal("ReadNvme: no bounce slab for this extent");
  }
  ZINF_RETURN_IF_ERROR(rt_.swap->engine().Read(rt_.swap->file(), e.offset, buf, padded));
  if (dst != buf) std::memcpy(dst, buf, bytes);
  return Status::Ok();
}

Status LayerExecutor::SetUnitWeights(uint32_t unit, const float* master) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  ZINF_RETURN_IF_ERROR(WaitStateHold());  // a checkpoint may still be writing the arrays
  if (unit >= model_.units()) return InvalidArgument(fmt::format("unit {} out of range", unit));
  const uint64_t n = model_.UnitParams(unit);
  // The state holds this rank's chunk of the unit (all of it but with ZeRO-1).
  const Chunk c = ChunkOf(unit);
  const float* mine = master + c.lo;
  NoteWeightsSet(unit, mine);  // before the slab (which master may be) is reused
  uint16_t* p16 = p16_staging_.data();
  if (StateOnNvme(unit)) {
    // Everything goes through the pipeline's first slab (idle between steps): the 16-bit copy
    // in its param16 part, the master weights and the zero moments from its start. Across
    // ranks a slab holds a chunk of a unit, not the unit: the unit's 16-bit copy goes to
    // p16_staging_ instead.
    uint8_t* slab = BounceBuffer();
    if (!partitioned_) {
      const auto layout = pipeline_->LayoutFor(n);
      if (layout.total > pipeline_->slab_bytes()) {
        return Internal(fmt::format("SetUnitWeights: unit {} ({} B) does not fit a slab ({} B)",
                                    unit, layout.total, pipeline_->slab_bytes()));
      }
      p16 = reinterpret_cast<uint16_t*>(slab + layout.param16);
    }
    ZINF_RETURN_IF_ERROR(kernels::CastFromF32(master, p16, options_.param16_type, n));
    // A checkpoint's extents stay untouched: the other generation takes the new state.
    ZINF_ASSIGN_OR_RETURN(const bool switched, TakeUnprotectedGeneration(unit));
    ZINF_RETURN_IF_ERROR(
        WriteNvme(StateExtent(unit, offload::kMasterState), mine, 4 * c.len));
    // A new swap file reads as zeros (io/swap_file.h): the moments need writing only once an
    // optimizer step has written them.
    if (!moments_zero_at_home_ || switched) {
      const uint64_t mb = StateBytes(unit, offload::kExpAvgState);
      std::memset(slab, 0, mb);
      ZINF_RETURN_IF_ERROR(WriteNvme(StateExtent(unit, offload::kExpAvgState), slab, mb));
      ZINF_RETURN_IF_ERROR(WriteNvme(StateExtent(unit, offload::kExpAvgSqState), slab, mb));
    }
  } else {
    ZINF_RETURN_IF_ERROR(kernels::CastFromF32(master, p16, options_.param16_type, n));
    BeginMasterWrite(unit);
    if (mine != master_[unit].data()) std::memcpy(master_[unit].data(), mine, 4 * c.len);
    std::fill(exp_avg_[unit].begin(), exp_avg_[unit].end(), 0);  // 0.0 in fp32 and bf16
    std::fill(exp_avg_sq_[unit].begin(), exp_avg_sq_[unit].end(), 0);
  }
  // ZeRO-3: this rank's chunk alone (no collective: each rank has the whole unit here).
  if (partitioned_params_) return GatherParam16(unit, p16 + c.lo);
  return Param16Changed(unit, p16);
}

Status LayerExecutor::GetUnitWeights(uint32_t unit, float* master) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  if (unit >= model_.units()) return InvalidArgument(fmt::format("unit {} out of range", unit));
  const uint64_t n = model_.UnitParams(unit);
  if (!partitioned_) {
    if (StateOnNvme(unit)) {
      return ReadNvme(StateExtent(unit, offload::kMasterState), master, 4 * n);
    }
    std::memcpy(master, master_[unit].data(), 4 * n);
    return Status::Ok();
  }
  // ZeRO-1: every rank's chunk, all-gathered (a collective: every rank calls this).
  const Chunk c = ChunkOf(unit);
  std::vector<float> all(c.per * static_cast<uint64_t>(options_.comm->world()));
  float* own = all.data() + c.lo;
  if (StateOnNvme(unit)) {
    ZINF_RETURN_IF_ERROR(ReadNvme(StateExtent(unit, offload::kMasterState), own, 4 * c.len));
  } else {
    std::memcpy(own, master_[unit].data(), 4 * c.len);
  }
  ZINF_RETURN_IF_ERROR(
      options_.comm->AllGather(own, all.data(), c.per, comm::DType::kF32).Wait());
  std::memcpy(master, all.data(), 4 * n);
  return Status::Ok();
}

Status LayerExecutor::InitWeights(uint64_t seed) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  // Across ranks (ZeRO-1 and up) a rank keeps a chunk of each unit, in memory or on NVMe, and
  // the pipeline's slabs hold a chunk: the whole unit is generated in a scratch buffer of one
  // unit (4 bytes a parameter of the largest unit, outside the budgets).
  std::vector<float> scratch(partitioned_ ? model_.MaxUnitParams() : 0);
  for (uint32_t u = 0; u < model_.units(); ++u) {
    // Otherwise generated where SetUnitWeights reads it from: no buffer outside the budgets.
    float* w = partitioned_     ? scratch.data()
               : StateOnNvme(u) ? reinterpret_cast<float*>(BounceBuffer())
                                : master_[u].data();
    if (w == master_[u].data()) BeginMasterWrite(u);
    model_.InitUnit(u, seed, w);
    ZINF_RETURN_IF_ERROR(SetUnitWeights(u, w));
  }
  return Status::Ok();
}

Result<std::vector<offload::OptimizerUnit>> LayerExecutor::StepUnits(
    std::span<const uint32_t> units, bool resolve_writes) {
  std::vector<offload::OptimizerUnit> out;
  for (uint32_t u : units) {
    offload::OptimizerUnit ou = opt_units_[u];
    if (StateOnNvme(u)) {  // else its arrays, updated in place (OptimizerUnit::in_memory)
      const auto& r = state_ext_[cur_gen_[u]][u];
      ou.master = r[offload::kMasterState];
      ou.exp_avg = r[offload::kExpAvgState];
      ou.exp_avg_sq = r[offload::kExpAvgSqState];
      if (resolve_writes) ZINF_RETURN_IF_ERROR(ResolveWrites(u, &ou));
    }
    out.push_back(ou);
  }
  return out;
}

Status LayerExecutor::ResolveWrites(uint32_t u, offload::OptimizerUnit* ou) {
  if (!StateOnNvme(u)) return Status::Ok();
  const int cur = cur_gen_[u];
  // A checkpoint names the current generation: write one it does not.
  ZINF_ASSIGN_OR_RETURN(const int target, WriteGeneration(u));
  next_gen_[u] = static_cast<uint8_t>(target);
  if (target != cur) {
    const auto& w = state_ext_[target][u];
    ou->master_out = w[offload::kMasterState];
    ou->exp_avg_out = w[offload::kExpAvgState];
    ou->exp_avg_sq_out = w[offload::kExpAvgSqState];
  }
  return Status::Ok();
}

void LayerExecutor::PrepareHashing(std::span<const uint32_t> units, offload::StepHashing* h) {
  h->compute = hash_next_step_ || options_.verify_state_reads;
  h->expected.clear();
  bool all_known = options_.verify_state_reads;
  // Units in memory are not read: the pipeline checks nothing of theirs.
  for (uint32_t u : units) all_known = all_known && (hashes_known_[u] || !StateOnNvme(u));
  if (all_known) {
    for (uint32_t u : units) h->expected.push_back(hashes_[u]);
  }
}

void LayerExecutor::StepDone(std::span<const uint32_t> units, const offload::StepHashing& h) {
  for (size_t i = 0; i < units.size(); ++i) {
    const uint32_t u = units[i];
    cur_gen_[u] = next_gen_[u];
    if (!StateOnNvme(u)) {
      hashes_known_[u] = 0;  // state in memory is hashed when a checkpoint writes it
      continue;
    }
    if (h.compute) hashes_[u] = h.written[i];
    hashes_known_[u] = h.compute;
  }
}

Status LayerExecutor::WaitStateHold() {
  if (!state_hold_.valid()) return Status::Ok();
  Status s = state_hold_.get();
  state_hold_ = {};
  return s.ok() ? s : s.WithContext("the checkpoint writing the optimizer state");
}

Status LayerExecutor::StepUnit(uint32_t u, const kernels::AdamHyper& hyper,
                               offload::OptimizerStepStats* st) {
  auto t0 = Clock::now();
  offload::TierManager& tm = *rt_.tiers;
  ZINF_RETURN_IF_ERROR(WaitStateHold());
  if (pipeline_ != nullptr) {
    moments_zero_at_home_ = false;
    const uint32_t one_unit[] = {u};
    ZINF_ASSIGN_OR_RETURN(const auto step_units, StepUnits(one_unit));
    offload::StepHashing hashing;
    PrepareHashing(one_unit, &hashing);
    BeginMasterWrite(u);  // Adam updates a master in memory in place
    ZINF_ASSIGN_OR_RETURN(offload::OptimizerStepStats one,
                          pipeline_->Step(step_units, hyper, nullptr, nullptr, &hashing));
    StepDone(one_unit, hashing);
    ZINF_RETURN_IF_ERROR(tm.Invalidate(p16_[u]));  // its home was rewritten
    st->units += one.units;
    st->adam_seconds += one.adam_seconds;
    st->read_wait_seconds += one.read_wait_seconds;
    st->bytes_read += one.bytes_read;
    st->bytes_written += one.bytes_written;
    stats_.optimizer_bytes_read += one.bytes_read;
    stats_.optimizer_bytes_written += one.bytes_written;
  } else {
    ZINF_RETURN_IF_ERROR(StepUnitInMemory(u, hyper, offload::AcquireMode::kRead, st));
    hashes_known_[u] = 0;  // state in memory is hashed when a checkpoint writes it
  }
  ZINF_RETURN_IF_ERROR(tm.Discard(grad_[u]));
  const double dt = Since(t0);
  st->seconds += dt;
  stats_.optimizer_seconds += dt;
  return Status::Ok();
}

Status LayerExecutor::StepUnitInMemory(uint32_t u, const kernels::AdamHyper& hyper,
                                       offload::AcquireMode grad_mode,
                                       offload::OptimizerStepStats* st) {
  offload::TierManager& tm = *rt_.tiers;
  const uint64_t n = model_.UnitParams(u);
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(grad_[u], Tier::kHost, grad_mode));
  auto g = lease.Wait();
  if (!g.ok()) {
    tm.Release(std::move(lease), false).IgnoreError();
    return g.status();
  }
  // New 16-bit weights homed in host memory are written there in place (no staging copy).
  const bool in_place = tm.spec(p16_[u]).home == Tier::kHost;
  BeginMasterWrite(u);  // Adam updates the master in place
  // Derived 16-bit weights are cast again from the new master when next loaded: Adam writes
  // no 16-bit copy of them (2 bytes a parameter less to store), and the old copies go.
  void* p16_out = Param16Derived(u) ? nullptr : p16_staging_.data();
  if (in_place) {
    auto home = tm.BeginHomeWrite(p16_[u]);
    if (!home.ok()) {
      tm.Release(std::move(lease), false).IgnoreError();
      return home.status();
    }
    p16_out = *home;
  }
  kernels::AdamBuffers b{master_[u].data(), *g, GradType(), exp_avg_[u].data(),
                         exp_avg_sq_[u].data(), options_.moment_type, p16_out,
                         options_.param16_type, n};
  b.stochastic_state = options_.stochastic_moments;
  b.state_seed = kernels::StateRoundingSeed(options_.rounding_seed, hyper.step, RoundingStream(u));
  b.state_index_base = ChunkOf(u).lo;
  auto a0 = Clock::now();
  auto r = kernels::AdamStep(hyper, b, options_.adam);
  st->adam_seconds += Since(a0);
  if (in_place) tm.EndHomeWrite(p16_[u]);
  ZINF_RETURN_IF_ERROR(tm.Release(std::move(lease), false));
  ZINF_RETURN_IF_ERROR(r.status());
  if (!in_place) ZINF_RETURN_IF_ERROR(Param16Changed(u, static_cast<const uint16_t*>(p16_out)));
  ++st->units;
  return Status::Ok();
}

Result<offload::OptimizerStepStats> LayerExecutor::OptimizerStep(const kernels::AdamHyper& hyper) {
  auto t0 = Clock::now();
  offload::TierManager& tm = *rt_.tiers;
  offload::OptimizerStepStats st;
  if (opt_running_ && opt_gated_ && gates_opened_ == 0) {
    // Started during the last backward (its first units' state read meanwhile): the step's
    // hyper-parameters are known now, every gradient is final.
    {
      std::lock_guard lock(opt_mu_);
      opt_hyper_ = hyper;
    }
    for (uint32_t u : opt_order_) ZINF_RETURN_IF_ERROR(OpenGate(u));
    return st;  // empty: the step's stats arrive when it finishes
  }
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  ZINF_RETURN_IF_ERROR(WaitStateHold());
  if (partitioned_params_ && pipeline_ != nullptr && options_.async_optimizer) {
    // ZeRO-3: this rank's chunks through the pipeline on its own thread, under the next
    // forward, as one rank's units: the step has no collective (each rank writes its own
    // shards home), and the forward's gather of a unit waits for its new shard.
    opt_hyper_ = hyper;
    ZINF_RETURN_IF_ERROR(StartAsyncStep(all_units_, /*gated=*/false));
    return st;  // empty: the step's stats arrive when it finishes
  }
  if (partitioned_) {
    // ZeRO-1/2 (ZeRO-3 without the pipeline or async_optimizer): each unit's chunk, then the
    // gather of its new 16-bit weights (ZeRO-3: its shard written home), in unit order on
    // every rank.
    for (uint32_t u = 0; u < model_.units(); ++u) {
      ZINF_RETURN_IF_ERROR(StepChunk(u, hyper, &st));
      ZINF_RETURN_IF_ERROR(tm.Discard(grad_[u]));
    }
    st.seconds = Since(t0);
    stats_.optimizer_seconds += st.seconds;
    stats_.adam_seconds += st.adam_seconds;
    return st;
  }
  if (pipeline_ != nullptr && options_.async_optimizer) {
    // All units through the pipeline, on its own thread, under the next forward.
    opt_hyper_ = hyper;
    ZINF_RETURN_IF_ERROR(StartAsyncStep(all_units_, /*gated=*/false));
    return st;  // empty: the step's stats arrive when it finishes
  }
  if (CanStepMemoryAsync()) {
    // Every unit's state in memory: unit by unit on the step's own thread, under the next
    // forward (which takes each unit's new weights as soon as they are written).
    opt_hyper_ = hyper;
    ZINF_RETURN_IF_ERROR(StartAsyncMemoryStep());
    return st;  // empty: the step's stats arrive when it finishes
  }
  if (pipeline_ != nullptr) {
    // All units through the pipeline at once: reads run ahead, writes behind.
    moments_zero_at_home_ = false;
    ZINF_ASSIGN_OR_RETURN(const auto step_units, StepUnits(all_units_));
    offload::StepHashing hashing;
    PrepareHashing(all_units_, &hashing);
    for (uint32_t u : all_units_) BeginMasterWrite(u);
    ZINF_ASSIGN_OR_RETURN(st, pipeline_->Step(step_units, hyper, nullptr, nullptr, &hashing));
    StepDone(all_units_, hashing);
    // The pipeline rewrote every param16 home: the cached copies are stale.
    for (auto id : p16_) ZINF_RETURN_IF_ERROR(tm.Invalidate(id));
    ZINF_RETURN_IF_ERROR(DiscardGradients());
    stats_.optimizer_seconds += Since(t0);
    stats_.optimizer_bytes_read += st.bytes_read;
    stats_.optimizer_bytes_written += st.bytes_written;
  } else {
    for (uint32_t u = 0; u < model_.units(); ++u) ZINF_RETURN_IF_ERROR(StepUnit(u, hyper, &st));
  }
  stats_.adam_seconds += st.adam_seconds;
  return st;
}

void LayerExecutor::WaitUnitWritten(uint32_t unit) {
  if (!opt_running_) return;
  auto t0 = Clock::now();
  std::unique_lock lock(opt_mu_);
  // A unit whose gate is closed (a gated step still waiting for its gradient: the backward
  // that produces it uses these weights) keeps its old weights.
  opt_cv_.wait(lock, [&] { return unit_written_[unit] != 0 || gate_open_[unit] == 0; });
  stats_.optimizer_wait_seconds += Since(t0);
}

Status LayerExecutor::StartAsyncStep(std::vector<uint32_t> order, bool gated) {
  moments_zero_at_home_ = false;
  opt_order_ = std::move(order);
  opt_gated_ = gated;
  gates_opened_ = 0;
  {
    std::lock_guard lock(opt_mu_);
    unit_written_.assign(model_.units(), 0);
    gate_open_.assign(model_.units(), gated ? 0 : 1);
    gate_outs_.assign(model_.units(), {});
    gate_abort_ = false;
  }
  // Each unit's new param16 goes into the host tier as soon as its Adam is done (when there
  // is room): the forward uses it without waiting for the NVMe write and reading it back.
  // Otherwise it is usable once its writes completed (the callback marks it; stale copies of
  // the old weights are dropped by the tier manager).
  opt_on_updated_ = [this](size_t i, const void* param16) {
    const uint32_t u = opt_order_[i];
    if (partitioned_params_) {
      // ZeRO-3: the shard is this rank's chunk padded with zeros to `per` values (gather16_
      // is the step's own while it runs: nothing else gathers meanwhile).
      const Chunk c = ChunkOf(u);
      uint16_t* own = gather16_.data() + c.lo;
      std::memcpy(own, param16, Param16Bytes(c.len));
      std::fill(own + c.len, own + c.per, uint16_t{0});
      param16 = own;
    }
    auto installed = rt_.tiers->InstallPending(p16_[u], param16);
    if (!installed.ok() || !*installed) return;  // the forward waits for the write instead
    std::lock_guard lock(opt_mu_);
    unit_written_[u] = 1;
    opt_cv_.notify_all();
  };
  opt_on_written_ = [this](size_t i) {
    const uint32_t u = opt_order_[i];
    rt_.tiers->HomeRewritten(p16_[u]);  // ends an installed copy's hold, else drops old ones
    std::lock_guard lock(opt_mu_);
    unit_written_[u] = 1;
    opt_cv_.notify_all();
  };
  opt_gate_ = [this](size_t i, std::array<offload::Extent, offload::kStateRoles>* out) -> Status {
    const uint32_t u = opt_order_[i];
    std::unique_lock lock(opt_mu_);
    opt_cv_.wait(lock, [&] { return gate_open_[u] != 0 || gate_abort_; });
    if (gate_open_[u] != 0) {
      *out = gate_outs_[u];  // the generation OpenGate chose
      return Status::Ok();
    }
    return Aborted(fmt::format("the optimizer step of {} was stopped before its Adam: its "
                               "gradients were never final (the backward or the step that "
                               "produces them failed or was skipped)",
                               model_.UnitName(u)));
  };
  // The prefetcher leaves the 16-bit weights alone until each unit's new ones are known
  // (installed or written): reading the old ones now would be wasted, and would keep the
  // install out. A gated step's units are still used by backward: each is left alone from
  // its gate on, and its writes are placed then (after the hold of a checkpoint being
  // committed, which may release the generation they go to).
  ZINF_ASSIGN_OR_RETURN(opt_step_units_, StepUnits(opt_order_, /*resolve_writes=*/!gated));
  if (!gated) {
    for (uint32_t u : opt_order_) rt_.tiers->BeginRewrite(p16_[u]);
  }
  PrepareHashing(opt_order_, &opt_hashing_);
  opt_running_ = true;
  opt_future_ = std::async(std::launch::async,
                           [this, gated]() -> Result<offload::OptimizerStepStats> {
    auto r = pipeline_->Step(opt_step_units_, opt_hyper_, &opt_on_written_, &opt_on_updated_,
                             &opt_hashing_, gated ? &opt_gate_ : nullptr);
    if (!r.ok()) {
      std::vector<char> began;  // the units whose rewrite began (BeginRewrite)
      {
        std::lock_guard lock(opt_mu_);
        began = gate_open_;
      }
      for (uint32_t u : opt_order_) {
        if (began[u] == 0) continue;
        // Derived weights: the master may hold the new weights already, and the copies cast
        // before the step must go (an installed copy was cast from the new master).
        if (Param16Derived(u)) rt_.tiers->HomeRewritten(p16_[u]);
        else rt_.tiers->EndPending(p16_[u], false);  // not known to be home
      }
    }
    std::lock_guard lock(opt_mu_);
    std::fill(unit_written_.begin(), unit_written_.end(), 1);  // nobody waits forever
    opt_cv_.notify_all();
    return r;
  });
  return Status::Ok();
}

bool LayerExecutor::CanStepMemoryAsync() const {
  if (pipeline_ != nullptr || !options_.async_optimizer || partitioned_) return false;
  for (uint32_t u = 0; u < model_.units(); ++u) {
    // The new 16-bit weights go home in place, or (derived) the old copies are dropped.
    if (StateOnNvme(u) || (rt_.tiers->spec(p16_[u]).home != Tier::kHost && !Param16Derived(u))) {
      return false;
    }
  }
  return true;
}

Status LayerExecutor::StartAsyncMemoryStep() {
  opt_order_ = all_units_;
  opt_gated_ = false;
  gates_opened_ = 0;
  {
    std::lock_guard lock(opt_mu_);
    unit_written_.assign(model_.units(), 0);
    gate_open_.assign(model_.units(), 1);
    gate_abort_ = false;
  }
  // The prefetcher leaves the old weights alone: each unit's new ones replace them in place.
  for (uint32_t u : opt_order_) rt_.tiers->BeginRewrite(p16_[u]);
  opt_hashing_ = {};
  PrepareHashing(opt_order_, &opt_hashing_);
  opt_running_ = true;
  opt_future_ = std::async(std::launch::async, [this]() -> Result<offload::OptimizerStepStats> {
    offload::OptimizerStepStats st;
    auto t0 = Clock::now();
    // However this thread ends (an exception too), no unit is left for the forward to wait on.
    struct MarkAllWritten {
      LayerExecutor* ex;
      ~MarkAllWritten() {
        std::lock_guard lock(ex->opt_mu_);
        std::fill(ex->unit_written_.begin(), ex->unit_written_.end(), 1);
        ex->opt_cv_.notify_all();
      }
    } mark_all{this};
    // No device call is expected here (the forward waits for each unit before loading it), but
    // a device load started meanwhile would begin from EndHomeWrite on this thread.
    Status s = rt_.device->BindCurrentThread();
    for (uint32_t u : opt_order_) {
      // The gradients are read beside the forward's own accesses: not in its traced order.
      if (s.ok()) s = StepUnitInMemory(u, opt_hyper_, offload::AcquireMode::kReadUntraced, &st);
      rt_.tiers->HomeRewritten(p16_[u]);  // the prefetcher may load it again
      std::lock_guard lock(opt_mu_);
      unit_written_[u] = 1;  // also after a failure: nobody waits forever
      opt_cv_.notify_all();
    }
    st.seconds = Since(t0);
    if (!s.ok()) return s;
    return st;
  });
  return Status::Ok();
}

Status LayerExecutor::OpenGate(uint32_t unit) {
  // The first Adam of the step waits for a checkpoint's commit that reads the state in memory
  // and names the NVMe generation in use; then this unit's writes find their generation.
  if (gates_opened_ == 0) ZINF_RETURN_IF_ERROR(WaitStateHold());
  offload::OptimizerUnit resolved;  // the pipeline's own copy of the unit is not touched
  ZINF_RETURN_IF_ERROR(ResolveWrites(unit, &resolved));
  rt_.tiers->BeginRewrite(p16_[unit]);  // backward is done with the old weights
  ++gates_opened_;
  std::lock_guard lock(opt_mu_);
  gate_outs_[unit] = {resolved.master_out, resolved.exp_avg_out, resolved.exp_avg_sq_out};
  gate_open_[unit] = 1;
  opt_cv_.notify_all();
  return Status::Ok();
}

bool LayerExecutor::AbortGatedStep() {
  {
    std::lock_guard lock(opt_mu_);
    gate_abort_ = true;
    opt_cv_.notify_all();
  }
  return gates_opened_ == 0;
}

Status LayerExecutor::FinishOptimizerStep() {
  if (!opt_running_) return Status::Ok();
  auto t0 = Clock::now();
  // A gated step whose gates are not all open never gets them now (a skipped step, an
  // evaluation before it, a failed backward): stopped. With none open nothing was written and
  // the step is undone: the state is as before it, the gradients untouched.
  const bool undone = opt_gated_ && gates_opened_ < opt_order_.size() && AbortGatedStep();
  opt_running_ = false;
  opt_gated_ = false;
  Result<offload::OptimizerStepStats> r = opt_future_.get();
  stats_.optimizer_wait_seconds += Since(t0);
  if (undone && (r.ok() || r.status().code() == StatusCode::kAborted)) {
    if (pending_checkpoint_) {
      std::exchange(pending_checkpoint_, nullptr)(TakeCheckpointState(pending_checkpoint_id_));
    }
    return Status::Ok();
  }
  if (!r.ok() && pending_checkpoint_) std::exchange(pending_checkpoint_, nullptr)(r.status());
  ZINF_RETURN_IF_ERROR(r.status());
  StepDone(opt_order_, opt_hashing_);
  if (pending_checkpoint_) {
    std::exchange(pending_checkpoint_, nullptr)(TakeCheckpointState(pending_checkpoint_id_));
  }
  // Copies fetched while the step ran were dropped unit by unit (HomeRewritten); the
  // gradients are consumed.
  ZINF_RETURN_IF_ERROR(DiscardGradients());
  stats_.optimizer_seconds += r->seconds;
  stats_.adam_seconds += r->adam_seconds;
  stats_.optimizer_bytes_read += r->bytes_read;
  stats_.optimizer_bytes_written += r->bytes_written;
  return Status::Ok();
}

Status LayerExecutor::DiscardGradients() {
  // A step prepared during the backward (gated) must not lease what is discarded: stopped.
  if (opt_running_ && opt_gated_) ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  for (auto id : grad_) ZINF_RETURN_IF_ERROR(rt_.tiers->Discard(id));
  return Status::Ok();
}

void LayerExecutor::EndStep() {
  rt_.tiers->EndStep();
  hash_next_step_ = false;
}

}  // namespace zinf::train
