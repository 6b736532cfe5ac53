#include "offload/grad_accumulator.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/grad_ops.h"

namespace zinf::offload {

Result<std::unique_ptr<GradAccumulator>> GradAccumulator::Create(
    TierManager& tm, Device& device, PinnedPool& pool, const GradAccumulatorOptions& options) {
  if (options.max_unit_elems == 0) return InvalidArgument("GradAccumulator: units of 0 elements");
  if (options.depth == 0) return InvalidArgument("GradAccumulator: depth must be >= 1");
  if (options.device_grad_bytes != 2 && options.device_grad_bytes != 4) {
    return InvalidArgument("GradAccumulator: device_grad_bytes must be 2 or 4");
  }
  auto g = std::unique_ptr<GradAccumulator>(new GradAccumulator(tm, device, pool, options));
  ZINF_ASSIGN_OR_RETURN(g->stream_, device.CreateStream("grad d2h"));
  if (options.fp32_shards) {
    for (unsigned k = 0; k < options.depth; ++k) {
      auto block = pool.Allocate(uint64_t{options.device_grad_bytes} * options.max_unit_elems);
      if (!block.ok()) return block.status().WithContext("gradient staging blocks");
      g->staging_.push_back(*block);
      g->free_staging_.push_back(static_cast<int>(k));
    }
  }
  g->worker_ = std::thread([p = g.get()] { p->Run(); });
  return g;
}

GradAccumulator::~GradAccumulator() {
  Finish().status().IgnoreError();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  device_.StreamSynchronize(stream_).IgnoreError();
  for (auto& b : staging_) pool_.Free(b).IgnoreError();
}

Status GradAccumulator::Validate(const HandOver& h, bool* store16) const {
  if (h.n == 0 || h.n > options_.max_unit_elems) {
    return InvalidArgument(fmt::format("gradient of {} elements: expected 1..{}", h.n,
                                       options_.max_unit_elems));
  }
  if (kernels::DTypeSize(h.type) > options_.device_grad_bytes) {
    return InvalidArgument(fmt::format("a {} gradient: this accumulator stages {}-byte values",
                                       kernels::DTypeName(h.type), options_.device_grad_bytes));
  }
  const uint64_t shard_bytes = tm_.spec(h.shard).bytes;
  if (h.reduce != nullptr) {
    *store16 = false;
    if (h.out_n == 0 || shard_bytes < 4 * h.out_n || h.scale != 1.0f) {
      return InvalidArgument(fmt::format(
          "gradient shard {} holds {} bytes: a reduced hand-over needs 4 * {} and scale 1 (got "
          "{})", tm_.spec(h.shard).name, shard_bytes, h.out_n, h.scale));
    }
    return Status::Ok();
  }
  *store16 = h.type != kernels::DType::kF32 && shard_bytes == kernels::DTypeSize(h.type) * h.n;
  if (*store16) {
    if (!h.first || h.scale != 1.0f) {
      return InvalidArgument(fmt::format(
          "gradient shard {} holds {} values as they come: one micro-batch a step at scale 1 "
          "(got {} micro-batch, scale {})", tm_.spec(h.shard).name, kernels::DTypeName(h.type),
          h.first ? "the first" : "a later", h.scale));
    }
    return Status::Ok();
  }
  if (shard_bytes < 4 * h.n) {
    return InvalidArgument(fmt::format(
        "gradient shard {} holds {} bytes, fewer than {} fp32 values{}", tm_.spec(h.shard).name,
        shard_bytes, h.n,
        h.type == kernels::DType::kF32
            ? ""
            : fmt::format(" or {} {} values", h.n, kernels::DTypeName(h.type))));
  }
  if (staging_.empty()) {
    return FailedPrecondition("GradAccumulator: created for 16-bit shards only (no staging blocks)");
  }
  return Status::Ok();
}

Result<Event> GradAccumulator::Submit(const HandOver& h) {
  Job job;
  job.h = h;
  ZINF_RETURN_IF_ERROR(Validate(h, &job.store16));
  {
    // A free place in the pipeline (and a staging block for an fp32 shard).
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      return !error_.ok() || (in_flight_ < options_.depth &&
                              (job.store16 || !free_staging_.empty()));
    });
    if (!error_.ok()) return error_;
    in_flight_++;
    if (!job.store16) {
      job.staging = free_staging_.back();
      free_staging_.pop_back();
      job.dst = staging_[job.staging].data;
    }
  }
  auto fail = [&](Status st) -> Status {
    std::lock_guard lock(mu_);
    if (job.staging >= 0) free_staging_.push_back(job.staging);
    in_flight_--;
    cv_.notify_all();
    return st;
  };
  if (job.store16) {
    // Nothing to read or to sum: the device's values go straight into the shard's host copy.
    auto lease = tm_.Acquire(h.shard, Tier::kHost, AcquireMode::kOverwrite);
    if (!lease.ok()) return fail(lease.status());
    auto dst = lease->Wait();
    if (!dst.ok()) {
      tm_.Release(std::move(*lease), false).IgnoreError();
      return fail(dst.status());
    }
    job.lease = std::move(*lease);
    job.dst = *dst;
  }
  Status st = device_.StreamWaitEvent(stream_, h.produced);
  if (st.ok()) st = device_.CopyToHost(stream_, job.dst, h.device_grad, kernels::DTypeSize(h.type) * h.n);
  Result<Event> copied = st.ok() ? device_.Record(stream_) : Result<Event>(st);
  if (!copied.ok()) {
    if (job.store16) tm_.Release(std::move(job.lease), false).IgnoreError();
    return fail(copied.status());
  }
  job.copied = *copied;
  {
    std::lock_guard lock(mu_);
    job.seq = ++queued_;
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return *copied;
}

