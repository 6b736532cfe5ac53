// MakeCudaDevice for builds without CUDA: says how to get one.
#include "src/base/device.h"

namespace zinf {

Result<std::unique_ptr<Device>> MakeCudaDevice(const DeviceOptions& options) {
  return Unimplemented(
      "the CUDA device: this zinf was built without CUDA (configure with -DZINF_CUDA=ON or "
      "AUTO with nvcc on the path); use the host device instead");
}

}  // namespace zinf
