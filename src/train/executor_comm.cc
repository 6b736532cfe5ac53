#include "src/train/executor.h"

// The layer executor across ranks (ExecutorOptions::comm): each unit's accumulated gradient
// all-reduced in its host copy before the unit's optimizer step.
#include <cmath>

#include <fmt/format.h>

#include "kernels/cpu/layer_ops.h"
#include "src/train/executor_internal.h"

namespace zinf::train {

using namespace detail;  // NOLINT: the executor's own helpers

bool LayerExecutor::ReducesGrads() const {
  return options_.comm != nullptr && options_.comm->world() > 1;
}

Result<bool> LayerExecutor::ReduceUnitGrad(uint32_t unit, double* sum_squares) {
  offload::TierManager& tm = *rt_.tiers;
  const uint64_t n = dims_.UnitParams(unit);
  ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(grad_[unit], Tier::kHost));
  auto g = lease.Wait();
  if (!g.ok()) {
    tm.Release(std::move(lease), false).IgnoreError();
    return g.status();
  }
  auto* v = static_cast<float*>(*g);
  const auto t0 = Clock::now();
  const auto kind = static_cast<size_t>(comm::OpKind::kAllReduce);
  const uint64_t sent0 = options_.comm->stats().bytes_sent[kind];
  Status s = options_.comm->AllReduce(v, comm::DType::kF32, v, comm::DType::kF32, n).Wait();
  stats_.comm_seconds += Since(t0);
  stats_.grad_comm_sent_bytes += options_.comm->stats().bytes_sent[kind] - sent0;
  if (!s.ok()) {
    // The copy holds a partial sum now: dirty (so it is never taken for its home's value) and
    // discarded with the step.
    tm.Release(std::move(lease), true).IgnoreError();
    return s.WithContext(fmt::format("all-reducing the gradients of {}", dims_.UnitName(unit)));
  }
  // The same bits on every rank, so the same Σ g² (summed as the accumulator sums a shard's)
  // and the same verdict: a float's square never overflows a double, so the sum is finite
  // exactly when every value is.
  const double ss = kernels::cpu::SumSquares(v, n);
  const bool finite = std::isfinite(ss);
  *sum_squares += ss;
  ZINF_RETURN_IF_ERROR(tm.Release(std::move(lease), true));
  return finite;
}

Result<bool> LayerExecutor::ReduceAllGrads() {
  double ss = 0;
  bool finite = true;
  // Backward order (the head, the blocks from the last, the embedding), as the hand-overs ran.
  const uint32_t fin = dims_.final_unit();
  ZINF_ASSIGN_OR_RETURN(bool f, ReduceUnitGrad(fin, &ss));
  finite = finite && f;
  for (int l = dims_.L - 1; l >= 0; --l) {
    ZINF_ASSIGN_OR_RETURN(f, ReduceUnitGrad(static_cast<uint32_t>(l + 1), &ss));
    finite = finite && f;
  }
  ZINF_ASSIGN_OR_RETURN(f, ReduceUnitGrad(0, &ss));
  finite = finite && f;
  grad_sum_squares_ = ss;
  return finite;
}

}  // namespace zinf::train
