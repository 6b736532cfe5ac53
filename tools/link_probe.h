// tools/link_probe.h — the host <-> device link's rate, measured on a Device: what `zinf plan`
// uses for the link when no rate is given.
//
// Contract: ProbeLink copies `bytes` (capped at half the device budget, at least 1 MiB) between
// pinned host memory and device memory, each way on its own stream, `reps` times after one
// untimed copy, and returns the median rate of each direction in 10^9 bytes a second. It
// allocates and frees its buffers (allocation synchronizes the device: not for use beside a
// run). On the host-emulated device the rate is memcpy's, or the emulated link's
// (DeviceOptions::copy_gbps) when paced; on a GPU, PCIe's or NVLink's for pinned memory.
//
// Thread-safety: one call at a time per device.
#pragma once

#include <cstdint>

#include "src/base/device.h"
#include "zinf/status.h"

namespace zinf::tools {

struct LinkRates {
  double h2d_gbps = 0, d2h_gbps = 0;
};

Result<LinkRates> ProbeLink(Device& device, uint64_t bytes = 64ull << 20, int reps = 5);

}  // namespace zinf::tools
