// src/train/executor_internal.h — small helpers shared by the layer executor's source files
// (executor.cc: set-up and memory; executor_step.cc: forward, backward, hand-over;
// executor_optimizer.cc: weights and the optimizer step; executor_profile.cc: --profile).
// Not for other users.
#pragma once

#include <chrono>
#include <cstdint>

#include "offload/tier_manager.h"

namespace zinf::train::detail {

using Clock = std::chrono::steady_clock;
using offload::Tier;

inline double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline uint64_t Param16Bytes(uint64_t n) { return 2 * n; }

}  // namespace zinf::train::detail
