// CUDA side of the device probe: compiled by nvcc when the build has CUDA.
#include <cuda_runtime.h>

#include <string>

#include "src/base/cuda_probe.h"

namespace zinf {

CudaProbe ProbeCuda() {
  CudaProbe p;
  p.built_with_cuda = true;
  cudaRuntimeGetVersion(&p.runtime_version);
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    p.device_count = 0;
    p.detail = std::string("no CUDA device: ") + cudaGetErrorString(err);
    return p;
  }
  p.device_count = n;
  p.detail = std::to_string(n) + (n == 1 ? " device" : " devices");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    p.detail += (i == 0 ? ": " : ", ") + std::string(prop.name) + " (sm_" +
                std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
                std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
  }
  return p;
}

}  // namespace zinf
