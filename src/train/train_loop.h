// src/train/train_loop.h — internal to src/train: the loop of one `zinf train` run, over the
// objects SetUpRun built (trainer_setup.h). Train() (trainer.h) is SetUpRun, Run, Summarize.
//
// Contract. Run() runs steps [resumed step, opt.steps), each as RunStep reads: the batch, the
// forward and backward over the units per micro-batch, the gradients handed over to the
// offload core, the overflow check, the clip coefficient, the optimizer step. Around each
// step: Account (NVMe and link bytes, stall, the accumulators the summary reads), Evaluate
// (--eval-every), Report (the --losses line, the progress line) and CheckpointOrStop (a due
// checkpoint, a stop request agreed across ranks). Summarize() (train_summary.cc) fills the
// TrainSummary from the accumulators, the tiers, the executor, the communicators and zinf
// plan's prediction, saves --save, writes the trace and --summary-json (rank 0).
// Errors from any part end the run with that Status.
//
// Thread-safety: the training thread only.
#pragma once

#include <cstdint>
#include <fstream>
#include <vector>

#include "kernels/cpu/adam.h"
#include "offload/tier_manager.h"
#include "src/train/executor.h"
#include "src/train/trainer.h"
#include "src/train/trainer_setup.h"
#include "zinf/status.h"

namespace zinf::train {

// One step as the loop reports it.
struct StepRecord {
  double loss = 0;
  double lr = 0;
  double norm = 0;        // the global gradient norm, unscaled
  double loss_scale = 1;  // fp16's scale during the step (1 otherwise)
  bool skip = false;      // an overflowed step: no optimizer step
  double seconds = 0;
  double stall = 0;       // waiting for weights (their transfer or the optimizer's writes)
  double read = 0, write = 0, h2d = 0, d2h = 0;  // NVMe and link bytes
  uint64_t device_evictions = 0, host_evictions = 0;
  double val = -1;        // validation loss, when evaluated
};

// What the steps accumulate for the summary.
struct RunAccounts {
  std::vector<double> step_times, step_reads, step_writes, step_h2d, step_d2h;
  // Steps a checkpoint's commit overlapped (the one after each Save) and the others, leaving
  // out the run's first and last steps.
  std::vector<double> commit_step_times, other_step_times;
  double stall_total = 0, time_total = 0;
};

class TrainLoop {
 public:
  TrainLoop(const TrainOptions& opt, TrainRun& run);

  Status Run();
  Result<TrainSummary> Summarize();

 private:
  Result<StepRecord> RunStep(uint64_t step);
  // This rank's micro-batches of the step's global batch: forward and backward of each.
  struct MicroBatches {
    std::vector<double> losses;
    bool finite = true;
  };
  Result<MicroBatches> ForwardBackward(const StepRecord& r, const kernels::AdamHyper* overlap);
  kernels::AdamHyper Hyper(const StepRecord& r, double clip) const;
  double ClipCoefficient(double norm) const;
  Status Update(const StepRecord& r, double clip);
  void Account(uint64_t step, StepRecord& r, const ExecutorStats& before);
  Status Evaluate(uint64_t step, StepRecord& r);
  Status Report(uint64_t step, const StepRecord& r);
  Result<bool> CheckpointOrStop(uint64_t step);
  bool CheckpointDue(uint64_t step) const;  // after step (0-based) `step`

  // train_summary.cc
  void SummarizeSteps();
  void SummarizeCheckpoints();
  void SummarizePlan();
  void SummarizeTiers();
  void SummarizeComm();
  Status SummarizeProfile();
  Status WriteOutputs();

  const TrainOptions& opt_;
  TrainRun& run_;
  const Config& c_;
  LayerExecutor& ex_;
  std::ofstream losses_;
  TrainSummary sum_;
  RunAccounts acc_;
  std::vector<int32_t> x_, y_;  // one micro-batch's tokens and targets
  uint64_t applied_ = 0;        // optimizer steps applied (the schedule's and Adam's step)
  double prev_clip_ = 1.0;      // overlap_adam clips with the previous step's coefficient
  bool committing_ = false;     // a checkpoint's commit overlaps the next step
  offload::TierStats prev_tiers_;
  uint64_t prev_opt_read_ = 0, prev_opt_written_ = 0;
};

}  // namespace zinf::train
