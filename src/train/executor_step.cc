#include "src/train/executor.h"

// The layer executor's step: fetching weights, forward, backward and the gradient hand-over.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "kernels/cpu/cast.h"
#include "src/base/units.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

Status LayerExecutor::FetchWeights(uint32_t unit, float* dst, int next) {
  offload::TierManager& tm = *rt_.tiers;
  WaitUnitWritten(unit);
  if (partitioned_params_) return FetchGathered(unit, dst, next);
  auto t0 = Clock::now();
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(p16_[unit], Tier::kDevice));
  // No host wait for the copy itself: the widening waits for the h2d on the compute stream (the
  // CPU backend, which computes on this thread, waits here).
  auto ready = lease.WaitEnqueued();
  Status s = ready.status();
  if (s.ok()) s = ComputeWaits(ready->event);
  stats_.stall_seconds += Since(t0);
  if (s.ok()) s = be_.Widen(dst, ready->ptr, options_.param16_type, model_.UnitParams(unit));
  // The copy may be evicted once the widening has read it: its event goes with the release.
  Result<Event> used = s.ok() ? ComputeDone() : Result<Event>(s);
  if (!used.ok()) s = used.status();
  Status r = tm.Release(std::move(lease), false, used.ok() ? *used : Event());
  ZINF_RETURN_IF_ERROR(s);
  return r;
}

Status LayerExecutor::Upload(const int32_t* tokens, const int32_t* targets) {
  const uint64_t N = static_cast<uint64_t>(batch_) * seq_;
  const int32_t V = model_.vocab();
  for (uint64_t i = 0; i < N; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V) {
      return InvalidArgument(fmt::format("token {} at position {} is outside the vocabulary 0..{}",
                                         tokens[i] < 0 || tokens[i] >= V ? tokens[i] : targets[i],
                                         i, V - 1));
    }
  }
  ZINF_RETURN_IF_ERROR(rt_.device->BindCurrentThread());
  // host_io_ is free: the previous micro-batch's loss read-back synchronized the stream.
  auto* h = static_cast<int32_t*>(host_io_);
  std::memcpy(h, tokens, 4 * N);
  std::memcpy(h + N, targets, 4 * N);
  ZINF_RETURN_IF_ERROR(rt_.device->CopyToDevice(compute_, d_tokens_, h, 8 * N));
  // The CUDA backend's kernels follow the copy on its stream; the CPU backend waits here.
  ZINF_ASSIGN_OR_RETURN(Event uploaded, rt_.device->Record(compute_));
  return ComputeWaits(be_.RunsOnCallingThread() ? uploaded : Event());
}

Result<double> LayerExecutor::ForwardAll(bool backward_follows) {
  const Model& d = model_;
  const int B = batch_, T = seq_, L = d.layers();
  const uint64_t NC = static_cast<uint64_t>(B) * T * d.width();
  const int fin = static_cast<int>(d.final_unit());
  ZINF_RETURN_IF_ERROR(FetchWeights(0, wemb_, L > 0 ? 1 : fin));
  auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(d.EmbeddingForward<float>(be_, wemb_, d_tokens_, xs_, B, T));
  stats_.compute_seconds += Since(t0);
  for (int l = 0; l < L; ++l) {
    ZINF_RETURN_IF_ERROR(FetchWeights(l + 1, wbuf_, l + 1 < L ? l + 2 : fin));
    t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(d.LayerForward<float>(be_, wbuf_, xs_ + NC * l, xs_ + NC * (l + 1),
                                               acts_, scratch_, B, T));
    stats_.compute_seconds += Since(t0);  // the time to enqueue it on a GPU
  }
  // Backward starts with the last block.
  ZINF_RETURN_IF_ERROR(FetchWeights(d.final_unit(), wbuf_, backward_follows && L > 0 ? L : -1));
  t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(d.HeadForward<float>(be_, wbuf_, wemb_, xs_ + NC * L, d_targets_, head_,
                                            B, T));
  // The mean loss, summed on the host in a fixed order.
  const uint64_t N = static_cast<uint64_t>(B) * T;
  float* losses = reinterpret_cast<float*>(static_cast<int32_t*>(host_io_) + 2 * N);
  ZINF_RETURN_IF_ERROR(be_.Synchronize());
  ZINF_RETURN_IF_ERROR(
      rt_.device->CopyToHost(compute_, losses, d.HeadLosses(head_, B, T), 4 * N));
  ZINF_RETURN_IF_ERROR(rt_.device->StreamSynchronize(compute_));
  stats_.compute_seconds += Since(t0);
  double sum = 0;
  for (uint64_t i = 0; i < N; ++i) sum += losses[i];
  return sum / static_cast<double>(N);
}

