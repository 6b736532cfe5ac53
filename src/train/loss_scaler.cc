#include "src/train/loss_scaler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace zinf::train {

Result<LossScaler> LossScaler::FromConfig(const Fp16Config& config, bool raise_error_at_min_scale) {
  auto bad = [](std::string_view key, auto value, std::string_view expected) {
    return InvalidArgument(fmt::format("fp16.{}: {}; expected {}", key, value, expected));
  };
  if (!std::isfinite(config.loss_scale) || config.loss_scale < 0.0) {
    return bad("loss_scale", config.loss_scale, "0 (dynamic) or a number > 0 (static)");
  }
  LossScaler s;
  s.raise_error_at_min_scale_ = raise_error_at_min_scale;
  if (!config.enabled || config.loss_scale > 0.0) {
    s.state_.scale = config.enabled ? config.loss_scale : 1.0;
    return s;
  }
  if (config.initial_scale_power > 63) {
    return bad("initial_scale_power", config.initial_scale_power, "an integer in 0..63");
  }
  if (config.loss_scale_window == 0) return bad("loss_scale_window", 0, "an integer >= 1");
  if (config.hysteresis == 0) return bad("hysteresis", 0, "an integer >= 1");
  if (!std::isfinite(config.min_loss_scale) || config.min_loss_scale <= 0.0) {
    return bad("min_loss_scale", config.min_loss_scale, "a number > 0");
  }
  s.dynamic_ = true;
  s.consecutive_hysteresis_ = config.consecutive_hysteresis;
  s.hysteresis_ = config.hysteresis;
  s.window_ = config.loss_scale_window;
  s.min_scale_ = config.min_loss_scale;
  s.state_.scale = std::ldexp(1.0, static_cast<int>(config.initial_scale_power));
  s.state_.hysteresis_left = config.hysteresis;
  return s;
}

Result<bool> LossScaler::Update(bool overflow) {
  LossScalerState& st = state_;
  if (!dynamic_) {
    if (overflow) ++st.skipped_steps;
    ++st.iteration;
    return overflow;
  }
  if (overflow) {
    if (hysteresis_ == 1 || st.hysteresis_left == 1) {
      if (st.scale == min_scale_ && raise_error_at_min_scale_) {
        return FailedPrecondition(fmt::format(
            "fp16 gradients overflowed at iteration {} with the loss scale already at "
            "fp16.min_loss_scale {}: it cannot decrease further (DeepSpeed stops the run here)",
            st.iteration, min_scale_));
      }
      st.scale = std::max(st.scale / 2.0, min_scale_);
    } else {
      --st.hysteresis_left;
    }
    st.last_overflow_iteration = static_cast<int64_t>(st.iteration);
    ++st.skipped_steps;
  } else {
    if (consecutive_hysteresis_) st.hysteresis_left = hysteresis_;
    const int64_t since = static_cast<int64_t>(st.iteration) - st.last_overflow_iteration;
    if (since % static_cast<int64_t>(window_) == 0) {
      if (!consecutive_hysteresis_) st.hysteresis_left = hysteresis_;
      st.scale *= 2.0;
    }
  }
  ++st.iteration;
  return overflow;
}

Status LossScaler::Restore(const LossScalerState& state) {
  if (!std::isfinite(state.scale) || state.scale <= 0.0) {
    return InvalidArgument(
        fmt::format("loss scaler state: scale {}; expected a number > 0", state.scale));
  }
  if (dynamic_ && (state.hysteresis_left == 0 || state.hysteresis_left > hysteresis_)) {
    return InvalidArgument(
        fmt::format("loss scaler state: hysteresis_left {}; expected 1..{} (fp16.hysteresis)",
                    state.hysteresis_left, hysteresis_));
  }
  if (state.last_overflow_iteration >= static_cast<int64_t>(state.iteration)) {
    return InvalidArgument(
        fmt::format("loss scaler state: last_overflow_iteration {} is not before iteration {}",
                    state.last_overflow_iteration, state.iteration));
  }
  state_ = state;
  return Status::Ok();
}

}  // namespace zinf::train
