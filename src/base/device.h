// src/base/device.h — the Device seam: device memory, pinned host memory, streams, events,
// asynchronous copies and host-function launches.
//
// Two implementations: CudaDevice (src/base/cuda_device.cu, built when CUDA is on) and
// HostDevice (src/base/host_device.h: device memory emulated in host RAM, one worker thread per
// stream, optional copy-bandwidth and compute-rate emulation), so that every tier decision,
// budget and overlap in offload/ runs and is tested on a machine with no GPU. MakeDevice picks
// CUDA when the build has it and a GPU answers, else the host device.
//
// Contract:
// - Device memory: Allocate/Free under a hard byte budget (DeviceOptions::budget_bytes). Each
//   allocation is aligned to kDeviceAlignment and is accounted rounded up to it, as cudaMalloc
//   pads. The budget is never exceeded, also under concurrent callers; a refusal is
//   ResourceExhausted naming the request, the bytes in use and the budget. Allocate(0) is
//   InvalidArgument. Allocation is slow on a GPU (cudaFree synchronizes the device): allocate
//   arenas once and sub-allocate.
// - Pinned host memory: AllocatePinned/FreePinned (page-aligned, page-locked on a GPU) or
//   RegisterHost/UnregisterHost on memory the caller owns (cudaHostRegister). Pinned memory has
//   no budget here; offload/'s pinned pool owns that budget. On HostDevice pinning is bookkeeping
//   only, so that the same rules are checked without a GPU.
// - Copies: CopyToDevice / CopyToHost / CopyOnDevice enqueue on a stream and return at once.
//   Enqueue checks every device range lies inside one live allocation and, when
//   DeviceOptions::require_pinned_host (the default), every host range is pinned: a pageable
//   source makes cudaMemcpyAsync synchronous, which would silently serialize the pipeline on a
//   GPU, so it is refused on both devices. Zero-byte copies are no-ops.
// - Streams run their work in FIFO order; different streams run concurrently. Record returns an
//   Event that completes when all work enqueued on that stream before it has completed;
//   StreamWaitEvent makes later work on a stream wait for an event of another stream. An Event
//   never recorded (default-constructed) is complete.
// - Launch(stream, fn, flops) runs the host function fn in stream order. On HostDevice it runs
//   on the stream's worker thread (this is how the CPU backend runs "device" compute) and, with
//   DeviceOptions::compute_flops set, keeps the device's compute busy for at least
//   flops / compute_flops seconds. On CudaDevice it is cudaLaunchHostFunc: fn runs on a CUDA
//   callback thread and must not call CUDA; real kernels are launched by the CUDA backend on the
//   stream's native handle, not through Launch.
// - Errors: enqueue calls validate their arguments and return at once. A failure while the work
//   runs (fn returning an error, a CUDA fault) is sticky on its stream, as in CUDA: the stream
//   skips its later host work (HostDevice: all later work; CudaDevice: later Launches, copies
//   still run), StreamSynchronize and every later enqueue on it return the error, and
//   EventSynchronize returns it for events recorded after the failure. A stream that waits on
//   such an event fails too (Aborted, naming the stream that failed).
// - Telemetry: Stream::stats() counts bytes per direction, copies, launches and flops; on
//   HostDevice also the wall seconds spent copying, computing and waiting on events (CudaDevice
//   leaves the seconds at 0: timing needs events with timing enabled, which the tracer will add).
//
// - CUDA's rules, enforced on both devices (src/base/device_rules.h says how a violation is
//   reported: an abort in debug builds and tests, FailedPrecondition in release):
//   * no call into a device from a stream's own work (a Launch fn, a completion callback:
//     cudaLaunchHostFunc forbids CUDA calls there);
//   * Free/FreePinned/UnregisterHost of memory that an enqueued, unfinished copy still uses is
//     refused (HostDevice tracks every copy's ranges; CheckIdle lets an arena ask the same of a
//     sub-allocation);
//   * Allocate and Free synchronize the whole device, as cudaMalloc/cudaFree can: on HostDevice
//     they wait for all work enqueued on every stream before the call, so a lock held across
//     them that a stream's callback needs is the deadlock it would be on a GPU; a wait longer
//     than DeviceOptions::host_sync_timeout_seconds is reported as that deadlock, naming the
//     stream and the work it is stuck in. Allocate device memory once (an arena) and
//     sub-allocate.
//
// Thread-safety: every Device method may be called from any thread at once. Streams and events
// belong to their device: Stream* stays valid until the device is destroyed (streams are never
// destroyed earlier); Events may be copied freely but must not be used after their device is
// destroyed. REQUIRES for destruction: no other thread is calling into the device; pending work
// is drained first.
//
// This header is compiled by nvcc too (C++17) and includes no CUDA header, so CPU-only code can
// use the seam: keep it free of C++20 and of CUDA types.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/base/device_rules.h"
#include "src/base/range_ledger.h"
#include "zinf/status.h"

