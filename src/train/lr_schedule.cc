#include "src/train/lr_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zinf::train {

Result<LrSchedule> LrSchedule::Create(const SchedulerConfig& config, double lr,
                                      uint64_t total_steps) {
  if (!std::isfinite(lr) || lr < 0.0) {
    return InvalidArgument(
        fmt::format("optimizer.params.lr: {} is not a learning rate; expected a number >= 0", lr));
  }
  LrSchedule s;
  s.config_ = config;
  s.lr_ = lr;
  s.warmup_ = std::max<uint64_t>(2, config.warmup_num_steps);
  s.inverse_log_warmup_ = 1.0 / std::log(static_cast<double>(s.warmup_));
  s.min_lr_ = config.warmup_min_lr;
  s.max_lr_ = config.warmup_max_lr.value_or(lr);
  const bool warmup_lr =
      config.type == SchedulerType::kWarmupLR || config.type == SchedulerType::kWarmupDecayLR;
  if (warmup_lr && !(s.min_lr_ >= 0.0 && s.min_lr_ <= s.max_lr_ && std::isfinite(s.max_lr_))) {
    return InvalidArgument(
        fmt::format("scheduler.params.warmup_min_lr: {} with warmup_max_lr {}{}; expected 0 <= "
                    "warmup_min_lr <= warmup_max_lr",
                    s.min_lr_, s.max_lr_, config.warmup_max_lr ? "" : " (optimizer.params.lr)"));
  }
  if (config.type == SchedulerType::kWarmupDecayLR ||
      config.type == SchedulerType::kWarmupCosineLR) {
    s.total_ = config.total_num_steps != 0 ? config.total_num_steps : total_steps;
    if (s.total_ == 0) {
      return InvalidArgument(fmt::format(
          "scheduler.params.total_num_steps: 0 (absent) and the trainer's step count is 0; "
          "{} needs a total step count >= 1",
          SchedulerTypeName(config.type)));
    }
  }
  return s;
}

double LrSchedule::WarmupGamma(uint64_t step) const {
  if (config_.warmup_type == WarmupType::kLog) {
    return inverse_log_warmup_ * std::log(static_cast<double>(step) + 1.0);
  }
  return static_cast<double>(step) / static_cast<double>(warmup_);
}

double LrSchedule::Lr(uint64_t step) const {
  switch (config_.type) {
    case SchedulerType::kNone:
      return lr_;
    case SchedulerType::kWarmupLR: {
      double gamma = step < warmup_ ? WarmupGamma(step) : 1.0;
      return min_lr_ + (max_lr_ - min_lr_) * gamma;
    }
    case SchedulerType::kWarmupDecayLR: {
      double gamma;
      if (step < warmup_) {
        gamma = WarmupGamma(step);
      } else {
        // DeepSpeed: float(T - s) / float(max(1.0, T - W)), with Python's signed integers.
        double remaining = static_cast<double>(total_) - static_cast<double>(step);
        double span = std::max(1.0, static_cast<double>(total_) - static_cast<double>(warmup_));
        gamma = std::max(0.0, remaining / span);
      }
      return min_lr_ + (max_lr_ - min_lr_) * gamma;
    }
    case SchedulerType::kWarmupCosineLR: {
      double ratio;
      if (step < warmup_) {
        ratio = config_.warmup_min_ratio + WarmupGamma(step) * (1.0 - config_.warmup_min_ratio);
      } else {
        double k = static_cast<double>(step) - static_cast<double>(warmup_) + 1.0;
        double n = static_cast<double>(total_) - static_cast<double>(warmup_);
        double cosine = n == 0.0 ? 0.0 : (1.0 + std::cos(std::numbers::pi * k / n)) / 2.0;
        ratio = std::max(0.0, config_.cos_min_ratio + (1.0 - config_.cos_min_ratio) * cosine);
      }
      return lr_ * ratio;
    }
  }
  return lr_;
}

double LrSchedule::InitialLr() const {
  switch (config_.type) {
    case SchedulerType::kNone:
      return lr_;
    case SchedulerType::kWarmupLR:
    case SchedulerType::kWarmupDecayLR:
      return min_lr_;
    case SchedulerType::kWarmupCosineLR:
      return 0.0;
  }
  return lr_;
}

std::string LrSchedule::Describe() const {
  std::string warmup =
      fmt::format("{} warmup {} steps", WarmupTypeName(config_.warmup_type), warmup_);
  switch (config_.type) {
    case SchedulerType::kNone:
      return fmt::format("constant lr {}", lr_);
    case SchedulerType::kWarmupLR:
      return fmt::format("WarmupLR({}, {} -> {})", warmup, min_lr_, max_lr_);
    case SchedulerType::kWarmupDecayLR:
      return fmt::format("WarmupDecayLR({}, {} -> {}, total {})", warmup, min_lr_, max_lr_, total_);
    case SchedulerType::kWarmupCosineLR:
      return fmt::format(
          "WarmupCosineLR({}, lr {}, warmup_min_ratio {}, cos_min_ratio {}, "
          "total {})",
          warmup, lr_, config_.warmup_min_ratio, config_.cos_min_ratio, total_);
  }
  return "?";
}

}  // namespace zinf::train
