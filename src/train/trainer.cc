#include "src/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/host_info.h"
#include "src/base/log.h"
#include "src/base/trace.h"
#include "src/base/units.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/checkpoint.h"
#include "src/train/data.h"
#include "src/train/executor.h"
#include "src/train/loss_scaler.h"
#include "src/train/lr_schedule.h"
#include "src/train/placement.h"
#include "src/train/planner.h"
#include "src/train/ranks.h"
#include "src/train/sizing.h"
#include "src/train/trainer_setup.h"
#include "src/train/weights_io.h"

namespace zinf::train {
namespace {

std::string FormatEta(double seconds) {
  if (!(seconds >= 0)) return "?";
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// Mean validation loss over `batches` fixed batches.
Result<double> Validate(LayerExecutor& ex, BatchSampler& val, uint32_t batches) {
  std::vector<int32_t> x(val.tokens_per_batch()), y(val.tokens_per_batch());
  double sum = 0;
  for (uint32_t i = 0; i < batches; ++i) {
    val.Fill(i, x.data(), y.data());
    ZINF_ASSIGN_OR_RETURN(double l, ex.Evaluate(x.data(), y.data()));
    sum += l;
  }
  return sum / batches;
}

}  // namespace

std::string TrainSummary::ToJson() const {
  nlohmann::json j = {{"steps", steps},
                      {"skipped_steps", skipped_steps},
                      {"params", params},
                      {"tokens_per_step", tokens_per_step},
                      {"first_loss", first_loss},
                      {"final_loss", final_loss},
                      {"tokens_per_s", tokens_per_s},
                      {"step_seconds_median", step_seconds_median},
                      {"stall_fraction", stall_fraction},
                      {"nvme_read_bytes", nvme_read_bytes},
                      {"nvme_write_bytes", nvme_write_bytes},
                      {"peak_device_bytes", peak_device_bytes},
                      {"device_budget_bytes", device_budget_bytes},
                      {"peak_pinned_bytes", peak_pinned_bytes},
                      {"prefetch_hits", prefetch_hits},
                      {"h2d_bytes", h2d_bytes},
                      {"d2h_bytes", d2h_bytes},
                      {"h2d_bytes_step_median", h2d_bytes_step_median},
                      {"d2h_bytes_step_median", d2h_bytes_step_median},
                      {"plan_h2d_bytes_per_step", plan_h2d_bytes_per_step},
                      {"plan_d2h_bytes_per_step", plan_d2h_bytes_per_step},
                      {"device_evictions", device_evictions},
                      {"host_evictions", host_evictions},
                      {"peak_rss_bytes", peak_rss_bytes},
                      {"prefetch_misses", prefetch_misses},
                      {"param16_installs", param16_installs},
                      {"param16_derived_load_bytes", param16_derived_load_bytes},
                      {"pinned_budget_bytes", pinned_budget_bytes},
                      {"device", device},
                      {"backend", backend},
                      {"io_engine", io_engine}};
  if (val_loss >= 0) j["val_loss"] = val_loss;
  if (resumed_from_step > 0) j["resumed_from_step"] = resumed_from_step;
  if (stopped) j["stopped"] = true;
  if (!last_checkpoint.empty()) {
    j["checkpoints"] = checkpoints;
    j["last_checkpoint"] = last_checkpoint;
    j["checkpoint_writer_seconds"] = checkpoint_writer_seconds;
    j["checkpoint_bytes_written"] = checkpoint_bytes_written;
    j["checkpoint_step_seconds_median"] = checkpoint_step_seconds_median;
    j["other_step_seconds_median"] = other_step_seconds_median;
    if (plain_copies > 0) {
      j["plain_copies"] = plain_copies;
      j["plain_copy_bytes"] = plain_copy_bytes;
      j["plain_copy_seconds"] = plain_copy_seconds;
    }
  }
  if (world > 1) {
    j["world"] = world;
    j["transport"] = transport;
    j["comm_sent_bytes_per_step"] = comm_sent_bytes_per_step;
    j["comm_received_bytes_per_step"] = comm_received_bytes_per_step;
    j["grad_comm_sent_bytes_per_step"] = grad_comm_sent_bytes_per_step;
    j["comm_seconds_per_step"] = comm_seconds;
  }
  j["optimizer_state_bytes"] = optimizer_state_bytes;
  j["optimizer_state_memory_bytes"] = optimizer_state_memory_bytes;
  j["nvme_read_bytes_step_median"] = nvme_read_bytes_step_median;
  j["nvme_write_bytes_step_median"] = nvme_write_bytes_step_median;
  if (plan_nvme_read_bytes_per_step > 0 || plan_nvme_write_bytes_per_step > 0) {
    j["plan_nvme_read_bytes_per_step"] = plan_nvme_read_bytes_per_step;
    j["plan_nvme_write_bytes_per_step"] = plan_nvme_write_bytes_per_step;
  }
  j["optimizer_state_nvme_bytes"] = optimizer_state_nvme_bytes;
  j["placement"] = placement;
  j["gradient_bytes"] = gradient_bytes;
  j["param16_bytes"] = param16_bytes;
  j["param16_derived_bytes"] = param16_derived_bytes;
  j["swap_file_bytes"] = swap_file_bytes;
  j["compute_seconds_per_step"] = compute_seconds;
  j["stall_seconds_per_step"] = stall_seconds;
  j["optimizer_wait_seconds_per_step"] = optimizer_wait_seconds;
  j["grad_seconds_per_step"] = grad_seconds;
  j["optimizer_seconds_per_step"] = optimizer_seconds;
  j["adam_seconds_per_step"] = adam_seconds;
  if (step_over_bound > 0) {
    j["compute_bound_seconds"] = compute_bound_seconds;
    j["io_bound_seconds"] = io_bound_seconds;
    j["adam_bound_seconds"] = adam_bound_seconds;
    if (world > 1) j["comm_bound_seconds"] = comm_bound_seconds;
    j["step_over_bound"] = step_over_bound;
  }
  return j.dump();
}

Result<TrainSummary> Train(const TrainOptions& opt) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<TrainRun> run, SetUpRun(opt));
  // The set-up's objects, under the names the loop has always used.
  const Config& c = run->c;
  const CheckpointConfig& ck = c.zinf.checkpoint;
  Ranks& ranks = run->ranks;
  const bool lead = ranks.lead();
  const uint64_t world = static_cast<uint64_t>(ranks.world());
  const TrainerState& resumed = run->resumed;
  const GptDims& dims = run->dims;
  const uint32_t B = run->B;
  const uint32_t T = run->T;
  const uint64_t gas = run->gas;
  const bool fp16 = run->fp16;
  BatchSampler& train_data = *run->train_data;
  std::optional<BatchSampler>& val_data = run->val_data;
  LrSchedule& schedule = *run->schedule;
  LossScaler& scaler = *run->scaler;
  const std::string& trace_path = run->trace_path;
  Tracer& tracer = *run->tracer;
  const ExecutorOptions& eo = run->eo;
  const StatePlacement& placement = run->placement;
  std::unique_ptr<OffloadRuntime>& rt = run->rt;
  std::unique_ptr<Backend<float>>& backend = run->backend;
  std::unique_ptr<LayerExecutor>& ex = run->ex;
  std::unique_ptr<Checkpointer>& checkpointer = run->checkpointer;
  std::ofstream losses;
  if (!opt.losses_path.empty() && lead) {
    losses.open(opt.losses_path, std::ios::trunc);
    if (!losses) return Status::FromErrno(errno, "open --losses file " + opt.losses_path);
  }