namespace zinf {

class Device;

enum class DeviceKind { kAuto, kHost, kCuda };
std::string_view DeviceKindName(DeviceKind kind);  // "auto", "host", "cuda"
Result<DeviceKind> ParseDeviceKind(std::string_view name);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };
std::string_view CopyKindName(CopyKind kind);  // "h2d", "d2h", "d2d"

// What cudaMalloc guarantees; HostDevice allocations match it so alignment bugs show on a CPU.
inline constexpr uint64_t kDeviceAlignment = 256;
// Pinned allocations are page-aligned (O_DIRECT and io_uring fixed buffers want that).
inline constexpr uint64_t kPinnedAlignment = 4096;
// 1 GB/s as a link rate: decimal, as PCIe and NVMe rates are quoted.
inline constexpr double kBytesPerGb = 1e9;

struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;
  uint64_t budget_bytes = 0;       // device memory budget; required, > 0
  bool require_pinned_host = true;  // refuse copies from or to pageable host memory
  int cuda_ordinal = 0;             // CudaDevice: which GPU
  // HostDevice emulation of a link and a GPU (ignored by CudaDevice):
  double copy_gbps = 0;      // per direction, shared by all streams (full duplex);
                             // 0 = memcpy speed. Device-to-device copies are never paced.
  double compute_flops = 0;  // FLOP/s shared by all streams; 0 = as fast as fn runs
  // How long HostDevice's Allocate/Free wait for the device-wide synchronization before it is
  // reported as a deadlock (device_rules.h).
  double host_sync_timeout_seconds = 60;
};

// Rejects a zero budget, negative or non-finite rates, a negative ordinal.
Status ValidateDeviceOptions(const DeviceOptions& options);

// How often the device's memory and synchronization calls were made (so a test can prove a
// hot path makes none: allocations after start, host waits per unit).
struct DeviceCallStats {
  uint64_t allocations = 0;          // Allocate calls that succeeded
  uint64_t frees = 0;                // Free calls that freed memory
  uint64_t stream_synchronizes = 0;  // StreamSynchronize and Synchronize
  uint64_t event_synchronizes = 0;
};

struct StreamStats {
  uint64_t h2d_bytes = 0;
  uint64_t d2h_bytes = 0;
  uint64_t d2d_bytes = 0;
  uint64_t copies = 0;
  uint64_t launches = 0;
  double flops = 0;            // sum of the flops given to Launch
  double copy_seconds = 0;     // HostDevice: wall seconds spent copying (emulated link included)
  double compute_seconds = 0;  // HostDevice: wall seconds spent in Launch (pacing included)
  double wait_seconds = 0;     // HostDevice: wall seconds blocked in StreamWaitEvent
};

// A FIFO queue of device work. Created by Device::CreateStream, owned by the device.
class Stream {
 public:
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  virtual ~Stream();

