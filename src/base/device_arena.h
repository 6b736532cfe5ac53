// src/base/device_arena.h — the device budget, reserved once at start and sub-allocated.
//
// Contract: Create() makes ONE Device::Allocate of `bytes` (0: the device's whole budget) and
// never another: every device buffer zinf uses (the executor's activations and fp32 weights,
// the backend's buffers and the cuBLAS workspace, the tier manager's copies) is a block of it.
// So no cudaMalloc or cudaFree, which can synchronize the whole device, runs after start-up.
// Blocks are first fit, aligned to kDeviceAlignment, coalesced when freed (src/base/arena.h);
// a refusal is ResourceExhausted naming `what`, the bytes and the arena's state. Free checks
// with the device that no unfinished copy uses the block (Device::CheckIdle): memory a kernel
// may still use is freed only after its stream was synchronized, or, on the hot path, carried
// with its last-use event to the next user (the tier manager's slots). The destructor returns
// the reservation to the device (REQUIRES: no work in flight uses it).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "src/base/arena.h"
#include "src/base/device.h"
#include "zinf/status.h"

namespace zinf {

class DeviceArena {
 public:
  static Result<std::unique_ptr<DeviceArena>> Create(Device& device, uint64_t bytes = 0);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  Device& device() const { return device_; }
  // `what` names the buffer in a refusal ("the executor's buffers", "cuBLAS workspace").
  Result<void*> Allocate(uint64_t bytes, std::string_view what);
  Status Free(void* p);
  // The largest free block whole (the tier manager's slots); {nullptr, 0} when none.
  std::pair<void*, uint64_t> AllocateRest() { return arena_->AllocateRest(); }

  uint64_t budget_bytes() const { return arena_->budget_bytes(); }
  uint64_t bytes_in_use() const { return arena_->bytes_in_use(); }
  uint64_t peak_bytes() const { return arena_->peak_bytes(); }
  uint64_t largest_free_block() const { return arena_->largest_free_block(); }
  uint64_t BlockBytes(uint64_t bytes) const { return arena_->BlockBytes(bytes); }
  bool Contains(const void* p, uint64_t n) const { return arena_->Contains(p, n); }

 private:
  DeviceArena(Device& device, void* base, uint64_t bytes);
  Device& device_;
  void* base_;
  std::unique_ptr<Arena> arena_;
};

}  // namespace zinf
