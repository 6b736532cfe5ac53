#include "src/train/executor.h"

// The layer executor across ranks (ExecutorOptions::comm): each unit's accumulated gradient
// all-reduced in its host copy before the unit's optimizer step.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/adam.h"
#include "kernels/cpu/grad_ops.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

bool LayerExecutor::ReducesGrads() const {
  return options_.comm != nullptr && options_.comm->world() > 1;
}

Result<bool> LayerExecutor::ReduceUnitGrad(uint32_t unit, double* sum_squares) {
  offload::TierManager& tm = *rt_.tiers;
  const uint64_t n = model_.UnitParams(unit);
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(grad_[unit], Tier::kHost));
  auto g = lease.Wait();
  if (!g.ok()) {
    tm.Release(std::move(lease), false).IgnoreError();
    return g.status();
  }
  auto* v = static_cast<float*>(*g);
  const auto t0 = Clock::now();
  // Stage 0: every rank gets the whole sum. ZeRO-1: each rank gets the sum of its own chunk,
  // in place (the shard is padded to world chunks); the rest of the copy is left as it was.
  const Chunk chunk = ChunkOf(unit);
  const auto kind = static_cast<size_t>(partitioned_ ? comm::OpKind::kReduceScatter
                                                     : comm::OpKind::kAllReduce);
  const uint64_t sent0 = options_.comm->stats().bytes_sent[kind];
  Status s = partitioned_
                 ? options_.comm
                       ->ReduceScatter(v, comm::DType::kF32, v + chunk.lo, comm::DType::kF32,
                                       chunk.per)
                       .Wait()
                 : options_.comm->AllReduce(v, comm::DType::kF32, v, comm::DType::kF32, n).Wait();
  stats_.grad_comm_sent_bytes += options_.comm->stats().bytes_sent[kind] - sent0;
  // The chunk is the whole unit when the state is replicated (ChunkOf).
  if (s.ok()) s = AllReduceOverReplicas(v + chunk.lo, chunk.len, &stats_.grad_comm_sent_bytes);
  stats_.comm_seconds += Since(t0);
  if (!s.ok()) {
    // The copy holds a partial sum now: dirty (so it is never taken for its home's value) and
    // discarded with the step.
    tm.Release(std::move(lease), true).IgnoreError();
    return s.WithContext(fmt::format("all-reducing the gradients of {}", model_.UnitName(unit)));
  }
  // The same bits on every rank, so the same Σ g² (summed as the accumulator sums a shard's)
  // and the same verdict: a float's square never overflows a double, so the sum is finite
  // exactly when every value is.
  const double ss = partitioned_ ? kernels::cpu::SumSquares(v + chunk.lo, chunk.len)
                                 : kernels::cpu::SumSquares(v, n);
  const bool finite = std::isfinite(ss);
  *sum_squares += ss;
  ZINF_RETURN_IF_ERROR(tm.Release(std::move(lease), true));
  return finite;
}

Status LayerExecutor::AllReduceOverReplicas(float* v, uint64_t n, uint64_t* sent) {
  comm::Communicator* r = options_.replica_comm;
  if (r == nullptr || r->world() == 1 || n == 0) return Status::Ok();
  const auto kind = static_cast<size_t>(comm::OpKind::kAllReduce);
  const uint64_t sent0 = r->stats().bytes_sent[kind];
  Status s = r->AllReduce(v, comm::DType::kF32, v, comm::DType::kF32, n)
                 .Wait()
                 .WithContext("all-reducing a gradient over the nodes (HYBRID_SHARD)");
  *sent += r->stats().bytes_sent[kind] - sent0;
  return s;
}

Result<bool> LayerExecutor::ReduceAllGrads() {
  double ss = 0;
  bool finite = true;
  // Backward order (the head, the blocks from the last, the embedding), as the hand-overs ran.
  const uint32_t fin = model_.final_unit();
  ZINF_ASSIGN_OR_RETURN(bool f, ReduceUnitGrad(fin, &ss));
  finite = finite && f;
  for (int l = model_.layers() - 1; l >= 0; --l) {
    ZINF_ASSIGN_OR_RETURN(f, ReduceUnitGrad(static_cast<uint32_t>(l + 1), &ss));
    finite = finite && f;
  }
  ZINF_ASSIGN_OR_RETURN(f, ReduceUnitGrad(0, &ss));
  finite = finite && f;
  if (partitioned_) {
    ZINF_ASSIGN_OR_RETURN(ss, SumOverRanks(ss));
    finite = std::isfinite(ss);
  }
  grad_sum_squares_ = ss;
  return finite;
}