  // The name given at creation, used as the Chrome-trace track name.
  const std::string& name() const { return name_; }
  // Creation order on its device, from 0: a stable track id.
  int index() const { return index_; }
  const Device* device() const { return owner_; }
  // A snapshot of the counters; may be read while work runs.
  StreamStats stats() const;
  // CudaDevice: the cudaStream_t, for the CUDA backend to launch its kernels on (cast back with
  // static_cast<cudaStream_t>). HostDevice: nullptr.
  virtual void* NativeHandle() const { return nullptr; }

 protected:
  Stream(const Device* owner, std::string name, int index);
  void AddStats(const StreamStats& delta);  // field-wise sum

 private:
  const Device* owner_;
  const std::string name_;
  const int index_;
  mutable std::mutex stats_mu_;
  StreamStats stats_;  // GUARDED_BY(stats_mu_)
};

// Per-implementation state of a recorded event (HostDevice: stream and position; CudaDevice:
// a cudaEvent_t). Opaque to users.
struct EventState {
  virtual ~EventState();
  const Device* owner = nullptr;
  const Stream* stream = nullptr;  // the stream it was recorded on
};

// A handle on a point in a stream. Cheap to copy; all copies name the same point.
class Event {
 public:
  Event() = default;  // never recorded: complete
  explicit Event(std::shared_ptr<EventState> state) : state_(std::move(state)) {}
  bool recorded() const { return state_ != nullptr; }
  EventState* state() const { return state_.get(); }
  // The stream it was recorded on (nullptr when never recorded).
  const Stream* stream() const { return state_ ? state_->stream : nullptr; }

 private:
  std::shared_ptr<EventState> state_;
};

class Device {
 public:
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  virtual ~Device();

  DeviceKind kind() const { return kind_; }
  const DeviceOptions& options() const { return options_; }
  // One line for logs: "host (budget 1073741824 bytes, copy 25 GB/s, compute 1e+14 FLOP/s)".
  virtual std::string Describe() const = 0;

  // Device memory, under the budget.
  Result<void*> Allocate(uint64_t bytes);
  Status Free(void* ptr);  // nullptr: no-op
  uint64_t budget_bytes() const { return device_memory_.budget_bytes(); }
  uint64_t bytes_in_use() const { return device_memory_.in_use_bytes(); }
  uint64_t peak_bytes() const { return device_memory_.peak_bytes(); }
  void ResetPeak() { device_memory_.ResetPeak(); }
  bool IsDeviceMemory(const void* ptr, uint64_t bytes) const;
  // OK when no enqueued, unfinished copy uses [ptr, ptr + bytes) (device or host memory); else
  // the violation (device_rules.h) naming `what`, the stream and the copy. CudaDevice cannot
  // tell and answers OK. For arenas that hand a sub-allocation back.
  Status CheckIdle(const void* ptr, uint64_t bytes, std::string_view what) const;

  // Pinned host memory.
  Result<void*> AllocatePinned(uint64_t bytes);
  Status FreePinned(void* ptr);  // nullptr: no-op
  Status RegisterHost(void* ptr, uint64_t bytes);
  Status UnregisterHost(void* ptr);
  bool IsPinned(const void* ptr, uint64_t bytes) const;
  uint64_t pinned_bytes() const;  // allocated plus registered

  DeviceCallStats call_stats() const;

  // Makes the calling thread's work go to this device (CudaDevice: cudaSetDevice to its ordinal
  // unless already bound; HostDevice: nothing). Every enqueuing method binds by itself; code
  // that launches its own kernels on a stream's native handle (the CUDA backend) calls this.
  Status BindCurrentThread();

  // Streams and work.
  Result<Stream*> CreateStream(std::string name);
  std::vector<Stream*> streams() const;
  Status CopyToDevice(Stream* stream, void* dst, const void* src, uint64_t bytes);
  Status CopyToHost(Stream* stream, void* dst, const void* src, uint64_t bytes);
  Status CopyOnDevice(Stream* stream, void* dst, const void* src, uint64_t bytes);
  Status Launch(Stream* stream, std::function<Status()> fn, double flops = 0);

