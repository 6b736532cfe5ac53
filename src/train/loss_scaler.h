// src/train/loss_scaler.h — fp16 loss scaling, as DeepSpeed's loss_scaler.py does it.
//
// Contract:
// - Static (fp16.loss_scale > 0, or fp16 disabled, which gives scale 1 as DeepSpeed's
//   CreateLossScaler does for bf16/fp32): the scale never changes. Update(overflow) returns
//   `overflow`: a step whose gradients overflowed is skipped and counted.
// - Dynamic (fp16.enabled and loss_scale 0): DynamicLossScaler.update_scale with
//   init_scale = 2^initial_scale_power, scale_factor 2, scale_window = loss_scale_window,
//   delayed_shift = hysteresis, min_scale = min_loss_scale, consecutive_hysteresis. Per call,
//   with i the iteration (calls so far):
//     overflow:  if hysteresis == 1 or the hysteresis left is 1: scale = max(scale / 2, min)
//                (when scale already equals min and raise_error_at_min_scale, FailedPrecondition
//                instead, state unchanged: DeepSpeed raises and the run ends); else the
//                hysteresis left drops by 1. The last overflow iteration becomes i.
//     no overflow: with consecutive_hysteresis the hysteresis left is refilled; if
//                (i - last overflow iteration) % window == 0 (last overflow starts at -1) the
//                scale doubles (no upper bound, as in DeepSpeed) and, without
//                consecutive_hysteresis, the hysteresis left is refilled.
//     then i += 1.
//   Update returns true (skip the optimizer step) exactly when `overflow` is true, as DeepSpeed
//   skips every overflowed step whether or not the scale changed.
// - The state (scale, iteration, last overflow, hysteresis left, skipped steps) can be saved and
//   restored for checkpoints.
// Refused by FromConfig (InvalidArgument naming `fp16.<key>` and the value): loss_scale
// negative or not finite, initial_scale_power > 63, loss_scale_window 0, hysteresis 0,
// min_loss_scale <= 0 or not finite.
//
// Thread-safety: a LossScaler is a plain value; one thread updates it.
#pragma once

#include <cstdint>

#include "src/config/config.h"
#include "zinf/status.h"

namespace zinf::train {

struct LossScalerState {
  double scale = 1.0;
  uint64_t iteration = 0;  // DeepSpeed's cur_iter: Update calls so far
  int64_t last_overflow_iteration = -1;
  uint32_t hysteresis_left = 1;  // DeepSpeed's cur_hysteresis
  uint64_t skipped_steps = 0;
};

class LossScaler {
 public:
  static Result<LossScaler> FromConfig(const Fp16Config& config,
                                       bool raise_error_at_min_scale = true);

  // Multiply the loss by this before backward; divide the gradients by it before the step.
  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }

  // Records one optimizer step's overflow check. Ok(true): skip this step. FailedPrecondition
  // only in dynamic mode at the minimum scale with raise_error_at_min_scale.
  Result<bool> Update(bool overflow);

  uint64_t skipped_steps() const { return state_.skipped_steps; }
  uint64_t iteration() const { return state_.iteration; }
  uint32_t hysteresis_left() const { return state_.hysteresis_left; }

  const LossScalerState& state() const { return state_; }
  // Refused: a scale <= 0 or not finite, hysteresis_left 0 or above the configured hysteresis.
  Status Restore(const LossScalerState& state);

 private:
  LossScaler() = default;

  bool dynamic_ = false;
  bool raise_error_at_min_scale_ = true;
  bool consecutive_hysteresis_ = false;
  uint32_t hysteresis_ = 1;  // DeepSpeed's delayed_shift
  uint32_t window_ = 1000;
  double min_scale_ = 1.0;
  LossScalerState state_;
};

}  // namespace zinf::train
