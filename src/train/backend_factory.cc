#include "src/train/backend_factory.h"

#include "src/train/cpu_backend.h"
#if ZINF_HAVE_CUDA_BACKEND
#include "src/train/cuda_backend.h"
#endif

namespace zinf::train {

Result<std::unique_ptr<Backend<float>>> MakeBackend(Device& device, Stream* compute, int threads,
                                                    DeviceArena* arena) {
  if (device.kind() == DeviceKind::kCuda) {
#if ZINF_HAVE_CUDA_BACKEND
    return MakeCudaBackend(device, compute, kernels::cuda::GemmPrecision::kBf16, arena);
#else
    return Unimplemented("the CUDA backend is not built: configure with -DZINF_CUDA=ON");
#endif
  }
  return MakeCpuBackend<float>({.threads = threads});
}

}  // namespace zinf::train
