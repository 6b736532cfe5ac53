// tests/comm/fake_nccl/fake_nccl_control.h — a test's handle on the fake CUDA and NCCL
// (cuda_runtime.h, nccl.h in this directory): how many GPUs answer, the calling thread's
// current one, pinned memory's peak, and the breaches of CUDA's and NCCL's rules it recorded.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zinf::comm::fake_nccl {

void SetDeviceCount(int n);  // 0: no GPU answers (the default is 8)
int CurrentDevice();         // the calling thread's, as cudaSetDevice left it
uint64_t PinnedBytes();      // pinned memory allocated now
uint64_t PinnedPeakBytes();  // since the last reset
void ResetPinnedPeak();
std::vector<std::string> Breaches();
void ClearBreaches();

}  // namespace zinf::comm::fake_nccl
