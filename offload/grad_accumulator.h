// offload/grad_accumulator.h — gradients from the device, accumulated in fp32 on the host.
//
// Contract: Accumulate() copies one unit's gradient (fp32, bf16 or fp16) from device memory to a
// pinned staging block (on its own "grad d2h" stream), acquires the unit's fp32 gradient shard
// in the host tier through the TierManager, adds scale * gradient into it (zeroing it first on
// the first micro-batch of a step, acquired for overwrite then: nothing is read from its home)
// and releases it dirty. The shard is an ordinary shard: when
// the pinned budget is short, the tier manager writes it to its NVMe home and reads it back for
// the next micro-batch or the optimizer step ("spilled to NVMe when the host budget says so").
// It returns whether every accumulated value is finite — for free, in the same pass — so a
// dynamic loss scaler can skip the step before the optimizer touches any state. With
// sum_squares set (the last micro-batch of a step), it also adds Σ acc² of the accumulated
// values to *sum_squares, read while they are still in cache, for the global gradient norm.
//
//
// A shard of 16-bit values (2n bytes, the gradient's own type) is stored, not summed: with one
// micro-batch a step (scale 1, the first micro-batch) the fp32 sum would be the 16-bit value
// widened exactly, so keeping the 16-bit value is lossless and halves the shard's host memory
// and NVMe traffic. The device's values are copied straight into the shard's host copy
// (acquired for overwrite), checked for finiteness and squared for the norm in place.
//
// Thread-safety: one Accumulate at a time per accumulator (one staging block).
#pragma once

#include <cstddef>
#include <memory>

#include "kernels/cpu/dtype.h"
#include "offload/pinned_pool.h"
#include "offload/tier_manager.h"
#include "src/base/device.h"
#include "zinf/status.h"

namespace zinf::offload {

class GradAccumulator {
 public:
  // Takes a staging block for max_unit_elems fp32 values from the pool, unless fp32_shards is
  // false (every shard it will see holds 16-bit values: nothing is staged).
  static Result<std::unique_ptr<GradAccumulator>> Create(TierManager& tm, Device& device,
                                                         PinnedPool& pool,
                                                         size_t max_unit_elems,
                                                         bool fp32_shards = true);
  ~GradAccumulator();

  // REQUIRES: grad_shard holds 4 * n bytes (fp32), or n values of `type` when that is 16-bit
  // (then first and scale == 1); device_grad is device memory of n elements.
  Result<bool> Accumulate(ShardId grad_shard, const void* device_grad, kernels::DType type,
                          size_t n, float scale, bool first, double* sum_squares = nullptr);

 private:
  Result<bool> Store16(ShardId grad_shard, const void* device_grad, kernels::DType type,
                       size_t n, float scale, bool first, double* sum_squares);
  GradAccumulator(TierManager& tm, Device& d, PinnedPool& p) : tm_(tm), device_(d), pool_(p) {}
  TierManager& tm_;
  Device& device_;
  PinnedPool& pool_;
  Stream* stream_ = nullptr;
  PinnedBlock staging_;
  size_t max_elems_ = 0;
};

}  // namespace zinf::offload
