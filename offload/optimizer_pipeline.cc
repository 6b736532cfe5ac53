#include "offload/optimizer_pipeline.h"

#include "src/base/hash.h"

#include <chrono>
#include <condition_variable>
#include <mutex>

#include <fmt/format.h>

#include "src/base/units.h"

namespace zinf::offload {

using Clock = std::chrono::steady_clock;

OptimizerPipeline::Layout OptimizerPipeline::LayoutFor(uint64_t n) const {
  Layout l;
  l.state_bytes = swap_.Padded(4 * n);
  l.moment_bytes = swap_.Padded(StateRoleBytes(kExpAvgState, n, options_.moment_type));
  l.param16_bytes = swap_.Padded(2 * n);
  l.master = 0;
  l.exp_avg = l.state_bytes;
  l.exp_avg_sq = l.exp_avg + l.moment_bytes;
  l.param16 = l.exp_avg_sq + l.moment_bytes;
  l.total = l.param16 + l.param16_bytes;
  return l;
}

uint64_t OptimizerPipeline::SlabBytes(uint64_t max_unit_elems, uint64_t align,
                                      kernels::DType moment_type) {
  auto pad = [align](uint64_t b) { return (b + align - 1) / align * align; };
  return pad(4 * max_unit_elems) +
         2 * pad(StateRoleBytes(kExpAvgState, max_unit_elems, moment_type)) +
         pad(2 * max_unit_elems);
}

Result<std::unique_ptr<OptimizerPipeline>> OptimizerPipeline::Create(
    SwapSpace& swap, PinnedPool& pool, uint64_t max_unit_elems,
    const OptimizerPipelineOptions& o) {
  if (o.depth < 1) {
    return InvalidArgument(fmt::format("optimizer pipeline depth {}: expected at least 1", o.depth));
  }
  if (max_unit_elems == 0) return InvalidArgument("optimizer pipeline: units of 0 elements");
  if (o.moment_type != kernels::DType::kF32 && o.moment_type != kernels::DType::kBf16) {
    return InvalidArgument(fmt::format("optimizer pipeline: moments of {}; expected fp32 or bf16",
                                       kernels::DTypeName(o.moment_type)));
  }
  auto p = std::unique_ptr<OptimizerPipeline>(new OptimizerPipeline(swap, pool, o));
  p->max_elems_ = max_unit_elems;
  p->slab_bytes_ = p->LayoutFor(max_unit_elems).total;
  const uint64_t need = o.depth * pool.BlockBytes(p->slab_bytes_);
  const uint64_t free = pool.budget_bytes() - pool.bytes_in_use();
  if (need > free) {
    // Exact bytes beside the rounded ones: "2.0 MiB needed, 2.0 MiB free" helps nobody.
    return ResourceExhausted(fmt::format(
        "optimizer pipeline: {} slabs of {} bytes ({}; {} elements x {} bytes, padded) need {} "
        "bytes ({}) of pinned memory but the pool has {} bytes ({}) free of its {}-byte budget; "
        "lower the pipeline depth, or raise zinf.budgets.pinned_bytes to at least {}",
        o.depth, p->slab_bytes_, FormatBytesHuman(p->slab_bytes_), max_unit_elems,
        6 + 2 * kernels::DTypeSize(o.moment_type), need,
        FormatBytesHuman(need), free, FormatBytesHuman(free), pool.budget_bytes(),
        pool.bytes_in_use() + need));
  }
  for (unsigned i = 0; i < o.depth; ++i) {
    ZINF_ASSIGN_OR_RETURN(PinnedBlock b, pool.Allocate(p->slab_bytes_));
    p->slabs_.push_back(b);
  }
  swap.engine().StartReaper();
  return p;
}

OptimizerPipeline::~OptimizerPipeline() {
  for (auto& s : slabs_) pool_.Free(s).IgnoreError();
}

namespace {


// Shared between the computing thread and the engine's reaper thread.
struct StepState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> reads_left;   // per unit: read requests still in flight
  std::vector<int> writes_left;  // per unit
  int writes_in_flight = 0;
  int reads_in_flight = 0;
  Status error;
};

}  // namespace