  TrainSummary sum;
  sum.params = dims.TotalParams();
  sum.tokens_per_step = uint64_t{B} * T * gas * world;  // the global batch
  sum.world = ranks.world();
  sum.rank = ranks.rank();
  sum.device = rt->device->Describe();
  sum.backend = std::string(backend->name());
  sum.io_engine = rt->engine ? std::string(rt->engine->name()) : "none";
  std::vector<int32_t> x(uint64_t{B} * T), y(uint64_t{B} * T);
  std::vector<double> step_times;
  std::vector<double> step_reads, step_writes;  // NVMe bytes of each step
  std::vector<double> step_h2d, step_d2h;       // link bytes of each step
  // Steps a checkpoint's commit overlapped (the one after each Save) and the others.
  std::vector<double> commit_step_times, other_step_times;
  bool committing = false;
  double stall_total = 0, time_total = 0;
  uint64_t applied = resumed.applied;
  sum.skipped_steps = resumed.skipped;
  sum.resumed_from_step = resumed.step;
  offload::TierStats prev = rt->tiers->stats();
  uint64_t prev_opt_rd = 0, prev_opt_wr = 0;
  const bool overlap = c.zinf.overlap_adam;
  double prev_clip = resumed.prev_clip;
  auto checkpoint_due = [&](uint64_t step) {  // after step (0-based) `step`
    return checkpointer != nullptr &&
           ((ck.every > 0 && (step + 1) % ck.every == 0) || step + 1 == opt.steps);
  };
  for (uint64_t step = resumed.step; step < opt.steps; ++step) {
    auto t0 = TrainClock::now();
    const bool commit_overlaps = std::exchange(committing, false);
    // The optimizer hashes the state it writes when a checkpoint of it follows.
    if (checkpoint_due(step)) ex->HashNextOptimizerStep();
    const ExecutorStats before = ex->stats();
    const double loss_scale = fp16 ? scaler.scale() : 1.0;
    double loss = 0;
    bool finite = true;
    const double lr = schedule.LrForStep(applied);
    auto hyper_with = [&](double clip) {
      kernels::AdamHyper h;
      h.lr = static_cast<float>(lr);
      h.beta1 = static_cast<float>(c.optimizer.beta1);
      h.beta2 = static_cast<float>(c.optimizer.beta2);
      h.eps = static_cast<float>(c.optimizer.eps);
      h.weight_decay = static_cast<float>(c.optimizer.weight_decay);
      h.adamw = c.optimizer.DecoupledWeightDecay();
      h.bias_correction = c.optimizer.bias_correction;
      h.step = static_cast<int64_t>(applied + 1);
      h.grad_scale = static_cast<float>(clip / loss_scale);
      return h;
    };
    // With overlap_adam the units are updated during the last backward, clipped with the
    // coefficient of the previous step's norm (the current one is not known yet).
    const kernels::AdamHyper overlap_hyper = hyper_with(prev_clip);
    offload::OptimizerStepStats os;
    // The step's global batch in the order one rank reads it; this rank's share is the
    // micro-batches [rank * gas, (rank + 1) * gas) (ranks.h).
    const uint64_t global_mb = gas * world;
    std::vector<double> mb_losses;
    for (uint64_t g = 0; g < global_mb; ++g) {
      train_data.Next(x.data(), y.data());
      if (g / gas != static_cast<uint64_t>(ranks.rank())) continue;
      const uint64_t m = g % gas;
      const bool last = m + 1 == gas;
      // As DeepSpeed: the loss is divided by the accumulation count (over every rank) before
      // backward, so the 16-bit gradients are loss_scale * g / (gas * world) (an fp16 overflow
      // happens where it would there).
      ZINF_ASSIGN_OR_RETURN(
          MicroBatchResult r,
          ex->ForwardBackward(x.data(), y.data(),
                              static_cast<float>(loss_scale / static_cast<double>(global_mb)),
                              1.0f, m == 0, last, overlap && last ? &overlap_hyper : nullptr));
      mb_losses.push_back(r.loss);
      finite = finite && r.finite;
      if (overlap && last) os = r.optimizer;
    }
    ZINF_ASSIGN_OR_RETURN(loss, MeanLoss(ranks, mb_losses));
    bool skip = !finite;
    if (fp16) {
      ZINF_ASSIGN_OR_RETURN(bool scaler_skip, scaler.Update(!finite));
      skip = skip || scaler_skip;
    }
    double norm = std::sqrt(ex->grad_sum_squares()) / loss_scale;
    double clip = 1.0;
    if (c.train.gradient_clipping > 0 && std::isfinite(norm)) {
      clip = std::min(1.0, c.train.gradient_clipping / (norm + 1e-6));
    }
    if (overlap) {
      ++applied;  // already applied unit by unit (a non-finite gradient would have failed)
    } else if (!skip) {
      ZINF_ASSIGN_OR_RETURN(os, ex->OptimizerStep(hyper_with(clip)));
      ++applied;
    } else {
      ++sum.skipped_steps;
      ZINF_RETURN_IF_ERROR(ex->DiscardGradients());
    }
    prev_clip = clip;
    // The last step's optimizer finishes inside its own time (the others run under the next
    // forward).
    if (step + 1 == opt.steps) ZINF_RETURN_IF_ERROR(ex->FinishOptimizerStep());
    ex->EndStep();
    const double dt = SecondsSince(t0);
    step_times.push_back(dt);
    // Not the run's first step (no optimizer step under its forward) nor its last (its own
    // optimizer step inside): their times are not comparable.
    if (step != resumed.step && step + 1 != opt.steps) {
      (commit_overlaps ? commit_step_times : other_step_times).push_back(dt);
    }
    const ExecutorStats after = ex->stats();
    // Waiting for weights: their transfer, or the previous optimizer step's writes of them.
    const double stall = after.stall_seconds + after.optimizer_wait_seconds -
                         before.stall_seconds - before.optimizer_wait_seconds;
    stall_total += stall;
    time_total += dt;
    const offload::TierStats ts = rt->tiers->stats();
    const uint64_t opt_rd = after.optimizer_bytes_read, opt_wr = after.optimizer_bytes_written;
    const double rd = static_cast<double>(ts.nvme_read_bytes - prev.nvme_read_bytes + opt_rd - prev_opt_rd);
    const double wr = static_cast<double>(ts.nvme_write_bytes - prev.nvme_write_bytes + opt_wr - prev_opt_wr);
    const double h2d = static_cast<double>(ts.h2d_bytes - prev.h2d_bytes +
                                           after.gathered_h2d_bytes - before.gathered_h2d_bytes);
    const double d2h = static_cast<double>(ts.d2h_bytes - prev.d2h_bytes + after.grad_d2h_bytes -
                                           before.grad_d2h_bytes);
    const uint64_t dev_ev = ts.device_evictions - prev.device_evictions;
    const uint64_t host_ev = ts.host_evictions - prev.host_evictions;
    step_reads.push_back(rd);
    step_writes.push_back(wr);
    step_h2d.push_back(h2d);
    step_d2h.push_back(d2h);
    prev = ts;
    prev_opt_rd = opt_rd;
    prev_opt_wr = opt_wr;
    if (step == resumed.step) sum.first_loss = loss;
    sum.final_loss = loss;
    sum.steps = step + 1;

    double val = -1;
    if (val_data && ((step + 1) % opt.eval_every == 0 || step + 1 == opt.steps)) {
      ZINF_ASSIGN_OR_RETURN(val, Validate(*ex, *val_data, opt.eval_batches));
      sum.val_loss = val;
    }
    if (losses.is_open()) {
      nlohmann::json j = {{"step", step + 1}, {"loss", loss}, {"lr", lr},
                          {"grad_norm", norm}, {"skipped", skip}, {"seconds", dt},
                          {"nvme_read_bytes", static_cast<uint64_t>(rd)},
                          {"nvme_write_bytes", static_cast<uint64_t>(wr)}};
      if (fp16) j["loss_scale"] = loss_scale;
      if (val >= 0) j["val_loss"] = val;
      // Flushed each step: after a crash the file holds every step a checkpoint covers.
      losses << j.dump() << "\n" << std::flush;
      if (!losses) return IoError("write --losses file " + opt.losses_path);
    }
    if (opt.progress && lead && (step % std::max<uint64_t>(1, c.train.steps_per_print) == 0 ||
                         step + 1 == opt.steps)) {
      const double avg = time_total / static_cast<double>(step + 1);
      std::string line = fmt::format(
          "step {:>4}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | stall {:.0f}% | "
          "nvme r {:.2f} w {:.2f} GB/s | h2d {:.2f} d2h {:.2f} GB/s | evicted dev {} host {} | "
          "{:.2f} s | ETA {}",
          step + 1, opt.steps, loss, val >= 0 ? fmt::format(" (val {:.4f})", val) : "", lr, norm,
          static_cast<double>(sum.tokens_per_step) / dt, 100.0 * stall / dt, rd / dt / 1e9,
          wr / dt / 1e9, h2d / dt / 1e9, d2h / dt / 1e9, dev_ev, host_ev, dt,
          FormatEta(avg * static_cast<double>(opt.steps - step - 1)));
      if (skip) line += fp16 ? fmt::format(" | SKIPPED (overflow, scale now {:g})", scaler.scale())
                             : " | SKIPPED (non-finite gradients)";
      opt.progress(line);
    }
    if (commit_overlaps && opt.compare_checkpoint_copy) {
      // The yardstick, between steps (outside every step's time): a plain copy of the bytes
      // the checkpoint just committed.
      ZINF_ASSIGN_OR_RETURN(const double copy, checkpointer->MeasurePlainCopy());
      const CheckpointStats cs = checkpointer->stats();
      Log().info("train: checkpoint of step {}: committed in {:.3f} s on the writer thread, "
                 "overlapping step {} ({:.3f} s); a plain copy of its {} took {:.3f} s",
                 cs.last_step, cs.last_writer_seconds, step + 1, dt,
                 FormatBytesHuman(cs.plain_copy_bytes / cs.plain_copies), copy);
    }
    const bool stop_here =
        ((opt.stop != nullptr && opt.stop->load()) || step + 1 == opt.stop_after) &&
        step + 1 < opt.steps;
    ZINF_ASSIGN_OR_RETURN(const bool stop, AnyRank(ranks, stop_here));
    if (checkpoint_due(step) || (stop && checkpointer != nullptr)) {
      TrainerState st;
      st.step = step + 1;
      st.applied = applied;
      st.skipped = sum.skipped_steps;
      st.prev_clip = prev_clip;
      st.scaler = scaler.state();
      st.data_position = train_data.position();
      st.data = train_data.source();
      ZINF_RETURN_IF_ERROR(checkpointer->Save(*ex, st));
      committing = true;
    }
    if (stop) {
      Log().warn("train: stopped by request after step {}{}", step + 1,
                 checkpointer != nullptr ? "; committing its checkpoint" : "");
      sum.stopped = true;
      break;
    }
  }

