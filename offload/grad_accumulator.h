// offload/grad_accumulator.h — gradients from the device, handed to the host tier without the
// caller ever waiting on the device.
//
// Contract: Submit() starts one unit's hand-over and returns the event after which the device
// gradient may be overwritten; Finish() waits for every hand-over submitted so far and returns
// whether all of them were finite and the Σ g² of those submitted with sum_squares. Between
// the two the caller computes on: the device-to-host copy runs on the accumulator's own
// "grad d2h" stream after the event that produced the gradient (a stream wait, never a host
// wait), and the host side (finiteness, the sum of squares, the fp32 sum) runs on the
// accumulator's worker thread, in submission order (so sums are bit-identical to doing it
// inline). At most `depth` hand-overs are in flight; Submit waits (on the worker, not on the
// device) when that many are.
// - A shard of 16-bit values (2n bytes, the gradient's own type) is stored, not summed: with one
//   micro-batch a step (scale 1, the first micro-batch) the fp32 sum would be the 16-bit value
//   widened exactly, so keeping the 16-bit value is lossless and halves the shard's host memory
//   and NVMe traffic. Submit acquires the shard's host copy for overwrite (the one wait it may
//   make: for host memory, when evictions must write dirty copies home) and the copy lands there.
// - An fp32 shard accumulates: the copy lands in one of `depth` pinned staging blocks; the worker
//   acquires the shard in the host tier (for overwrite on the first micro-batch of a step:
//   nothing is read from its home), adds scale * gradient (zeroing it first on the first
//   micro-batch) and releases it dirty. The shard is an ordinary shard: when the pinned budget
//   is short, the tier manager writes it to its NVMe home and reads it back for the next
//   micro-batch or the optimizer step.
// The finiteness flag comes for free in the same pass, so a dynamic loss scaler can skip the
// step before the optimizer touches any state. The host gradient leases held at once are at
// most `depth` (declare them at the tier manager's Seal). An error of any hand-over (I/O, a
// refused copy) is returned by Finish, and by every Submit after it.
//
// Thread-safety: Submit/Finish/Accumulate from one thread at a time (the layer executor's).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "offload/pinned_pool.h"
#include "offload/tier_manager.h"
#include "src/base/device.h"
#include "zinf/status.h"

namespace zinf::offload {

struct GradAccumulatorOptions {
  size_t max_unit_elems = 0;
  bool fp32_shards = true;  // false: every shard holds 16-bit values (no staging blocks)
  unsigned depth = 2;       // hand-overs in flight (and staging blocks for fp32 shards)
  // Bytes per element of the largest device gradient type submitted (2: bf16/fp16, 4: fp32):
  // sizes the staging blocks.
  unsigned device_grad_bytes = 4;
};

struct HandOver {
  ShardId shard = 0;
  const void* device_grad = nullptr;  // device memory: n values of `type`
  kernels::DType type = kernels::DType::kBf16;
  size_t n = 0;
  float scale = 1.0f;
  bool first = true;        // the step's first micro-batch: the shard is overwritten
  bool sum_squares = false;  // add this shard's Σ g² (as it holds them) to Finish's total
  Event produced;           // the gradient is complete on the device after this event
  // ZeRO-2: the gradient is first reduced over ranks, on the worker thread in submission order:
  // `reduce` gets the staged values (a staging block of max_unit_elems values of `type`, the
  // first n the device's, the rest its to use), ISSUES the reduction and returns a wait for it;
  // once that wait returns OK, out holds out_n fp32 values (this rank's chunk of the sum), and
  // the fp32 shard (4 * out_n bytes or more) accumulates those instead. WaitIssued() returns as
  // soon as the reduction is issued, before its wait. Null: the shard takes the n values
  // themselves.
  using ReduceWait = std::function<Status()>;
  using ReduceFn = std::function<Result<ReduceWait>(void* staged, kernels::DType type, size_t n,
                                                    float* out, size_t out_n)>;
  const ReduceFn* reduce = nullptr;
  size_t out_n = 0;
};

class GradAccumulator {
 public:
  static Result<std::unique_ptr<GradAccumulator>> Create(TierManager& tm, Device& device,
                                                         PinnedPool& pool,
                                                         const GradAccumulatorOptions& options);
  ~GradAccumulator();  // finishes what was submitted

  // REQUIRES: the shard holds 4n bytes (fp32) or more (the bytes past 4n are left as they are:
  // padding a caller may use, say to reduce-scatter the shard in equal chunks), or exactly n
  // values of `type` when that is 16-bit (then first and scale == 1). Returns the event after
  // which device_grad may be overwritten.
  Result<Event> Submit(const HandOver& h);

  struct Totals {
    bool finite = true;
    double sum_squares = 0;
  };
  // Waits for every hand-over submitted so far; the totals since the last Finish (kept).
  Result<Totals> WaitIdle();
  // Waits until every hand-over submitted so far has issued its reduction (HandOver::reduce),
  // or been processed when it has none; not for the reductions to finish. A caller that issues
  // collectives of its own on the same communicator calls it first, so that every rank issues
  // them in the same order (the hand-overs' reductions first) without waiting for the wire.
  // Returns the first failure, if any (then nothing more is issued).
  Status WaitIssued();
  // WaitIdle, then starts new totals.
  Result<Totals> Finish();

  // Submit + Finish, for callers that hand over one gradient at a time.
  Result<bool> Accumulate(ShardId grad_shard, const void* device_grad, kernels::DType type,
                          size_t n, float scale, bool first, double* sum_squares = nullptr);

  unsigned depth() const { return options_.depth; }
  // Bytes copied from the device so far.
  uint64_t d2h_bytes() const { return stream_->stats().d2h_bytes; }

 private:
  struct Job {
    HandOver h;
    uint64_t seq = 0;     // 1, 2, ... in submission order
    bool store16 = false;
    Lease lease;          // store16: the shard's host copy, acquired by Submit
    void* dst = nullptr;  // where the copy lands (the lease or a staging block)
    int staging = -1;
    Event copied;         // the d2h copy is done
  };
  GradAccumulator(TierManager& tm, Device& d, PinnedPool& p, const GradAccumulatorOptions& o)
      : tm_(tm), device_(d), pool_(p), options_(o) {}
  Status Validate(const HandOver& h, bool* store16) const;
  void Run();                    // the worker
  Status Process(Job& job, double* sum_squares, bool* finite);
  void MarkIssued(uint64_t seq);  // the worker: job `seq`'s reduction is issued (or none)

  TierManager& tm_;
  Device& device_;
  PinnedPool& pool_;
  GradAccumulatorOptions options_;
  Stream* stream_ = nullptr;
  std::vector<PinnedBlock> staging_;
  std::vector<float> reduced_;  // the worker's: a ZeRO-2 hand-over's chunk of the sum

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;            // GUARDED_BY(mu_): submitted, not yet processed
  unsigned in_flight_ = 0;           // GUARDED_BY(mu_): submitted, not yet done
  uint64_t queued_ = 0;              // GUARDED_BY(mu_): jobs queued so far (the last seq)
  uint64_t issued_ = 0;              // GUARDED_BY(mu_): jobs whose reduction is issued
  std::vector<int> free_staging_;    // GUARDED_BY(mu_)
  Totals totals_;                    // GUARDED_BY(mu_)
  Status error_;                     // GUARDED_BY(mu_): the first failure
  bool stopping_ = false;            // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace zinf::offload