// A unit's reads go into its slab when the slab's previous unit has finished writing; the
// completions run on the engine's reaper thread and take `st.mu` (they call nothing but
// on_unit_written and the next unit's reads).
struct OptimizerPipeline::StepIo {
  OptimizerPipeline& p;
  std::span<const OptimizerUnit> units;
  const std::function<void(size_t)>* on_unit_written;
  OptimizerStepStats& stats;
  io::Engine& engine;
  io::FileId file;
  size_t count;
  unsigned depth;
  Tracer* tracer;
  int read_track = 0, write_track = 0;
  StepState st;

  StepIo(OptimizerPipeline& pipeline, std::span<const OptimizerUnit> u,
         const std::function<void(size_t)>* written, OptimizerStepStats& s)
      : p(pipeline),
        units(u),
        on_unit_written(written),
        stats(s),
        engine(pipeline.swap_.engine()),
        file(pipeline.swap_.file()),
        count(u.size()),
        depth(pipeline.options_.depth),
        tracer(pipeline.options_.tracer && pipeline.options_.tracer->enabled()
                   ? pipeline.options_.tracer
                   : nullptr) {
    if (tracer != nullptr) {
      read_track = tracer->Track("nvme read");
      write_track = tracer->Track("nvme write");
    }
    st.reads_left.assign(count, 0);
    st.writes_left.assign(count, 0);
  }

  // A read's or write's completion (on the engine's reaper thread).
  std::function<void(const Status&)> OnDone(bool read, size_t unit) {
    return [this, read, unit, t0 = Clock::now()](const Status& s) {
      if (tracer) {
        tracer->Complete(read ? read_track : write_track,
                         fmt::format("{} unit {}", read ? "read" : "write", unit), t0,
                         Clock::now(), "io");
      }
      std::lock_guard lock(st.mu);
      if (!s.ok() && st.error.ok()) st.error = s;
      if (read) {
        st.reads_left[unit]--;
        st.reads_in_flight--;
      } else {
        st.writes_in_flight--;
        if (--st.writes_left[unit] == 0 && st.error.ok()) UnitWritten(unit);
      }
      st.cv.notify_all();
    };
  }

  // The unit is home: its slab serves the unit `depth` ahead. REQUIRES: st.mu held.
  void UnitWritten(size_t unit) {
    if (on_unit_written != nullptr) (*on_unit_written)(unit);
    if (unit + depth < count) SubmitReads(unit + depth);
  }

  // REQUIRES: st.mu held.
  void SubmitReads(size_t unit) {
    const OptimizerUnit& u = units[unit];
    if (u.in_memory[0] != nullptr) return;  // nothing to read: Adam works in place
    const Layout l = p.LayoutFor(u.n);
    uint8_t* slab = p.slabs_[unit % depth].data;
    const std::pair<const Extent*, uint64_t> parts[3] = {
        {&u.master, l.master}, {&u.exp_avg, l.exp_avg}, {&u.exp_avg_sq, l.exp_avg_sq}};
    for (auto [ext, off] : parts) {
      const uint64_t len = ext == &u.master ? l.state_bytes : l.moment_bytes;
      if (!SubmitOne(io::OpKind::kRead, unit, *ext, slab + off, len)) return;
    }
  }

  // One read or write of unit `unit`, counted in flight until its completion runs. False (the
  // error kept in st.error) when the engine refused it. REQUIRES: st.mu held.
  bool SubmitOne(io::OpKind kind, size_t unit, const Extent& ext, uint8_t* buf, uint64_t len) {
    const bool read = kind == io::OpKind::kRead;
    std::vector<int>& left = read ? st.reads_left : st.writes_left;
    int& in_flight = read ? st.reads_in_flight : st.writes_in_flight;
    left[unit]++;
    in_flight++;
    Status s = engine.Submit({kind, file, ext.offset, buf, len, io::Priority::kBackground},
                             OnDone(read, unit));
    if (!s.ok()) {
      left[unit]--;
      in_flight--;
      if (st.error.ok()) st.error = s;
      return false;
    }
    (read ? stats.bytes_read : stats.bytes_written) += len;
    return true;
  }