Result<bool> LayerExecutor::AllRanksFinite(bool mine) {
  int32_t in = mine ? 0 : 1, out = 0;
  ZINF_RETURN_IF_ERROR(
      options_.comm->AllReduce(&in, comm::DType::kI32, &out, comm::DType::kI32, 1).Wait());
  return out == 0;
}

Status LayerExecutor::StepChunkNow(uint32_t u, const kernels::AdamHyper& hyper,
                                   offload::OptimizerStepStats* st) {
  const auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(WaitStateHold());
  ZINF_RETURN_IF_ERROR(StepChunk(u, hyper, st));
  ZINF_RETURN_IF_ERROR(rt_.tiers->Discard(grad_[u]));
  const double dt = Since(t0);
  st->seconds += dt;
  stats_.optimizer_seconds += dt;
  return Status::Ok();
}

Result<double> LayerExecutor::SumOverRanks(double partial) {
  // Each rank summed its chunks: the step's Σ g² is the rank-ordered sum of the ranks' (the
  // same double on every rank; it differs from one rank's sum over whole units in the last
  // bits, and so does the clipping coefficient computed from it).
  partial_sum_squares_.resize(static_cast<size_t>(options_.comm->world()));
  ZINF_RETURN_IF_ERROR(
      options_.comm->AllGather(&partial, partial_sum_squares_.data(), 1, comm::DType::kF64)
          .Wait());
  double total = 0;
  for (double p : partial_sum_squares_) total += p;
  return total;
}

Status LayerExecutor::GatherParam16(uint32_t unit, const void* chunk16) {
  const Chunk c = ChunkOf(unit);
  uint16_t* own = gather16_.data() + c.lo;  // lo = rank * per (every chunk is non-empty)
  if (chunk16 != own) std::memmove(own, chunk16, 2 * c.len);
  if (partitioned_params_) {
    // ZeRO-3: the shard is the chunk, padded with zeros to `per` values.
    std::fill(own + c.len, own + c.per, uint16_t{0});
    return rt_.tiers->WriteHome(p16_[unit], own);
  }
  const auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(
      options_.comm->AllGather(own, gather16_.data(), c.per, comm::DType::kBf16).Wait()
          .WithContext(fmt::format("all-gathering the new weights of {}", model_.UnitName(unit))));
  stats_.comm_seconds += Since(t0);
  return rt_.tiers->WriteHome(p16_[unit], gather16_.data());
}

Status LayerExecutor::StepChunk(uint32_t u, const kernels::AdamHyper& hyper,
                                offload::OptimizerStepStats* st) {
  offload::TierManager& tm = *rt_.tiers;
  const Chunk c = ChunkOf(u);
  // The reduce-scattered gradient of this rank's chunk, in the unit's gradient copy.
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(grad_[u], Tier::kHost));
  auto g = lease.Wait();
  if (!g.ok()) {
    tm.Release(std::move(lease), false).IgnoreError();
    return g.status();
  }
  // ZeRO-2: the shard is the chunk; ZeRO-1: the chunk lies at its place in the unit's shard.
  const float* grad = static_cast<const float*>(*g) + (partitioned_grads_ ? 0 : c.lo);
  Status s;
  if (pipeline_ != nullptr) {
    moments_zero_at_home_ = false;
    const uint32_t one_unit[] = {u};
    auto step_units = StepUnits(one_unit);
    if (!step_units.ok()) {
      tm.Release(std::move(lease), false).IgnoreError();
      return step_units.status();
    }
    (*step_units)[0].grad = grad;
    (*step_units)[0].grad_shard.reset();
    (*step_units)[0].param16 = {};  // ZeRO-3: GatherParam16 writes the padded shard home
    (*step_units)[0].param16_to_caller = true;
    offload::StepHashing hashing;
    PrepareHashing(one_unit, &hashing);
    // The chunk's new 16-bit weights, kept for the gather (the pipeline writes none home).
    offload::OptimizerPipeline::UpdatedFn keep = [&](size_t, const void* p16) {
      std::memcpy(gather16_.data() + c.lo, p16, 2 * c.len);
    };
    auto one = pipeline_->Step(*step_units, hyper, nullptr, &keep, &hashing);
    s = one.status();
    if (s.ok()) {
      StepDone(one_unit, hashing);
      st->units += one->units;
      st->adam_seconds += one->adam_seconds;
      st->read_wait_seconds += one->read_wait_seconds;
      st->bytes_read += one->bytes_read;
      st->bytes_written += one->bytes_written;
      stats_.optimizer_bytes_read += one->bytes_read;
      stats_.optimizer_bytes_written += one->bytes_written;
    }
  } else {
    kernels::AdamBuffers b{master_[u].data(), grad, kernels::DType::kF32, exp_avg_[u].data(),
                           exp_avg_sq_[u].data(), options_.moment_type,
                           gather16_.data() + c.lo, options_.param16_type, c.len};
    b.stochastic_state = options_.stochastic_moments;
    b.state_seed = kernels::StateRoundingSeed(options_.rounding_seed, hyper.step, RoundingStream(u));
    b.state_index_base = ChunkOf(u).lo;
    auto a0 = Clock::now();
    s = kernels::AdamStep(hyper, b, options_.adam).status();
    st->adam_seconds += Since(a0);
    hashes_known_[u] = 0;
    if (s.ok()) ++st->units;
  }
  ZINF_RETURN_IF_ERROR(tm.Release(std::move(lease), false));
  ZINF_RETURN_IF_ERROR(s);
  return GatherParam16(u, gather16_.data() + c.lo);
}