Status LayerExecutor::HandOverGrad(uint32_t unit, const float* grad, float scale, bool first,
                                   bool last) {
  auto t0 = Clock::now();
  const uint64_t n = model_.UnitParams(unit);
  // The buffer is reused once the copy of the previous unit's gradient has read it.
  ZINF_RETURN_IF_ERROR(ComputeWaits(g16_free_));
  ZINF_RETURN_IF_ERROR(be_.Narrow(g16_, grad, options_.param16_type, n));
  ZINF_ASSIGN_OR_RETURN(Event produced, ComputeDone());
  ZINF_ASSIGN_OR_RETURN(g16_free_,
                        accumulator_->Submit({.shard = grad_[unit], .device_grad = g16_,
                                              .type = options_.param16_type, .n = n,
                                              .scale = scale, .first = first,
                                              .sum_squares = last, .produced = produced,
                                              .reduce = partitioned_grads_ ? &reduce_fn_
                                                                           : nullptr,
                                              .out_n = partitioned_grads_ ? ChunkOf(unit).per
                                                                          : 0}));
  stats_.grad_seconds += Since(t0);
  return Status::Ok();
}

Status LayerExecutor::FinishBackward(bool last, const kernels::AdamHyper* overlap,
                                     double reduced_sum_squares, MicroBatchResult* r) {
  // Every hand-over done: whether all gradients were finite, and the step's Σ g² (summed in
  // backward order, as the hand-overs ran).
  auto t_wait = Clock::now();
  ZINF_ASSIGN_OR_RETURN(auto totals, accumulator_->Finish());
  stats_.grad_seconds += Since(t_wait);
  r->finite = totals.finite;
  if (last) grad_sum_squares_ = totals.sum_squares;
  if (partitioned_grads_) {
    // The accumulator's thread counted its reduce-scatters: add what is new since last time.
    const uint64_t nanos = reduce_nanos_.load();
    stats_.comm_seconds += static_cast<double>(nanos - reduce_nanos_seen_) * 1e-9;
    reduce_nanos_seen_ = nanos;
    stats_.grad_comm_sent_bytes = reduce_sent_bytes_.load();
  }
  if (last && ReducesGrads()) {
    // Across ranks the step's gradient is the sum over them: its Σ g² and finiteness decide.
    if (overlap != nullptr) {
      // ZeRO-2/3: the accumulator summed this rank's chunks; ZeRO-1: ReduceUnitGrad did. Across
      // partitioned ranks the step's Σ g² is the ranks' partial sums added.
      grad_sum_squares_ = partitioned_grads_ ? totals.sum_squares : reduced_sum_squares;
      if (partitioned_) {
        ZINF_ASSIGN_OR_RETURN(grad_sum_squares_, SumOverRanks(grad_sum_squares_));
      }
    } else if (partitioned_grads_) {
      // ZeRO-2: already summed, chunk by chunk; each rank's Σ g² is of its chunks.
      ZINF_ASSIGN_OR_RETURN(grad_sum_squares_, SumOverRanks(totals.sum_squares));
      r->finite = std::isfinite(grad_sum_squares_);
    } else {
      ZINF_ASSIGN_OR_RETURN(r->finite, ReduceAllGrads());
    }
  }
  return Status::Ok();
}