  // Unit i's reads were submitted when its slab's previous unit finished writing: waits for
  // them. False after a failed read or write.
  bool WaitReads(size_t i) {
    auto w0 = Clock::now();
    std::unique_lock lock(st.mu);
    st.cv.wait(lock, [&] {
      return !st.error.ok() ||
             (st.reads_left[i] == 0 && (i < depth || st.writes_left[i - depth] == 0));
    });
    stats.read_wait_seconds += std::chrono::duration<double>(Clock::now() - w0).count();
    return st.error.ok();
  }

  bool Failed() {
    std::lock_guard lock(st.mu);
    return !st.error.ok();
  }

  // The unit's new state (to `outs` where given, else where it was read) and its 16-bit copy.
  void SubmitWrites(size_t i, const std::array<Extent, kStateRoles>& outs) {
    const OptimizerUnit& u = units[i];
    const Layout l = p.LayoutFor(u.n);
    uint8_t* slab = p.slabs_[i % depth].data;
    std::lock_guard lock(st.mu);
    auto out = [](const Extent& written, const Extent& read) {
      return written.bytes != 0 ? &written : &read;
    };
    const std::pair<const Extent*, uint64_t> parts[4] = {
        {out(outs[kMasterState], u.master), l.master},
        {out(outs[kExpAvgState], u.exp_avg), l.exp_avg},
        {out(outs[kExpAvgSqState], u.exp_avg_sq), l.exp_avg_sq},
        {&u.param16, l.param16}};
    for (auto [ext, off] : parts) {
      if (ext->bytes == 0) continue;
      const uint64_t len = off == l.param16  ? l.param16_bytes
                           : off == l.master ? l.state_bytes
                                             : l.moment_bytes;
      if (!SubmitOne(io::OpKind::kWrite, i, *ext, slab + off, len)) break;
    }
    // Nothing to write (state in memory, no 16-bit copy home): the unit is done, and its slab
    // serves the next unit at once.
    if (st.writes_left[i] == 0 && st.error.ok()) UnitWritten(i);
  }

  // Waits until no read or write is in flight; the first I/O error, if any.
  Status Drain() {
    std::unique_lock lock(st.mu);
    st.cv.wait(lock, [&] { return st.reads_in_flight == 0 && st.writes_in_flight == 0; });
    return st.error;
  }
};