  ZINF_RETURN_IF_ERROR(ex->FinishOptimizerStep());  // a run stopped early
  if (checkpointer != nullptr) {
    ZINF_RETURN_IF_ERROR(checkpointer->Wait());
    const CheckpointStats cs = checkpointer->stats();
    sum.checkpoints = cs.committed;
    sum.last_checkpoint = cs.last_dir;
    sum.checkpoint_writer_seconds = cs.writer_seconds;
    sum.checkpoint_bytes_written = cs.bytes_written;
    sum.checkpoint_step_seconds_median = Median(commit_step_times);
    sum.other_step_seconds_median = Median(other_step_times);
    sum.plain_copies = cs.plain_copies;
    sum.plain_copy_bytes = cs.plain_copy_bytes;
    sum.plain_copy_seconds = cs.plain_copy_seconds;
  }
  const offload::TierStats ts = rt->tiers->stats();
  const ExecutorStats es_total = ex->stats();
  sum.step_seconds_median = Median(step_times);
  sum.nvme_read_bytes_step_median = Median(step_reads);
  sum.nvme_write_bytes_step_median = Median(step_writes);
  sum.h2d_bytes_step_median = Median(step_h2d);
  sum.d2h_bytes_step_median = Median(step_d2h);
  {
    // What zinf plan predicts of this run's NVMe and link bytes a step, beside what it moved
    // (across ranks: rank 0's, which reports them).
    PlanInputs pin;
    pin.dims = dims;
    pin.world = static_cast<uint32_t>(ranks.shard_world());
    pin.batch = static_cast<int>(B);
    pin.seq = static_cast<int>(T);
    pin.micro_batches = static_cast<uint32_t>(gas);
    pin.pinned_budget = rt->pool->budget_bytes();
    pin.state_generations = eo.state_generations;
    pin.align = rt->swap != nullptr ? rt->swap->offset_align() : 4096;
    pin.device_budget = rt->device->budget_bytes();
    pin.device_reserved = ex->stats().device_reserved_bytes;
    const Plan plan = PlanRun(c, pin, placement, {});
    if (UsesNvme(c)) {
      sum.plan_nvme_read_bytes_per_step = plan.nvme_read_per_step;
      sum.plan_nvme_write_bytes_per_step = plan.nvme_write_per_step;
    }
    sum.plan_h2d_bytes_per_step = plan.h2d_per_step;
    sum.plan_d2h_bytes_per_step = plan.d2h_per_step;
  }
  sum.tokens_per_s = time_total > 0 ? static_cast<double>(sum.tokens_per_step * sum.steps) / time_total : 0;
  sum.stall_fraction = time_total > 0 ? stall_total / time_total : 0;
  sum.nvme_read_bytes = ts.nvme_read_bytes + es_total.optimizer_bytes_read;
  sum.nvme_write_bytes = ts.nvme_write_bytes + es_total.optimizer_bytes_written;
  sum.prefetch_hits = ts.prefetch_hits;
  sum.prefetch_misses = ts.prefetch_misses;
  sum.param16_installs = ts.installs;
  sum.param16_derived_load_bytes = ts.derived_bytes;
  sum.peak_device_bytes = ts.peak_device_bytes;
  sum.device_budget_bytes = rt->device->budget_bytes();
  sum.peak_pinned_bytes = ts.peak_host_bytes;
  sum.h2d_bytes = ts.h2d_bytes + es_total.gathered_h2d_bytes;
  sum.d2h_bytes = ts.d2h_bytes + es_total.grad_d2h_bytes;
  sum.device_evictions = ts.device_evictions;
  sum.host_evictions = ts.host_evictions;
  sum.peak_rss_bytes = PeakRssBytes();
  if (sum.steps > 0) {
    const ExecutorStats es = ex->stats();
    const double n = static_cast<double>(sum.steps);
    sum.compute_seconds = es.compute_seconds / n;
    sum.stall_seconds = (es.stall_seconds + es.optimizer_wait_seconds) / n;
    sum.optimizer_wait_seconds = es.optimizer_wait_seconds / n;
    sum.grad_seconds = es.grad_seconds / n;
    sum.optimizer_seconds = es.optimizer_seconds / n;
    sum.adam_seconds = es.adam_seconds / n;
  }
  sum.pinned_budget_bytes = rt->pool->budget_bytes();
  sum.optimizer_state_bytes = StateBytesPerParam(c) * ex->StateParams();
  sum.optimizer_state_memory_bytes = ex->StateBytesInMemory();
  sum.optimizer_state_nvme_bytes = ex->StateBytesOnNvme();
  sum.placement = eo.optimizer_on_nvme ? placement.Describe(dims) : "every unit in memory";
  sum.gradient_bytes = ex->GradShardBytes();
  sum.param16_bytes = ex->Param16ShardBytes();
  sum.param16_derived_bytes = ex->Param16DerivedBytes();
  sum.swap_file_bytes = rt->swap != nullptr ? rt->swap->capacity() : 0;

