#include "src/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/log.h"
#include "src/base/units.h"
#include "src/train/checkpoint.h"
#include "src/train/data.h"
#include "src/train/loss_scaler.h"
#include "src/train/lr_schedule.h"
#include "src/train/ranks.h"
#include "src/train/train_loop.h"

namespace zinf::train {
namespace {

std::string FormatEta(double seconds) {
  if (!(seconds >= 0)) return "?";
  const auto s = static_cast<uint64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

Result<TrainSummary> Train(const TrainOptions& opt) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<TrainRun> run, SetUpRun(opt));
  TrainLoop loop(opt, *run);
  ZINF_RETURN_IF_ERROR(loop.Run());
  return loop.Summarize();
}

TrainLoop::TrainLoop(const TrainOptions& opt, TrainRun& run)
    : opt_(opt), run_(run), c_(run.c), ex_(*run.ex) {
  const uint64_t tokens = uint64_t{run.B} * run.T;
  x_.resize(tokens);
  y_.resize(tokens);
  sum_.params = run.model.TotalParams();
  sum_.tokens_per_step = tokens * run.gas * static_cast<uint64_t>(run.ranks.world());
  sum_.world = run.ranks.world();
  sum_.rank = run.ranks.rank();
  sum_.device = run.rt->device->Describe();
  sum_.backend = std::string(run.backend->name());
  sum_.io_engine = run.rt->engine ? std::string(run.rt->engine->name()) : "none";
  sum_.skipped_steps = run.resumed.skipped;
  sum_.resumed_from_step = run.resumed.step;
  applied_ = run.resumed.applied;
  prev_clip_ = run.resumed.prev_clip;
  prev_tiers_ = run.rt->tiers->stats();
}

Status TrainLoop::Run() {
  if (!opt_.losses_path.empty() && run_.ranks.lead()) {
    losses_.open(opt_.losses_path, std::ios::trunc);
    if (!losses_) return Status::FromErrno(errno, "open --losses file " + opt_.losses_path);
  }
  for (uint64_t step = run_.resumed.step; step < opt_.steps; ++step) {
    const auto t0 = TrainClock::now();
    const bool commit_overlaps = std::exchange(committing_, false);
    // The optimizer hashes the state it writes when a checkpoint of it follows.
    if (CheckpointDue(step)) ex_.HashNextOptimizerStep();
    const ExecutorStats before = ex_.stats();
    ZINF_ASSIGN_OR_RETURN(StepRecord r, RunStep(step));
    r.seconds = SecondsSince(t0);
    // Not the run's first step (no optimizer step under its forward) nor its last (its own
    // optimizer step inside): their times are not comparable.
    if (step != run_.resumed.step && step + 1 != opt_.steps) {
      (commit_overlaps ? acc_.commit_step_times : acc_.other_step_times).push_back(r.seconds);
    }
    Account(step, r, before);
    ZINF_RETURN_IF_ERROR(Evaluate(step, r));
    ZINF_RETURN_IF_ERROR(Report(step, r));
    if (commit_overlaps && opt_.compare_checkpoint_copy) {
      // The yardstick, between steps (outside every step's time): a plain copy of the bytes
      // the checkpoint just committed.
      ZINF_ASSIGN_OR_RETURN(const double copy, run_.checkpointer->MeasurePlainCopy());
      const CheckpointStats cs = run_.checkpointer->stats();
      Log().info("train: checkpoint of step {}: committed in {:.3f} s on the writer thread, "
                 "overlapping step {} ({:.3f} s); a plain copy of its {} took {:.3f} s",
                 cs.last_step, cs.last_writer_seconds, step + 1, r.seconds,
                 FormatBytesHuman(cs.plain_copy_bytes / cs.plain_copies), copy);
    }
    ZINF_ASSIGN_OR_RETURN(const bool stop, CheckpointOrStop(step));
    if (stop) break;
  }
  ZINF_RETURN_IF_ERROR(ex_.FinishOptimizerStep());  // a run stopped early
  if (run_.checkpointer != nullptr) ZINF_RETURN_IF_ERROR(run_.checkpointer->Wait());
  return Status::Ok();
}

// The step, as llm.c's loop reads: batch, forward and backward, the gradients handed over (in
// ForwardBackward), overflow, clip, optimizer.
Result<StepRecord> TrainLoop::RunStep(uint64_t step) {
  StepRecord r;
  r.loss_scale = run_.fp16 ? run_.scaler->scale() : 1.0;
  r.lr = run_.schedule->LrForStep(applied_);
  // With overlap_adam the units are updated during the last backward, clipped with the
  // coefficient of the previous step's norm (the current one is not known yet).
  const bool overlap = c_.zinf.overlap_adam;
  const kernels::AdamHyper overlap_hyper = Hyper(r, prev_clip_);
  ZINF_ASSIGN_OR_RETURN(MicroBatches mb, ForwardBackward(r, overlap ? &overlap_hyper : nullptr));
  ZINF_ASSIGN_OR_RETURN(r.loss, MeanLoss(run_.ranks, mb.losses));
  r.skip = !mb.finite;
  if (run_.fp16) {
    ZINF_ASSIGN_OR_RETURN(const bool scaler_skip, run_.scaler->Update(!mb.finite));
    r.skip = r.skip || scaler_skip;
  }
  r.norm = std::sqrt(ex_.grad_sum_squares()) / r.loss_scale;
  const double clip = ClipCoefficient(r.norm);
  ZINF_RETURN_IF_ERROR(Update(r, clip));
  prev_clip_ = clip;
  // The last step's optimizer finishes inside its own time (the others run under the next
  // forward).
  if (step + 1 == opt_.steps) ZINF_RETURN_IF_ERROR(ex_.FinishOptimizerStep());
  ex_.EndStep();
  return r;
}

// The step's global batch in the order one rank reads it; this rank's share is the
// micro-batches [rank * gas, (rank + 1) * gas) (ranks.h).
Result<TrainLoop::MicroBatches> TrainLoop::ForwardBackward(const StepRecord& r,
                                                           const kernels::AdamHyper* overlap) {
  MicroBatches mb;
  const uint64_t gas = run_.gas;
  const uint64_t global_mb = gas * static_cast<uint64_t>(run_.ranks.world());
  for (uint64_t g = 0; g < global_mb; ++g) {
    run_.train_data->Next(x_.data(), y_.data());
    if (g / gas != static_cast<uint64_t>(run_.ranks.rank())) continue;
    const uint64_t m = g % gas;
    const bool last = m + 1 == gas;
    // As DeepSpeed: the loss is divided by the accumulation count (over every rank) before
    // backward, so the 16-bit gradients are loss_scale * g / (gas * world) (an fp16 overflow
    // happens where it would there).
    ZINF_ASSIGN_OR_RETURN(
        MicroBatchResult res,
        ex_.ForwardBackward(x_.data(), y_.data(),
                            static_cast<float>(r.loss_scale / static_cast<double>(global_mb)),
                            1.0f, m == 0, last, last ? overlap : nullptr));
    mb.losses.push_back(res.loss);
    mb.finite = mb.finite && res.finite;
  }
  return mb;
}

kernels::AdamHyper TrainLoop::Hyper(const StepRecord& r, double clip) const {
  kernels::AdamHyper h;
  h.lr = static_cast<float>(r.lr);
  h.beta1 = static_cast<float>(c_.optimizer.beta1);
  h.beta2 = static_cast<float>(c_.optimizer.beta2);
  h.eps = static_cast<float>(c_.optimizer.eps);
  h.weight_decay = static_cast<float>(c_.optimizer.weight_decay);
  h.adamw = c_.optimizer.DecoupledWeightDecay();
  h.bias_correction = c_.optimizer.bias_correction;
  h.step = static_cast<int64_t>(applied_ + 1);
  h.grad_scale = static_cast<float>(clip / r.loss_scale);
  return h;
}

// torch.nn.utils.clip_grad_norm_'s coefficient; 1 without clipping or with a non-finite norm.
double TrainLoop::ClipCoefficient(double norm) const {
  if (c_.train.gradient_clipping > 0 && std::isfinite(norm)) {
    return std::min(1.0, c_.train.gradient_clipping / (norm + 1e-6));
  }
  return 1.0;
}

Status TrainLoop::Update(const StepRecord& r, double clip) {
  if (c_.zinf.overlap_adam) {
    ++applied_;  // already applied unit by unit (a non-finite gradient would have failed)
  } else if (!r.skip) {
    ZINF_RETURN_IF_ERROR(ex_.OptimizerStep(Hyper(r, clip)).status());
    ++applied_;
  } else {
    ++sum_.skipped_steps;
    ZINF_RETURN_IF_ERROR(ex_.DiscardGradients());
  }
  return Status::Ok();
}

void TrainLoop::Account(uint64_t step, StepRecord& r, const ExecutorStats& before) {
  acc_.step_times.push_back(r.seconds);
  const ExecutorStats after = ex_.stats();
  // Waiting for weights: their transfer, or the previous optimizer step's writes of them.
  r.stall = after.stall_seconds + after.optimizer_wait_seconds - before.stall_seconds -
            before.optimizer_wait_seconds;
  acc_.stall_total += r.stall;
  acc_.time_total += r.seconds;
  const offload::TierStats ts = run_.rt->tiers->stats();
  const offload::TierStats& prev = prev_tiers_;
  const uint64_t opt_rd = after.optimizer_bytes_read, opt_wr = after.optimizer_bytes_written;
  r.read = static_cast<double>(ts.nvme_read_bytes - prev.nvme_read_bytes + opt_rd -
                               prev_opt_read_);
  r.write = static_cast<double>(ts.nvme_write_bytes - prev.nvme_write_bytes + opt_wr -
                                prev_opt_written_);
  r.h2d = static_cast<double>(ts.h2d_bytes - prev.h2d_bytes + after.gathered_h2d_bytes -
                              before.gathered_h2d_bytes);
  r.d2h = static_cast<double>(ts.d2h_bytes - prev.d2h_bytes + after.grad_d2h_bytes -
                              before.grad_d2h_bytes);
  r.device_evictions = ts.device_evictions - prev.device_evictions;
  r.host_evictions = ts.host_evictions - prev.host_evictions;
  acc_.step_reads.push_back(r.read);
  acc_.step_writes.push_back(r.write);
  acc_.step_h2d.push_back(r.h2d);
  acc_.step_d2h.push_back(r.d2h);
  prev_tiers_ = ts;
  prev_opt_read_ = opt_rd;
  prev_opt_written_ = opt_wr;
  if (step == run_.resumed.step) sum_.first_loss = r.loss;
  sum_.final_loss = r.loss;
  sum_.steps = step + 1;
}

// Mean validation loss over opt.eval_batches fixed batches, every --eval-every steps and at
// the end.
Status TrainLoop::Evaluate(uint64_t step, StepRecord& r) {
  if (!run_.val_data || ((step + 1) % opt_.eval_every != 0 && step + 1 != opt_.steps)) {
    return Status::Ok();
  }
  BatchSampler& val = *run_.val_data;
  std::vector<int32_t> x(val.tokens_per_batch()), y(val.tokens_per_batch());
  double total = 0;
  for (uint32_t i = 0; i < opt_.eval_batches; ++i) {
    val.Fill(i, x.data(), y.data());
    ZINF_ASSIGN_OR_RETURN(const double l, ex_.Evaluate(x.data(), y.data()));
    total += l;
  }
  r.val = total / opt_.eval_batches;
  sum_.val_loss = r.val;
  return Status::Ok();
}

Status TrainLoop::Report(uint64_t step, const StepRecord& r) {
  if (losses_.is_open()) {
    nlohmann::json j = {{"step", step + 1}, {"loss", r.loss}, {"lr", r.lr},
                        {"grad_norm", r.norm}, {"skipped", r.skip}, {"seconds", r.seconds},
                        {"nvme_read_bytes", static_cast<uint64_t>(r.read)},
                        {"nvme_write_bytes", static_cast<uint64_t>(r.write)}};
    if (run_.fp16) j["loss_scale"] = r.loss_scale;
    if (r.val >= 0) j["val_loss"] = r.val;
    // Flushed each step: after a crash the file holds every step a checkpoint covers.
    losses_ << j.dump() << "\n" << std::flush;
    if (!losses_) return IoError("write --losses file " + opt_.losses_path);
  }
  const bool due = step % std::max<uint64_t>(1, c_.train.steps_per_print) == 0 ||
                   step + 1 == opt_.steps;
  if (!opt_.progress || !run_.ranks.lead() || !due) return Status::Ok();
  const double dt = r.seconds;
  const double avg = acc_.time_total / static_cast<double>(step + 1);
  std::string line = fmt::format(
      "step {:>4}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.0f} tok/s | stall {:.0f}% | "
      "nvme r {:.2f} w {:.2f} GB/s | h2d {:.2f} d2h {:.2f} GB/s | evicted dev {} host {} | "
      "{:.2f} s | ETA {}",
      step + 1, opt_.steps, r.loss, r.val >= 0 ? fmt::format(" (val {:.4f})", r.val) : "", r.lr,
      r.norm, static_cast<double>(sum_.tokens_per_step) / dt, 100.0 * r.stall / dt,
      r.read / dt / 1e9, r.write / dt / 1e9, r.h2d / dt / 1e9, r.d2h / dt / 1e9,
      r.device_evictions, r.host_evictions, dt,
      FormatEta(avg * static_cast<double>(opt_.steps - step - 1)));
  if (r.skip) {
    line += run_.fp16 ? fmt::format(" | SKIPPED (overflow, scale now {:g})", run_.scaler->scale())
                      : " | SKIPPED (non-finite gradients)";
  }
  opt_.progress(line);
  return Status::Ok();
}

bool TrainLoop::CheckpointDue(uint64_t step) const {
  const CheckpointConfig& ck = c_.zinf.checkpoint;
  return run_.checkpointer != nullptr &&
         ((ck.every > 0 && (step + 1) % ck.every == 0) || step + 1 == opt_.steps);
}

// A checkpoint when one is due or the run stops; whether it stops (any rank asked).
Result<bool> TrainLoop::CheckpointOrStop(uint64_t step) {
  const bool stop_here =
      ((opt_.stop != nullptr && opt_.stop->load()) || step + 1 == opt_.stop_after) &&
      step + 1 < opt_.steps;
  ZINF_ASSIGN_OR_RETURN(const bool stop, AnyRank(run_.ranks, stop_here));
  if (CheckpointDue(step) || (stop && run_.checkpointer != nullptr)) {
    TrainerState st;
    st.step = step + 1;
    st.applied = applied_;
    st.skipped = sum_.skipped_steps;
    st.prev_clip = prev_clip_;
    st.scaler = run_.scaler->state();
    st.data_position = run_.train_data->position();
    st.data = run_.train_data->source();
    ZINF_RETURN_IF_ERROR(run_.checkpointer->Save(ex_, st));
    committing_ = true;
  }
  if (stop) {
    Log().warn("train: stopped by request after step {}{}", step + 1,
               run_.checkpointer != nullptr ? "; committing its checkpoint" : "");
    sum_.stopped = true;
  }
  return stop;
}

}  // namespace zinf::train