Status OptimizerPipeline::CheckUnits(std::span<const OptimizerUnit> units,
                                     const StepHashing* hashing) const {
  const size_t count = units.size();
  for (size_t i = 0; i < count; ++i) {
    const OptimizerUnit& u = units[i];
    if (u.n == 0 || u.n > max_elems_) {
      return InvalidArgument(fmt::format("optimizer unit {}: {} elements, expected 1..{}", i,
                                         u.n, max_elems_));
    }
    if ((u.grad == nullptr) == !u.grad_shard) {
      return InvalidArgument(fmt::format(
          "optimizer unit {}: give exactly one of a gradient pointer and a gradient shard", i));
    }
    if (u.grad_shard) {
      if (options_.grads == nullptr) {
        return InvalidArgument(fmt::format(
            "optimizer unit {}: a gradient shard needs OptimizerPipelineOptions::grads", i));
      }
      const uint64_t shard_n = u.grad_shard_n != 0 ? u.grad_shard_n : u.n;
      if (shard_n < u.n ||
          options_.grads->spec(*u.grad_shard).bytes != kernels::DTypeSize(u.grad_type) * shard_n) {
        return InvalidArgument(fmt::format(
            "optimizer unit {}: its gradient shard must hold {} {} values (grad_shard_n {}, n {})",
            i, shard_n, kernels::DTypeName(u.grad_type), u.grad_shard_n, u.n));
      }
    }
    const uint64_t mb = StateRoleBytes(kExpAvgState, u.n, options_.moment_type);
    auto out_ok = [](const Extent& e, uint64_t bytes) { return e.bytes == 0 || e.bytes == bytes; };
    const int in_memory = (u.in_memory[0] != nullptr) + (u.in_memory[1] != nullptr) +
                          (u.in_memory[2] != nullptr);
    if (in_memory != 0) {
      if (in_memory != kStateRoles || u.master.bytes != 0 || u.exp_avg.bytes != 0 ||
          u.exp_avg_sq.bytes != 0 || u.master_out.bytes != 0 || u.exp_avg_out.bytes != 0 ||
          u.exp_avg_sq_out.bytes != 0 || (u.param16.bytes != 0 && u.param16.bytes != 2 * u.n)) {
        return InvalidArgument(fmt::format(
            "optimizer unit {}: state in memory takes all three arrays (master, exp_avg, "
            "exp_avg_sq; {} given) and no state extents, and a param16 extent of 2n or 0 bytes "
            "for n = {}",
            i, in_memory, u.n));
      }
      continue;
    }
    if (u.master.bytes != 4 * u.n || u.exp_avg.bytes != mb || u.exp_avg_sq.bytes != mb ||
        (u.param16.bytes != 0 && u.param16.bytes != 2 * u.n) || !out_ok(u.master_out, 4 * u.n) ||
        !out_ok(u.exp_avg_out, mb) || !out_ok(u.exp_avg_sq_out, mb)) {
      return InvalidArgument(fmt::format(
          "optimizer unit {}: extents must hold 4n bytes (master and its output when given), "
          "{}n bytes ({} moments: exp_avg, exp_avg_sq and their outputs when given) and 2n or 0 "
          "bytes (param16) for n = {}",
          i, kernels::DTypeSize(options_.moment_type), kernels::DTypeName(options_.moment_type),
          u.n));
    }
  }
  if (hashing != nullptr && !hashing->expected.empty() && hashing->expected.size() != count) {
    return InvalidArgument(fmt::format("optimizer step: {} expected hashes for {} units",
                                       hashing->expected.size(), count));
  }
  return Status::Ok();
}

Status OptimizerPipeline::CheckGateOutputs(size_t i, const OptimizerUnit& u,
                                           const std::array<Extent, kStateRoles>& outs) const {
  const uint64_t mb = StateRoleBytes(kExpAvgState, u.n, options_.moment_type);
  const bool resident = u.in_memory[0] != nullptr;
  if ((outs[0].bytes != 0 && (resident || outs[0].bytes != 4 * u.n)) ||
      (outs[1].bytes != 0 && (resident || outs[1].bytes != mb)) ||
      (outs[2].bytes != 0 && (resident || outs[2].bytes != mb))) {
    return InvalidArgument(fmt::format(
        "optimizer unit {}: the gate's output extents must hold 4n, {}n and {}n bytes for "
        "n = {} (none for state in memory)",
        i, kernels::DTypeSize(options_.moment_type), kernels::DTypeSize(options_.moment_type),
        u.n));
  }
  return Status::Ok();
}

Result<kernels::AdamStepInfo> OptimizerPipeline::RunAdam(size_t i, const kernels::AdamHyper& hyper,
                                                       const kernels::AdamBuffers& b,
                                                       Tracer* tracer) const {
  kernels::AdamOptions ao = options_.adam;
  ao.check_finite = false;
  // One trace track per Adam worker: each reports its run of chunks of this unit.
  const kernels::RunObserver worker_spans =
      [tracer, i](int worker, size_t begin, size_t end, Clock::time_point t0,
                  Clock::time_point t1) {
        tracer->Complete(tracer->Track(fmt::format("adam worker {}", worker)),
                         fmt::format("unit {} [{}, {})", i, begin, end), t0, t1, "compute");
      };
  if (tracer) ao.observer = &worker_spans;
  return kernels::AdamStep(hyper, b, ao);
}

