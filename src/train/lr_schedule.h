// src/train/lr_schedule.h — the learning rate per optimizer step, as DeepSpeed's schedulers give.
//
// Contract: formulas of deepspeed/runtime/lr_schedules.py, with s = DeepSpeed's
// `last_batch_iteration` (0 after the scheduler's first step()), W = max(2, warmup_num_steps),
// T = total_num_steps (the trainer's step count when the config gives 0), lr = optimizer lr:
// - none (no `scheduler` block): lr at every step.
// - WarmupLR: min + (max - min) × gamma(s), max = warmup_max_lr (absent: lr, as the config says)
//   gamma(s) = ln(s + 1) / ln(W) ("log") or s / W ("linear") while s < W, then 1.
// - WarmupDecayLR: as WarmupLR while s < W, then gamma = max(0, (T - s) / max(1, T - W)): a
//   linear decay to warmup_min_lr at s = T, and warmup_min_lr past T.
// - WarmupCosineLR: lr × ratio(s); while s < W ratio = wmin + (1 - wmin) × g(s), g as gamma
//   above and wmin = warmup_min_ratio; after, with k = s - W + 1 and n = T - W,
//   ratio = max(0, cmin + (1 - cmin) × (1 + cos(pi × k / n)) / 2), cmin = cos_min_ratio. Past
//   T the cosine rises again, exactly as DeepSpeed's does. Where DeepSpeed divides by zero
//   (n = 0, T equal to W) this gives cmin × lr.
// Step counting, as DeepSpeed's engine does it: the scheduler is built with s = -1 and step()ed
// once after each APPLIED optimizer step (not after one skipped for fp16 overflow). So the
// optimizer step taken after `applied` applied steps uses LrForStep(applied) =
// InitialLr() when applied is 0, else Lr(applied - 1). InitialLr() is DeepSpeed's value at
// s = -1: warmup_min_lr for WarmupLR/WarmupDecayLR, 0 for WarmupCosineLR, lr for none.
// Refused (InvalidArgument naming `scheduler.params.<key>` and the value): lr negative or not
// finite, warmup_min_lr > warmup_max_lr, WarmupDecayLR/WarmupCosineLR without a step count
// (total_num_steps 0 and a trainer total of 0).
//
// Thread-safety: an LrSchedule is immutable; any method may run on any thread.
#pragma once

#include <cstdint>
#include <string>

#include "src/config/config.h"
#include "zinf/status.h"

namespace zinf::train {

class LrSchedule {
 public:
  // `lr`: optimizer.params.lr; `total_steps`: the trainer's optimizer step count, used when
  // config.total_num_steps is 0.
  static Result<LrSchedule> Create(const SchedulerConfig& config, double lr, uint64_t total_steps);

  // DeepSpeed's get_lr() at last_batch_iteration = step.
  double Lr(uint64_t step) const;
  // DeepSpeed's get_lr() at last_batch_iteration = -1 (what the optimizer holds at the start).
  double InitialLr() const;
  // The learning rate of the optimizer step taken after `applied_steps` applied steps.
  double LrForStep(uint64_t applied_steps) const {
    return applied_steps == 0 ? InitialLr() : Lr(applied_steps - 1);
  }

  SchedulerType type() const { return config_.type; }
  uint64_t warmup_steps() const { return warmup_; }  // W = max(2, warmup_num_steps)
  uint64_t total_steps() const { return total_; }    // T (0 for none and WarmupLR)
  double min_lr() const { return min_lr_; }
  double max_lr() const { return max_lr_; }
  // "WarmupDecayLR(log warmup 1000 steps, 0 -> 0.001, total 10000)"
  std::string Describe() const;

 private:
  LrSchedule() = default;
  double WarmupGamma(uint64_t step) const;  // the warmup fraction g(s), s < W

  SchedulerConfig config_;
  double lr_ = 0.0;
  double min_lr_ = 0.0;
  double max_lr_ = 0.0;
  uint64_t warmup_ = 2;
  uint64_t total_ = 0;
  double inverse_log_warmup_ = 0.0;
};

}  // namespace zinf::train