  // Events.
  Result<Event> Record(Stream* stream);
  Status StreamWaitEvent(Stream* stream, const Event& event);
  Result<bool> EventQuery(const Event& event);  // true when complete (even if it failed)
  Status EventSynchronize(const Event& event);
  Status StreamSynchronize(Stream* stream);
  Status Synchronize();  // every stream; the first error found

 protected:
  Device(DeviceKind kind, const DeviceOptions& options);

  // Implementation hooks. The public methods above validate (stream and event ownership,
  // ranges, pinning, budget) and keep the ledgers before calling them.
  virtual Result<void*> DoAllocate(uint64_t bytes) = 0;  // aligned to kDeviceAlignment
  virtual Status DoFree(void* ptr) = 0;
  virtual Result<void*> DoAllocatePinned(uint64_t bytes) = 0;  // aligned to kPinnedAlignment
  virtual Status DoFreePinned(void* ptr) = 0;
  virtual Status DoRegisterHost(void* ptr, uint64_t bytes) = 0;
  virtual Status DoUnregisterHost(void* ptr) = 0;
  virtual Result<std::unique_ptr<Stream>> DoCreateStream(std::string name, int index) = 0;
  virtual Status DoCopy(Stream* stream, CopyKind kind, void* dst, const void* src,
                        uint64_t bytes) = 0;
  virtual Status DoLaunch(Stream* stream, std::function<Status()> fn, double flops) = 0;
  virtual Result<Event> DoRecord(Stream* stream) = 0;
  virtual Status DoStreamWaitEvent(Stream* stream, const Event& event) = 0;  // recorded event
  virtual Result<bool> DoEventQuery(const Event& event) = 0;                 // recorded event
  virtual Status DoEventSynchronize(const Event& event) = 0;                 // recorded event
  virtual Status DoStreamSynchronize(Stream* stream) = 0;
  virtual Status DoBindCurrentThread() { return Status::Ok(); }
  // Called by Allocate and Free before they change anything: HostDevice waits here for every
  // stream (the device-wide synchronization of cudaMalloc/cudaFree).
  virtual Status DoMemoryCallSync(std::string_view op) { return Status::Ok(); }
  // See CheckIdle; the default cannot tell and answers OK.
  virtual Status DoCheckIdle(const void* ptr, uint64_t bytes, std::string_view what) const {
    return Status::Ok();
  }

  // For derived destructors, after their streams are drained and before their own members go:
  // destroys the streams, then frees whatever callers leaked (with one warning that names the
  // bytes), through the Do* hooks.
  void ShutDown();

 private:
  Status CheckStream(const Stream* stream, std::string_view op) const;
  Status CheckEvent(const Event& event, std::string_view op) const;
  Status CheckCopy(Stream* stream, CopyKind kind, const void* dst, const void* src,
                   uint64_t bytes) const;

  const DeviceKind kind_;
  const DeviceOptions options_;
  RangeLedger device_memory_;
  RangeLedger pinned_allocations_;
  RangeLedger registered_host_;
  mutable std::mutex streams_mu_;
  std::vector<std::unique_ptr<Stream>> streams_;  // GUARDED_BY(streams_mu_)
  std::atomic<uint64_t> allocations_{0}, frees_{0}, stream_syncs_{0}, event_syncs_{0};
  bool shut_down_ = false;
};

// CUDA when options.kind is kCuda, or kAuto and the build has CUDA and a GPU answers; the host
// device when kHost, or kAuto otherwise (logged once, with the probe's reason).
Result<std::unique_ptr<Device>> MakeDevice(const DeviceOptions& options);
// Always the host-emulated device.
Result<std::unique_ptr<Device>> MakeHostDevice(const DeviceOptions& options);
// The CUDA device: Unimplemented in a build without CUDA, Unavailable when no GPU answers,
// ResourceExhausted when the budget exceeds the GPU's free memory (with the numbers).
Result<std::unique_ptr<Device>> MakeCudaDevice(const DeviceOptions& options);

}  // namespace zinf