Status OptimizerPipeline::CheckReadHashes(size_t i, const OptimizerUnit& u, const uint8_t* slab,
                                          const std::array<uint64_t, kStateRoles>& expected) const {
  const Layout l = LayoutFor(u.n);
  const std::pair<const Extent*, uint64_t> state_parts[kStateRoles] = {
      {&u.master, l.master}, {&u.exp_avg, l.exp_avg}, {&u.exp_avg_sq, l.exp_avg_sq}};
  for (int r = 0; r < kStateRoles; ++r) {
    const uint64_t bytes = StateRoleBytes(r, u.n, options_.moment_type);
    const uint64_t got = Xxh64(slab + state_parts[r].second, bytes);
    if (got != expected[r]) {
      return DataLoss(fmt::format(
          "optimizer unit {}: its {} as read from the swap file (offset {}, {} bytes) has "
          "xxHash64 {}, but {} was written there: the data is corrupt",
          i, kStateRoleNames[r], state_parts[r].first->offset, bytes, Xxh64Hex(got),
          Xxh64Hex(expected[r])));
    }
  }
  return Status::Ok();
}

kernels::AdamBuffers OptimizerPipeline::BuffersFor(const OptimizerUnit& u, uint8_t* slab,
                                                   const void* grad,
                                                   const kernels::AdamHyper& hyper,
                                                   bool want16) const {
  const Layout l = LayoutFor(u.n);
  const bool resident = u.in_memory[0] != nullptr;
  kernels::AdamBuffers b;
  b.param = resident ? static_cast<float*>(u.in_memory[kMasterState])
                     : reinterpret_cast<float*>(slab + l.master);
  b.grad = grad;
  b.grad_type = u.grad_type;
  b.exp_avg = resident ? u.in_memory[kExpAvgState] : slab + l.exp_avg;
  b.exp_avg_sq = resident ? u.in_memory[kExpAvgSqState] : slab + l.exp_avg_sq;
  b.state_type = options_.moment_type;
  b.stochastic_state = options_.stochastic_moments;
  b.state_seed = kernels::StateRoundingSeed(options_.rounding_seed, hyper.step, u.rounding_stream);
  b.state_index_base = u.rounding_index_base;
  b.param16_out = want16 ? slab + l.param16 : nullptr;
  b.param16_type = options_.param16_type;
  b.n = u.n;
  return b;
}