void GradAccumulator::MarkIssued(uint64_t seq) {
  {
    std::lock_guard lock(mu_);
    issued_ = std::max(issued_, seq);
  }
  cv_.notify_all();
}

Status GradAccumulator::Process(Job& job, double* sum_squares, bool* finite) {
  const HandOver& h = job.h;
  const size_t n = h.n;
  if (h.reduce == nullptr) MarkIssued(job.seq);  // nothing to issue
  if (job.store16) {
    Status st = device_.EventSynchronize(job.copied);
    if (!st.ok()) {
      tm_.Release(std::move(job.lease), false).IgnoreError();
      return st;
    }
    if (h.sum_squares) {
      // One pass: Σ g² in double is finite exactly when every 16-bit value is (the largest
      // squared is below 2^256), so it also answers AllFinite.
      const double s =
          kernels::cpu::SumSquares16(static_cast<const uint16_t*>(job.dst), h.type, n);
      *finite = std::isfinite(s);
      *sum_squares += s;
      return tm_.Release(std::move(job.lease), true);
    }
    auto ok = kernels::AllFinite(job.dst, h.type, n);
    if (ok.ok()) *finite = *ok;
    ZINF_RETURN_IF_ERROR(tm_.Release(std::move(job.lease), ok.ok()));
    return ok.status();
  }
  // fp32 shard: the first micro-batch overwrites it (nothing to read from its home).
  ZINF_ASSIGN_OR_RETURN(Lease lease, tm_.Acquire(h.shard, Tier::kHost,
                                                 h.first ? AcquireMode::kOverwrite
                                                         : AcquireMode::kRead));
  auto fail = [&](Status st) {
    (void)lease.Wait();  // its transfer done before the copy is let go
    tm_.Release(std::move(lease), false).IgnoreError();
    return st;
  };
  Status copied = device_.EventSynchronize(job.copied);
  if (!copied.ok()) return fail(copied);
  // ZeRO-2: the shard accumulates this rank's chunk of the sum over ranks. The reduction is
  // issued as soon as the staged values are there, the shard's host copy waited for after.
  const void* src = job.dst;
  kernels::DType src_type = h.type;
  size_t m = n;
  if (h.reduce != nullptr) {
    reduced_.resize(h.out_n);
    auto wait = (*h.reduce)(job.dst, h.type, n, reduced_.data(), h.out_n);
    // A refused issue is marked by Run together with its error (one lock), so WaitIssued
    // never sees it issued without the error.
    if (!wait.ok()) return fail(wait.status());
    MarkIssued(job.seq);
    Status r = (*wait)();
    if (!r.ok()) return fail(r);
    src = reduced_.data();
    src_type = kernels::DType::kF32;
    m = h.out_n;
  }
  auto acc = lease.Wait();
  if (!acc.ok()) return fail(acc.status());
  float* a = static_cast<float*>(*acc);
  if (h.first) std::memset(a, 0, 4 * m);
  auto ok = kernels::AccumulateGrad(a, src, src_type, m, h.scale);
  if (ok.ok()) {
    *finite = *ok;
    if (h.sum_squares) *sum_squares += kernels::cpu::SumSquares(a, m);
  }
  ZINF_RETURN_IF_ERROR(tm_.Release(std::move(lease), ok.ok()));
  return ok.status();
}

void GradAccumulator::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Job job = std::move(queue_.front());
    queue_.pop_front();
    const bool skip = !error_.ok();
    lock.unlock();
    double sum = 0;
    bool finite = true;
    Status st;
    if (skip) {
      // After a failure the rest is dropped (Finish reports the failure), its memory returned.
      if (job.store16) tm_.Release(std::move(job.lease), false).IgnoreError();
      device_.EventSynchronize(job.copied).IgnoreError();
    } else {
      st = Process(job, &sum, &finite);
    }
    lock.lock();
    issued_ = std::max(issued_, job.seq);  // a job skipped or failed before issuing
    if (!st.ok() && error_.ok()) error_ = st;
    totals_.finite = totals_.finite && finite;
    totals_.sum_squares += sum;
    if (job.staging >= 0) free_staging_.push_back(job.staging);
    in_flight_--;
    cv_.notify_all();
  }
}

Result<GradAccumulator::Totals> GradAccumulator::WaitIdle() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  if (!error_.ok()) return error_;
  return totals_;
}

Status GradAccumulator::WaitIssued() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return issued_ == queued_ || !error_.ok(); });
  return error_;
}

Result<GradAccumulator::Totals> GradAccumulator::Finish() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return in_flight_ == 0; });
  Totals t = totals_;
  totals_ = Totals{};
  if (!error_.ok()) return std::exchange(error_, Status::Ok());
  return t;
}

Result<bool> GradAccumulator::Accumulate(ShardId grad_shard, const void* device_grad,
                                         kernels::DType type, size_t n, float scale, bool first,
                                         double* sum_squares) {
  ZINF_RETURN_IF_ERROR(Finish().status());
  HandOver h{.shard = grad_shard, .device_grad = device_grad, .type = type, .n = n,
             .scale = scale, .first = first, .sum_squares = sum_squares != nullptr};
  ZINF_RETURN_IF_ERROR(Submit(h).status());
  ZINF_ASSIGN_OR_RETURN(Totals t, Finish());
  if (sum_squares != nullptr) *sum_squares += t.sum_squares;
  return t.finite;
}

}  // namespace zinf::offload
