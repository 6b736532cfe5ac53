// Stub of the device probe for builds without CUDA.
#include "src/base/cuda_probe.h"

namespace zinf {

CudaProbe ProbeCuda() {
  CudaProbe p;
  p.detail = "built without CUDA (configure with -DZINF_CUDA=ON or AUTO with nvcc on the path)";
  return p;
}

}  // namespace zinf