  if (ranks.comm != nullptr) {
    // Every communicator's bytes (HYBRID_SHARD: the world's, the node's and the replicas').
    uint64_t sent = 0, received = 0;
    for (const auto* cm : {&ranks.comm, &ranks.shard_comm, &ranks.replica_comm}) {
      if (*cm == nullptr) continue;
      const comm::CommStats cs = (*cm)->stats();
      sent += cs.total_sent();
      received += cs.total_received();
    }
    const double n = static_cast<double>(std::max<uint64_t>(1, sum.steps));
    sum.comm_sent_bytes_per_step = static_cast<double>(sent) / n;
    sum.comm_received_bytes_per_step = static_cast<double>(received) / n;
    sum.grad_comm_sent_bytes_per_step = static_cast<double>(es_total.grad_comm_sent_bytes) / n;
    sum.comm_seconds = es_total.comm_seconds / n;
    sum.transport = ranks.comm->Describe();
    if (ranks.shard_comm != nullptr) {
      sum.transport += fmt::format("; HYBRID_SHARD: {} nodes of {} ranks",
                                   ranks.replica_comm->world(), ranks.shard_comm->world());
    }
  }
  if (opt.profile && sum.steps > 0 && !sum.stopped) {
    ZINF_ASSIGN_OR_RETURN(ProfileBounds b, ex->MeasureBounds(x.data(), y.data(), gas));
    sum.compute_bound_seconds = b.compute_seconds;
    // The step's NVMe bytes at the rates the raw engine reaches alone on the same file.
    const double steps_d = static_cast<double>(sum.steps);
    const double rd = static_cast<double>(sum.nvme_read_bytes) / steps_d;
    const double wr = static_cast<double>(sum.nvme_write_bytes) / steps_d;
    sum.io_bound_seconds = (b.read_gbps > 0 ? rd / (b.read_gbps * 1e9) : 0) +
                           (b.write_gbps > 0 ? wr / (b.write_gbps * 1e9) : 0);
    sum.adam_bound_seconds = b.adam_seconds;
    sum.comm_bound_seconds = b.comm_seconds;
    const double bound = std::max({sum.compute_bound_seconds, sum.io_bound_seconds,
                                   sum.adam_bound_seconds, sum.comm_bound_seconds});
    sum.step_over_bound = bound > 0 ? sum.step_seconds_median / bound : 0;
  }
  // Rank 0 writes what the run leaves; with the optimizer state partitioned every rank takes
  // part in gathering the weights it saves.
  if (!opt.save_path.empty() && (lead || eo.partition_optimizer)) {
    ZINF_RETURN_IF_ERROR(SaveWeights(*ex, opt.save_path, lead));
  }
  if (!lead) return sum;
  if (!trace_path.empty()) ZINF_RETURN_IF_ERROR(tracer.Write(trace_path));
  if (!opt.summary_path.empty()) {
    std::ofstream out(opt.summary_path, std::ios::trunc);
    out << sum.ToJson() << "\n";
    if (!out) return IoError("write --summary-json file " + opt.summary_path);
  }
  return sum;
}

}  // namespace zinf::train