Result<bool> LayerExecutor::StartGatedStep(bool last, const kernels::AdamHyper* overlap) {
  const bool gated = last && pipeline_ != nullptr && options_.async_optimizer && !partitioned_;
  if (!gated) return false;
  std::vector<uint32_t> order = all_units_;
  if (overlap != nullptr) {
    std::reverse(order.begin(), order.end());
    opt_hyper_ = *overlap;
  }
  ZINF_RETURN_IF_ERROR(StartAsyncStep(std::move(order), /*gated=*/true));
  return true;
}

Result<MicroBatchResult> LayerExecutor::ForwardBackward(const int32_t* tokens,
                                                        const int32_t* targets, float loss_scale,
                                                        float accumulate_scale, bool first,
                                                        bool last,
                                                        const kernels::AdamHyper* overlap) {
  if (overlap != nullptr && !last) {
    return InvalidArgument("ForwardBackward: the optimizer overlaps only the last micro-batch");
  }
  if (options_.micro_batches == 1 && !(first && last)) {
    return InvalidArgument("ForwardBackward: an executor made for one micro-batch a step "
                           "(ExecutorOptions::micro_batches) takes first and last together");
  }
  const Model& d = model_;
  const int B = batch_, T = seq_, L = d.layers();
  const uint64_t NC = static_cast<uint64_t>(B) * T * d.width();
  ZINF_RETURN_IF_ERROR(Upload(tokens, targets));
  MicroBatchResult r;
  ZINF_ASSIGN_OR_RETURN(r.loss, ForwardAll(/*backward_follows=*/true));
  // The previous optimizer step has read its gradients before the shards are overwritten.
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  // With the state on NVMe the last micro-batch's backward starts this step's optimizer
  // pipeline, gated: its first units' state is read while backward computes. With overlap
  // it takes the units in backward order, each unit's Adam as soon as its gradient is final
  // (on the pipeline's thread, its reads and writes beside backward); without, in unit order,
  // its Adam once OptimizerStep gives the step's clipping coefficient.
  ZINF_ASSIGN_OR_RETURN(const bool gated, StartGatedStep(last, overlap));
  // A backward that fails stops the gated step at the first unit whose gradient is not final.
  struct StopGated {
    LayerExecutor* ex;
    bool armed;
    ~StopGated() {
      if (armed) ex->AbortGatedStep();
    }
  } stop_gated{this, gated};

  // With overlap, a unit whose gradients are final is updated right after the next unit's
  // backward is enqueued (on a GPU the two then run at once).
  int64_t pending = -1;
  double reduced_sum_squares = 0;  // across ranks with overlap: Σ g² of the sums so far
  auto hand_over = [&](uint32_t unit, const float* grad) -> Status {
    ZINF_RETURN_IF_ERROR(HandOverGrad(unit, grad, accumulate_scale, first, last));
    if (overlap != nullptr) pending = unit;
    return Status::Ok();
  };
  auto step_pending = [&]() -> Status {
    if (pending < 0) return Status::Ok();
    const auto unit = static_cast<uint32_t>(pending);
    pending = -1;
    // The unit's gradients are final (its hand-over done) and finite before it is updated;
    // across ranks, summed over them first (every rank reduces the units in the same order).
    ZINF_ASSIGN_OR_RETURN(auto so_far, accumulator_->WaitIdle());
    if (ReducesGrads() && !partitioned_grads_) {
      ZINF_ASSIGN_OR_RETURN(so_far.finite, ReduceUnitGrad(unit, &reduced_sum_squares));
    }
    if (partitioned_) {
      // Each rank saw its own chunk: every rank steps the unit, or none does.
      ZINF_ASSIGN_OR_RETURN(so_far.finite, AllRanksFinite(so_far.finite));
    }
    if (!so_far.finite) {
      return Aborted(fmt::format("non-finite gradients in {} with zinf.overlap_adam: the units "
                                 "after it in backward order are already updated",
                                 d.UnitName(unit)));
    }
    if (gated) return OpenGate(unit);  // the pipeline's thread updates it
    if (partitioned_) return StepChunkNow(unit, *overlap, &r.optimizer);
    return StepUnit(unit, *overlap, &r.optimizer);
  };

  const uint32_t fin = d.final_unit();
  // Head: the final unit's weights are still in wbuf_ from the forward; the embedding's in wemb_.
  auto t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(be_.Zero(gemb_, d.UnitParams(0)));
  ZINF_RETURN_IF_ERROR(be_.Zero(gbuf_, d.UnitParams(fin)));
  ZINF_RETURN_IF_ERROR(d.HeadBackward<float>(be_, wbuf_, gbuf_, wemb_, gemb_, xs_ + NC * L,
                                             d_targets_, head_, dres_, loss_scale, B, T));
  stats_.compute_seconds += Since(t0);
  ZINF_RETURN_IF_ERROR(hand_over(fin, gbuf_));
  for (int l = L - 1; l >= 0; --l) {
    if (partitioned_params_) {
      // ZeRO-3: the all-gather below and the accumulator thread's reduce-scatter of the unit
      // just handed over must reach the communicator in the same order on every rank: the
      // reduce-scatter is issued first (it then runs under this unit's compute; only its
      // gradient's copy from the device is waited for).
      auto w0 = Clock::now();
      ZINF_RETURN_IF_ERROR(accumulator_->WaitIssued());
      stats_.grad_seconds += Since(w0);
    }
    ZINF_RETURN_IF_ERROR(FetchWeights(l + 1, wbuf_, l >= 1 ? l : -1));
    t0 = Clock::now();
    // Recompute the block's activations from its checkpointed input (the output lands in the
    // next block's input slot, no longer needed), then its backward.
    ZINF_RETURN_IF_ERROR(d.LayerForward<float>(be_, wbuf_, xs_ + NC * l, xs_ + NC * (l + 1),
                                               acts_, scratch_, B, T));
    ZINF_RETURN_IF_ERROR(be_.Zero(gbuf_, d.UnitParams(l + 1)));
    ZINF_RETURN_IF_ERROR(d.LayerBackward<float>(be_, wbuf_, gbuf_, xs_ + NC * l, acts_, dres_,
                                                scratch_, B, T));
    stats_.compute_seconds += Since(t0);
    ZINF_RETURN_IF_ERROR(step_pending());
    ZINF_RETURN_IF_ERROR(hand_over(l + 1, gbuf_));
  }
  t0 = Clock::now();
  ZINF_RETURN_IF_ERROR(d.EmbeddingBackward<float>(be_, gemb_, d_tokens_, dres_, B, T));
  stats_.compute_seconds += Since(t0);
  ZINF_RETURN_IF_ERROR(step_pending());
  ZINF_RETURN_IF_ERROR(hand_over(0, gemb_));
  ZINF_RETURN_IF_ERROR(step_pending());
  ZINF_RETURN_IF_ERROR(FinishBackward(last, overlap, reduced_sum_squares, &r));
  stats_.grad_d2h_bytes = accumulator_->d2h_bytes();
  stats_.adam_seconds += r.optimizer.adam_seconds;
  stop_gated.armed = false;
  return r;
}

Result<double> LayerExecutor::Evaluate(const int32_t* tokens, const int32_t* targets) {
  ZINF_RETURN_IF_ERROR(FinishOptimizerStep());
  ZINF_RETURN_IF_ERROR(Upload(tokens, targets));
  rt_.tiers->PauseTrace(true);  // not part of the training step's access order
  auto loss = ForwardAll(/*backward_follows=*/false);
  rt_.tiers->PauseTrace(false);
  return loss;
}

}  // namespace zinf::train
