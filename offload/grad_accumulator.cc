#include "offload/grad_accumulator.h"

#include <cstring>

#include <fmt/format.h>

#include "kernels/cpu/grad_ops.h"
#include "kernels/cpu/layer_ops.h"

namespace zinf::offload {

Result<std::unique_ptr<GradAccumulator>> GradAccumulator::Create(TierManager& tm, Device& device,
                                                                 PinnedPool& pool,
                                                                 size_t max_unit_elems,
                                                                 bool fp32_shards) {
  if (max_unit_elems == 0) return InvalidArgument("GradAccumulator: units of 0 elements");
  auto g = std::unique_ptr<GradAccumulator>(new GradAccumulator(tm, device, pool));
  ZINF_ASSIGN_OR_RETURN(g->stream_, device.CreateStream("grad d2h"));
  if (fp32_shards) {
    auto block = pool.Allocate(4 * max_unit_elems);
    if (!block.ok()) return block.status().WithContext("gradient staging block");
    g->staging_ = *block;
  }
  g->max_elems_ = max_unit_elems;
  return g;
}

GradAccumulator::~GradAccumulator() {
  device_.StreamSynchronize(stream_).IgnoreError();
  pool_.Free(staging_);
}

Result<bool> GradAccumulator::Accumulate(ShardId grad_shard, const void* device_grad,
                                         kernels::DType type, size_t n, float scale, bool first,
                                         double* sum_squares) {
  if (n == 0 || n > max_elems_) {
    return InvalidArgument(fmt::format("gradient of {} elements: expected 1..{}", n, max_elems_));
  }
  const uint64_t shard_bytes = tm_.spec(grad_shard).bytes;
  if (type != kernels::DType::kF32 && shard_bytes == kernels::DTypeSize(type) * n) {
    return Store16(grad_shard, device_grad, type, n, scale, first, sum_squares);
  }
  if (shard_bytes != 4 * n) {
    return InvalidArgument(fmt::format(
        "gradient shard {} holds {} bytes, not {} fp32 values{}", tm_.spec(grad_shard).name,
        shard_bytes, n,
        type == kernels::DType::kF32
            ? ""
            : fmt::format(" or {} {} values", n, kernels::DTypeName(type))));
  }
  if (!staging_) {
    return FailedPrecondition("GradAccumulator: created for 16-bit shards only (no staging block)");
  }
  const size_t bytes = n * kernels::DTypeSize(type);
  // Start the device-to-host copy, and bring the accumulator up meanwhile.
  ZINF_RETURN_IF_ERROR(device_.CopyToHost(stream_, staging_.data, device_grad, bytes));
  // The first micro-batch overwrites the accumulator: nothing to read from its home.
  ZINF_ASSIGN_OR_RETURN(Lease lease, tm_.Acquire(grad_shard, Tier::kHost,
                                                 first ? AcquireMode::kOverwrite
                                                       : AcquireMode::kRead));
  auto acc = lease.Wait();
  Status copied = device_.StreamSynchronize(stream_);
  if (!acc.ok() || !copied.ok()) {
    tm_.Release(std::move(lease), false).IgnoreError();
    return !acc.ok() ? acc.status() : copied;
  }
  float* a = static_cast<float*>(*acc);
  if (first) std::memset(a, 0, 4 * n);
  auto finite = kernels::AccumulateGrad(a, staging_.data, type, n, scale);
  if (finite.ok() && sum_squares != nullptr) *sum_squares += kernels::cpu::SumSquares(a, n);
  ZINF_RETURN_IF_ERROR(tm_.Release(std::move(lease), finite.ok()));
  return finite;
}

Result<bool> GradAccumulator::Store16(ShardId grad_shard, const void* device_grad,
                                       kernels::DType type, size_t n, float scale, bool first,
                                       double* sum_squares) {
  if (!first || scale != 1.0f) {
    return InvalidArgument(fmt::format(
        "gradient shard {} holds {} values as they come: one micro-batch a step at scale 1 "
        "(got {} micro-batch, scale {})", tm_.spec(grad_shard).name, kernels::DTypeName(type),
        first ? "the first" : "a later", scale));
  }
  // Nothing to read or to sum: the device's values go straight into the shard's host copy.
  ZINF_ASSIGN_OR_RETURN(Lease lease, tm_.Acquire(grad_shard, Tier::kHost, AcquireMode::kOverwrite));
  auto dst = lease.Wait();
  Status st = dst.status();
  if (st.ok()) st = device_.CopyToHost(stream_, *dst, device_grad, kernels::DTypeSize(type) * n);
  if (st.ok()) st = device_.StreamSynchronize(stream_);
  if (!st.ok()) {
    tm_.Release(std::move(lease), false).IgnoreError();
    return st;
  }
  auto finite = kernels::AllFinite(*dst, type, n);
  if (finite.ok() && sum_squares != nullptr) {
    *sum_squares += kernels::cpu::SumSquares16(static_cast<const uint16_t*>(*dst), type, n);
  }
  ZINF_RETURN_IF_ERROR(tm_.Release(std::move(lease), finite.ok()));
  return finite;
}

}  // namespace zinf::offload
