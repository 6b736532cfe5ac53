#include "src/base/device_arena.h"

#include <fmt/format.h>

#include "src/base/units.h"

namespace zinf {

Result<std::unique_ptr<DeviceArena>> DeviceArena::Create(Device& device, uint64_t bytes) {
  if (bytes == 0) bytes = device.budget_bytes() / kDeviceAlignment * kDeviceAlignment;
  auto base = device.Allocate(bytes);
  if (!base.ok()) {
    return base.status().WithContext(fmt::format(
        "reserving the device arena of {} bytes ({})", bytes, FormatBytesHuman(bytes)));
  }
  return std::unique_ptr<DeviceArena>(new DeviceArena(device, *base, bytes));
}

DeviceArena::DeviceArena(Device& device, void* base, uint64_t bytes)
    : device_(device),
      base_(base),
      arena_(std::make_unique<Arena>("device arena", base, bytes, kDeviceAlignment)) {}

DeviceArena::~DeviceArena() { device_.Free(base_).IgnoreError(); }

Result<void*> DeviceArena::Allocate(uint64_t bytes, std::string_view what) {
  auto p = arena_->Allocate(bytes);
  if (!p.ok()) return p.status().WithContext(std::string(what));
  return p;
}

Status DeviceArena::Free(void* p) {
  if (p == nullptr) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(uint64_t bytes, arena_->BlockSize(p));
  ZINF_RETURN_IF_ERROR(device_.CheckIdle(p, bytes, "device arena Free"));
  return arena_->Free(p);
}

}  // namespace zinf
