// src/base/host_info.h — small facts about this machine, and a median for benchmark rounds.
//
// Contract: MemAvailableBytes reads MemAvailable from /proc/meminfo (0 when unknown);
// PeakRssBytes is this process's peak resident set so far (getrusage's ru_maxrss). Median of
// an empty list is 0; of an even count, the mean of the two middle values.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

namespace zinf {

uint64_t MemAvailableBytes();
uint64_t PeakRssBytes();
double Median(std::vector<double> values);

}  // namespace zinf
