// src/base/host_device.h — the Device seam emulated in host RAM, for machines with no GPU.
//
// Contract (beyond src/base/device.h):
// - "Device" memory is ordinary host memory (aligned to kDeviceAlignment) under the same hard
//   budget as on a GPU; it is not zeroed, like cudaMalloc. Pinned memory is ordinary
//   page-aligned memory and RegisterHost is bookkeeping only, so the pinning rules are still
//   enforced (offload/'s pinned pool does the real mlock and its checks).
// - Each stream has one worker thread and a FIFO queue; copies and Launch functions run on it.
//   After a task fails, the stream skips all its later tasks (they still complete, so no waiter
//   hangs) and the error is sticky, as device.h says.
// - Emulation, so that overlap and scheduling can be studied at realistic ratios:
//   copy_gbps models a full-duplex link such as PCIe: one host-to-device and one
//   device-to-host lane, each shared by all streams. A copy books bytes / rate seconds on its
//   lane after the lane's previous booking, and its data lands chunk by chunk
//   (kCopyChunkBytes) at the paced times, so a reader that does not wait for the copy sees
//   stale data, as on a GPU. A copy therefore never completes sooner than bytes / rate after it
//   starts, and concurrent copies in one direction share the rate. Device-to-device copies run
//   at memcpy speed. compute_flops models the GPU's math: a Launch with flops > 0 books
//   flops / rate seconds on one compute engine shared by all streams, runs fn, and completes
//   no sooner than the end of its booking (fn's own time overlaps the booking).
//   Sleeps use steady_clock deadlines, so overshoot does not accumulate across chunks.
// - Stream stats measure wall seconds on the worker: copying (pacing included), computing
//   (pacing included) and waiting in StreamWaitEvent.
//
// - CUDA's rules (device.h): each stream's worker thread runs under a StreamCallbackScope, so
//   any device call from a Launch fn is a violation; every copy's device and host ranges are
//   tracked until it completes (CheckIdle, and the check in Free/FreePinned/UnregisterHost);
//   Allocate and Free first wait for every stream's enqueued work, reporting a wait longer than
//   host_sync_timeout_seconds as a deadlock naming the stream and the work it is stuck in.
//
// Thread-safety: as Device. A Launch fn runs on its stream's worker thread and must not call
// any device.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "src/base/device.h"

namespace zinf {

// Pacing granularity of emulated copies: small enough that data lands progressively, large
// enough that a 25 GB/s link needs a sleep only every ~40 us.
inline constexpr uint64_t kCopyChunkBytes = 1 << 20;

class HostDevice final : public Device {
 public:
  // Validates options (ValidateDeviceOptions); kind is ignored.
  static Result<std::unique_ptr<HostDevice>> Create(const DeviceOptions& options);
  ~HostDevice() override;  // drains every stream, joins the workers, frees leaked memory

  std::string Describe() const override;

 private:
  class PacedResource;
  class HostStream;
  class InflightCopies;
  struct HostEventState;

  explicit HostDevice(const DeviceOptions& options);

  Result<void*> DoAllocate(uint64_t bytes) override;
  Status DoFree(void* ptr) override;
  Result<void*> DoAllocatePinned(uint64_t bytes) override;
  Status DoFreePinned(void* ptr) override;
  Status DoRegisterHost(void* ptr, uint64_t bytes) override;
  Status DoUnregisterHost(void* ptr) override;
  Result<std::unique_ptr<Stream>> DoCreateStream(std::string name, int index) override;
  Status DoCopy(Stream* stream, CopyKind kind, void* dst, const void* src,
                uint64_t bytes) override;
  Status DoLaunch(Stream* stream, std::function<Status()> fn, double flops) override;
  Result<Event> DoRecord(Stream* stream) override;
  Status DoStreamWaitEvent(Stream* stream, const Event& event) override;
  Result<bool> DoEventQuery(const Event& event) override;
  Status DoEventSynchronize(const Event& event) override;
  Status DoStreamSynchronize(Stream* stream) override;
  Status DoCheckIdle(const void* ptr, uint64_t bytes, std::string_view what) const override;
  // Waits for the work enqueued so far on every stream (the device-wide synchronization of
  // cudaMalloc/cudaFree); a violation when it outlasts host_sync_timeout_seconds.
  Status DoMemoryCallSync(std::string_view op) override;

  // Null when the corresponding rate is 0 (unpaced).
  std::unique_ptr<PacedResource> h2d_lane_;
  std::unique_ptr<PacedResource> d2h_lane_;
  std::unique_ptr<PacedResource> compute_;
  std::unique_ptr<InflightCopies> inflight_;
};

}  // namespace zinf
