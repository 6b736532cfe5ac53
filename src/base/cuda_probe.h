// src/base/cuda_probe.h — does this build have CUDA, and does a GPU answer?
//
// Contract: ProbeCuda never fails and never aborts: on a machine with no GPU or no driver it
// reports zero devices and says why. `built_with_cuda` is false when the build had ZINF_CUDA
// off (or AUTO without nvcc); the probe is then a stub compiled from cuda_probe_stub.cc.
//
// Thread-safety: may be called from any thread.
#pragma once

#include <string>

namespace zinf {

struct CudaProbe {
  bool built_with_cuda = false;
  int device_count = 0;
  int runtime_version = 0;  // cudaRuntimeGetVersion, 0 when unknown
  int driver_version = 0;   // cudaDriverGetVersion, 0 when no driver
  std::string detail;       // "2 devices: NVIDIA H200 (sm_90), ..." or why there are none
};

CudaProbe ProbeCuda();

}  // namespace zinf