Result<OptimizerStepStats> OptimizerPipeline::Step(std::span<const OptimizerUnit> units,
                                                   const kernels::AdamHyper& hyper,
                                                   const std::function<void(size_t)>* on_unit_written,
                                                   const UpdatedFn* on_unit_updated,
                                                   StepHashing* hashing,
                                                   const GateFn* before_grad) {
  const size_t count = units.size();
  ZINF_RETURN_IF_ERROR(CheckUnits(units, hashing));
  const unsigned depth = options_.depth;
  Tracer* tracer = options_.tracer && options_.tracer->enabled() ? options_.tracer : nullptr;
  const int adam_track = tracer ? tracer->Track("adam") : 0;
  OptimizerStepStats stats;
  stats.units = static_cast<unsigned>(count);
  StepIo io(*this, units, on_unit_written, stats);

  if (hashing != nullptr && hashing->compute) hashing->written.assign(count, StateHashes{});
  const auto t0 = Clock::now();
  {
    std::lock_guard lock(io.st.mu);
    for (size_t i = 0; i < count && i < depth; ++i) io.SubmitReads(i);
  }
  Status failure;
  // Gradient shards come up one unit ahead, from the computing thread (an Acquire may wait for
  // memory, which must never happen on the engine's reaper thread).
  std::vector<std::optional<Lease>> grad_leases(count);
  auto acquire_grad = [&](size_t j) -> Status {
    if (j >= count || !units[j].grad_shard || grad_leases[j]) return Status::Ok();
    ZINF_ASSIGN_OR_RETURN(Lease l, options_.grads->Acquire(
                                       *units[j].grad_shard, Tier::kHost,
                                       options_.untraced_grads ? AcquireMode::kReadUntraced
                                                               : AcquireMode::kRead));
    grad_leases[j].emplace(std::move(l));
    return Status::Ok();
  };
  for (size_t i = 0; i < count; ++i) {
    const OptimizerUnit& u = units[i];
    // After a failed read or write, take nothing more: an acquire could wait for memory held
    // by a unit whose write will never be reported done (on_unit_written is not called).
    if (io.Failed()) break;
    std::array<Extent, kStateRoles> outs = {u.master_out, u.exp_avg_out, u.exp_avg_sq_out};
    if (before_grad != nullptr) {
      if (Status g = (*before_grad)(i, &outs); !g.ok()) { failure = g; break; }
      if (Status g = CheckGateOutputs(i, u, outs); !g.ok()) { failure = g; break; }
    }
    if (Status g = acquire_grad(i); !g.ok()) { failure = g; break; }
    if (before_grad == nullptr) {  // the next unit's gradient may not be final yet
      if (Status g = acquire_grad(i + 1); !g.ok()) { failure = g; break; }
    }
    const void* grad = u.grad;
    if (grad_leases[i]) {
      auto p = grad_leases[i]->Wait();
      if (!p.ok()) { failure = p.status(); break; }
      grad = *p;
    }
    Layout l = LayoutFor(u.n);
    uint8_t* slab = slabs_[i % depth].data;
    if (!io.WaitReads(i)) break;
    const std::pair<const Extent*, uint64_t> state_parts[kStateRoles] = {
        {&u.master, l.master}, {&u.exp_avg, l.exp_avg}, {&u.exp_avg_sq, l.exp_avg_sq}};
    const bool resident = u.in_memory[0] != nullptr;
    if (hashing != nullptr && !hashing->expected.empty() && !resident) {
      // The state as read, before anything of the unit is written: a mismatch never trains on.
      auto h0 = Clock::now();
      failure = CheckReadHashes(i, u, slab, hashing->expected[i]);
      stats.hash_seconds += std::chrono::duration<double>(Clock::now() - h0).count();
      if (!failure.ok()) break;
    }
    // For the caller only when there is one to hand it to (a synchronous step of a unit whose
    // 16-bit weights are derived has none: they are cast again from the master when loaded).
    const bool want16 =
        u.param16.bytes != 0 || (u.param16_to_caller && on_unit_updated != nullptr);
    const kernels::AdamBuffers b = BuffersFor(u, slab, grad, hyper, want16);
    auto a0 = Clock::now();
    auto info = RunAdam(i, hyper, b, tracer);
    auto a1 = Clock::now();
    // The 16-bit copy goes home padded to the alignment: with zeros, not an earlier unit's bytes.
    if (want16) std::memset(slab + l.param16 + 2 * u.n, 0, l.param16_bytes - 2 * u.n);
    if (grad_leases[i]) {
      Status r = options_.grads->Release(std::move(*grad_leases[i]), false);
      grad_leases[i].reset();
      if (!r.ok() && info.ok()) info = r;
    }
    stats.adam_seconds += std::chrono::duration<double>(a1 - a0).count();
    if (info.ok() && on_unit_updated != nullptr && want16) {
      (*on_unit_updated)(i, slab + l.param16);
    }
    if (tracer) tracer->Complete(adam_track, fmt::format("adam unit {}", i), a0, a1, "compute");
    if (!info.ok()) {
      failure = info.status().WithContext(fmt::format("optimizer unit {}", i));
      break;
    }
    if (hashing != nullptr && hashing->compute && !resident) {
      auto h0 = Clock::now();
      for (int r = 0; r < kStateRoles; ++r) {
        hashing->written[i][r] =
            Xxh64(slab + state_parts[r].second, StateRoleBytes(r, u.n, options_.moment_type));
      }
      stats.hash_seconds += std::chrono::duration<double>(Clock::now() - h0).count();
    }
    io.SubmitWrites(i, outs);
  }
  for (auto& l : grad_leases) {
    if (l) options_.grads->Release(std::move(*l), false).IgnoreError();
  }
  // Nothing may still point into the slabs or at the step's state when we return.
  const Status io_error = io.Drain();
  if (failure.ok()) failure = io_error;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!failure.ok()) return failure;
  return stats;
}

}  // namespace zinf::offload