Status LayerExecutor::IssueGather(uint32_t unit) {
  offload::TierManager& tm = *rt_.tiers;
  WaitUnitWritten(unit);  // the optimizer step under this forward has its new shard
  const int b = next_gather_buffer_;
  next_gather_buffer_ ^= 1;
  // The buffer is free once the copy of the unit gathered into it before is done.
  if (gathered_copied_[b].recorded()) {
    ZINF_RETURN_IF_ERROR(rt_.device->EventSynchronize(gathered_copied_[b]));
    gathered_copied_[b] = Event();
  }
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(p16_[unit], Tier::kHost));
  auto own = lease.Wait();
  if (!own.ok()) {
    tm.Release(std::move(lease), false).IgnoreError();
    return own.status();
  }
  pending_gather_.active = true;
  pending_gather_.unit = unit;
  pending_gather_.buffer = b;
  pending_gather_.lease = std::move(lease);
  pending_gather_.work = options_.comm->AllGather(*own, gathered_host_[b].data, ChunkOf(unit).per,
                                                  comm::DType::kBf16);
  return Status::Ok();
}

Status LayerExecutor::DropGather() {
  if (!pending_gather_.active) return Status::Ok();
  pending_gather_.active = false;
  Status s = pending_gather_.work.Wait();
  Status r = rt_.tiers->Release(std::move(pending_gather_.lease), false);
  ZINF_RETURN_IF_ERROR(s);
  return r;
}

Status LayerExecutor::FetchGathered(uint32_t unit, float* dst, int next) {
  Device& dev = *rt_.device;
  const uint64_t n = model_.UnitParams(unit);
  const auto t0 = Clock::now();
  // A gather started for another unit (a pass that ended early: evaluation, the profile) is
  // finished on every rank alike and dropped.
  if (pending_gather_.active && pending_gather_.unit != unit) ZINF_RETURN_IF_ERROR(DropGather());
  if (!pending_gather_.active) ZINF_RETURN_IF_ERROR(IssueGather(unit));
  const int b = pending_gather_.buffer;
  pending_gather_.active = false;
  Status s = pending_gather_.work.Wait().WithContext(
      fmt::format("all-gathering the weights of {} (ZeRO-3)", model_.UnitName(unit)));
  const double waited = Since(t0);
  stats_.comm_seconds += waited;
  ZINF_RETURN_IF_ERROR(rt_.tiers->Release(std::move(pending_gather_.lease), false));
  ZINF_RETURN_IF_ERROR(s);
  // The copy runs on its own stream once the unit before has been widened out of the device
  // buffer; on a GPU it overlaps that unit's kernels, and the compute stream waits for it. The
  // CPU backend computes on this thread: it waits here.
  if (gathered_widened_.recorded()) {
    ZINF_RETURN_IF_ERROR(dev.StreamWaitEvent(gather_copy_, gathered_widened_));
  }
  ZINF_RETURN_IF_ERROR(dev.CopyToDevice(gather_copy_, gathered_dev_, gathered_host_[b].data,
                                        Param16Bytes(n)));
  stats_.gathered_h2d_bytes += Param16Bytes(n);
  ZINF_ASSIGN_OR_RETURN(gathered_copied_[b], dev.Record(gather_copy_));
  ZINF_RETURN_IF_ERROR(ComputeWaits(gathered_copied_[b]));
  stats_.stall_seconds += Since(t0);
  ZINF_RETURN_IF_ERROR(be_.Widen(dst, gathered_dev_, options_.param16_type, n));
  ZINF_ASSIGN_OR_RETURN(gathered_widened_, ComputeDone());
  // The next unit's gather runs under this one's compute.
  if (next >= 0) ZINF_RETURN_IF_ERROR(IssueGather(static_cast<uint32_t>(next)));
  return Status::Ok();
}

}  // namespace zinf::train
