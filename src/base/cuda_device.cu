// CudaDevice: the Device seam on a GPU (compiled by nvcc when the build has CUDA).
//
// Memory: cudaMalloc/cudaFree (not cudaMallocAsync: the budget and device.h's contract want an
// allocation to exist when Allocate returns, and callers allocate arenas once). Pinned memory
// is page-aligned host memory registered with cudaHostRegister(Portable), so AllocatePinned
// and RegisterHost share one path and kPinnedAlignment holds. Streams are non-blocking
// (cudaStreamNonBlocking: no implicit sync with the legacy default stream); events are created
// per Record with timing disabled (the cheapest kind). Launch is cudaLaunchHostFunc.
//
// Sticky host errors: a Launch fn that fails is remembered on its stream with its position
// (the count of host functions launched on the stream so far); later Launches on the stream
// are skipped, copies still run (CUDA cannot skip them), and StreamSynchronize / later
// enqueues return the error. An event records that position, so EventSynchronize reports only
// failures before it; StreamWaitEvent adds a host function after the wait that propagates
// such a failure to the waiting stream, and only when the source stream has launched host
// functions before the event, so pure copy pipelines pay nothing for it.
//
// Every CUDA error becomes a Status naming the call, the stream and cudaGetErrorString.
// This file is C++17 (nvcc) and uses no fmt, to keep nvcc away from heavy host headers.
#include <cuda_runtime.h>

#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>

#include "src/base/device.h"

namespace zinf {

namespace {

std::string Ptr(const void* p) {
  std::ostringstream out;
  out << p;
  return out.str();
}

StatusCode CodeFor(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation: return StatusCode::kResourceExhausted;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorHostMemoryNotRegistered: return StatusCode::kInvalidArgument;
    case cudaErrorHostMemoryAlreadyRegistered: return StatusCode::kAlreadyExists;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable: return StatusCode::kUnavailable;
    case cudaErrorNotSupported: return StatusCode::kUnimplemented;
    default: return StatusCode::kInternal;
  }
}

Status CudaStatus(cudaError_t err, const std::string& call) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(CodeFor(err), call + ": " + cudaGetErrorString(err) + " (" +
                                  cudaGetErrorName(err) + ")");
}

#define ZINF_CUDA_RETURN_IF_ERROR(expr, what) \
  ZINF_RETURN_IF_ERROR(::zinf::CudaStatus((expr), (what)))

class CudaStream final : public Stream {
 public:
  using Stream::AddStats;

  CudaStream(const Device* owner, std::string name, int index, cudaStream_t stream)
      : Stream(owner, std::move(name), index), stream_(stream) {}
  ~CudaStream() override { cudaStreamDestroy(stream_); }

  void* NativeHandle() const override { return stream_; }
  cudaStream_t stream() const { return stream_; }

  // Held while assigning a host-function position and enqueuing it, so positions follow
  // the stream's order.
  std::mutex& enqueue_mu() { return enqueue_mu_; }
  uint64_t NextPositionLocked() { return ++host_fns_; }  // REQUIRES: enqueue_mu() held
  uint64_t PositionLocked() const { return host_fns_; }  // REQUIRES: enqueue_mu() held

  Status Sticky() {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_;
  }
  Status ErrorAt(uint64_t position) {
    std::lock_guard<std::mutex> lock(error_mu_);
    return error_position_ <= position ? error_ : Status::Ok();
  }
  void Fail(const Status& status, uint64_t position) {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_.ok()) return;
    // (void): nvcc's front end warns on assigning a [[nodiscard]] type, gcc does not.
    (void)(error_ = status.WithContext("stream '" + name() + "'"));
    error_position_ = position;
  }

 private:
  const cudaStream_t stream_;
  std::mutex enqueue_mu_;
  uint64_t host_fns_ = 0;  // GUARDED_BY(enqueue_mu_)
  std::mutex error_mu_;
  Status error_;           // GUARDED_BY(error_mu_)
  uint64_t error_position_ = std::numeric_limits<uint64_t>::max();  // GUARDED_BY(error_mu_)
};

struct CudaEventState final : EventState {
  ~CudaEventState() override {
    if (event != nullptr) cudaEventDestroy(event);
  }
  cudaEvent_t event = nullptr;
  CudaStream* stream = nullptr;  // owned by the device, which outlives its events
  uint64_t position = 0;         // host functions launched on `stream` before the event
};

// One host function in flight; owned by the callback, which deletes it.
struct HostCall {
  CudaStream* stream;
  std::function<Status()> fn;
  uint64_t position;
};

Status RunGuarded(const std::function<Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Internal(std::string("host function threw: ") + e.what());
  } catch (...) {
    return Internal("host function threw a non-standard exception");
  }
}

void CUDART_CB RunHostCall(void* data) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(data));
  // CUDA forbids CUDA calls from here: every Device method refuses under this scope.
  StreamCallbackScope scope(call->stream);
  if (!call->stream->Sticky().ok()) return;  // skip work after a failure
  Status status = RunGuarded(call->fn);
  if (!status.ok()) call->stream->Fail(status.WithContext("Launch"), call->position);
}

class CudaDevice final : public Device {
 public:
  static Result<std::unique_ptr<Device>> Create(const DeviceOptions& options) {
    ZINF_RETURN_IF_ERROR(ValidateDeviceOptions(options));
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear, so later calls start clean
      return Status(StatusCode::kUnavailable,
                    std::string("no CUDA device answers: ") + cudaGetErrorString(err));
    }
    if (count == 0) return Status(StatusCode::kUnavailable, "no CUDA device answers: 0 devices");
    if (options.cuda_ordinal >= count) {
      return InvalidArgument("cuda_ordinal " + std::to_string(options.cuda_ordinal) +
                             ": this machine has " + std::to_string(count) + " CUDA devices");
    }
    std::string where = "cuda:" + std::to_string(options.cuda_ordinal);
    ZINF_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.cuda_ordinal), "cudaSetDevice " + where);
    cudaDeviceProp prop{};
    ZINF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.cuda_ordinal),
                              "cudaGetDeviceProperties " + where);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    ZINF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo " + where);
    std::string description = where + " " + prop.name + " (sm_" + std::to_string(prop.major) +
                              std::to_string(prop.minor) + ", " + std::to_string(total_bytes) +
                              " bytes)";
    if (options.budget_bytes > free_bytes) {
      return ResourceExhausted("device budget " + std::to_string(options.budget_bytes) +
                               " bytes exceeds the free memory of " + description + ": " +
                               std::to_string(free_bytes) + " bytes free of " +
                               std::to_string(total_bytes) + "; lower the device budget");
    }
    return std::unique_ptr<Device>(new CudaDevice(options, std::move(description)));
  }

  ~CudaDevice() override { ShutDown(); }

  std::string Describe() const override {
    return description_ + ", budget " + std::to_string(budget_bytes()) + " bytes";
  }

 private:
  CudaDevice(const DeviceOptions& options, std::string description)
      : Device(DeviceKind::kCuda, options), description_(std::move(description)) {}

  // The current device is per thread, and callers come from any thread (the executor, the I/O
  // reaper completing a load, the optimizer thread): every call that enqueues or waits binds
  // the calling thread to this device's ordinal first. cudaGetDevice reads the runtime's
  // per-thread state (no driver call), so an already bound thread pays almost nothing.
  Status Bind() const {
    int current = -1;
    if (cudaGetDevice(&current) == cudaSuccess && current == options().cuda_ordinal) {
      return Status::Ok();
    }
    return CudaStatus(cudaSetDevice(options().cuda_ordinal),
                      "cudaSetDevice " + std::to_string(options().cuda_ordinal));
  }

  Status DoBindCurrentThread() override { return Bind(); }

  Result<void*> DoAllocate(uint64_t bytes) override {
    ZINF_RETURN_IF_ERROR(Bind());
    void* p = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes),
                              "cudaMalloc " + std::to_string(bytes) + " bytes");
    return p;
  }

  Status DoFree(void* ptr) override {
    ZINF_RETURN_IF_ERROR(Bind());
    return CudaStatus(cudaFree(ptr), "cudaFree " + Ptr(ptr));
  }

  Result<void*> DoAllocatePinned(uint64_t bytes) override {
    void* p = std::aligned_alloc(kPinnedAlignment, bytes);
    if (p == nullptr) {
      return ResourceExhausted("aligned_alloc of " + std::to_string(bytes) + " bytes failed");
    }
    Status s = DoRegisterHost(p, bytes);
    if (!s.ok()) {
      std::free(p);
      return s;
    }
    return p;
  }

  Status DoFreePinned(void* ptr) override {
    Status s = DoUnregisterHost(ptr);
    std::free(ptr);
    return s;
  }

  Status DoRegisterHost(void* ptr, uint64_t bytes) override {
    ZINF_RETURN_IF_ERROR(Bind());
    return CudaStatus(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable),
                      "cudaHostRegister " + Ptr(ptr) + " + " + std::to_string(bytes) +
                          " bytes (is RLIMIT_MEMLOCK large enough?)");
  }

  Status DoUnregisterHost(void* ptr) override {
    ZINF_RETURN_IF_ERROR(Bind());
    return CudaStatus(cudaHostUnregister(ptr), "cudaHostUnregister " + Ptr(ptr));
  }

  Result<std::unique_ptr<Stream>> DoCreateStream(std::string name, int index) override {
    ZINF_RETURN_IF_ERROR(Bind());
    cudaStream_t s = nullptr;
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                              "cudaStreamCreateWithFlags for stream '" + name + "'");
    return std::unique_ptr<Stream>(new CudaStream(this, std::move(name), index, s));
  }

  Status DoCopy(Stream* stream, CopyKind kind, void* dst, const void* src,
                uint64_t bytes) override {
    auto* cs = static_cast<CudaStream*>(stream);
    ZINF_RETURN_IF_ERROR(cs->Sticky());
    ZINF_RETURN_IF_ERROR(Bind());
    cudaMemcpyKind cuda_kind = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                               : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                                 : cudaMemcpyDeviceToDevice;
    ZINF_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, bytes, cuda_kind, cs->stream()),
        "cudaMemcpyAsync " + std::string(CopyKindName(kind)) + " " + std::to_string(bytes) +
            " bytes " + Ptr(src) + " -> " + Ptr(dst) + " on stream '" + cs->name() + "'");
    StreamStats delta;
    delta.copies = 1;
    if (kind == CopyKind::kHostToDevice) delta.h2d_bytes = bytes;
    if (kind == CopyKind::kDeviceToHost) delta.d2h_bytes = bytes;
    if (kind == CopyKind::kDeviceToDevice) delta.d2d_bytes = bytes;
    cs->AddStats(delta);
    return Status::Ok();
  }

  // Enqueues fn as a host function; the caller accounts it.
  Status EnqueueHostCall(CudaStream* cs, std::function<Status()> fn) {
    ZINF_RETURN_IF_ERROR(Bind());
    std::lock_guard<std::mutex> lock(cs->enqueue_mu());
    auto call = std::make_unique<HostCall>(HostCall{cs, std::move(fn), 0});
    call->position = cs->NextPositionLocked();
    ZINF_CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(cs->stream(), RunHostCall, call.get()),
                              "cudaLaunchHostFunc on stream '" + cs->name() + "'");
    call.release();  // RunHostCall owns it now
    return Status::Ok();
  }

  Status DoLaunch(Stream* stream, std::function<Status()> fn, double flops) override {
    auto* cs = static_cast<CudaStream*>(stream);
    ZINF_RETURN_IF_ERROR(cs->Sticky());
    ZINF_RETURN_IF_ERROR(EnqueueHostCall(cs, std::move(fn)));
    StreamStats delta;
    delta.launches = 1;
    delta.flops = flops;
    cs->AddStats(delta);
    return Status::Ok();
  }

  Result<Event> DoRecord(Stream* stream) override {
    auto* cs = static_cast<CudaStream*>(stream);
    ZINF_RETURN_IF_ERROR(Bind());
    auto state = std::make_shared<CudaEventState>();
    state->owner = this;
    state->EventState::stream = stream;
    state->stream = cs;
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&state->event, cudaEventDisableTiming),
                              "cudaEventCreateWithFlags on stream '" + cs->name() + "'");
    std::lock_guard<std::mutex> lock(cs->enqueue_mu());
    state->position = cs->PositionLocked();
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventRecord(state->event, cs->stream()),
                              "cudaEventRecord on stream '" + cs->name() + "'");
    return Event(std::move(state));
  }

  Status DoStreamWaitEvent(Stream* stream, const Event& event) override {
    auto* waiter = static_cast<CudaStream*>(stream);
    const auto* state = static_cast<const CudaEventState*>(event.state());
    CudaStream* source = state->stream;
    if (source == waiter) return Status::Ok();  // stream order already covers it
    ZINF_RETURN_IF_ERROR(waiter->Sticky());
    ZINF_RETURN_IF_ERROR(Bind());
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(waiter->stream(), state->event, 0),
                              "cudaStreamWaitEvent: stream '" + waiter->name() +
                                  "' on an event of stream '" + source->name() + "'");
    if (state->position == 0) return Status::Ok();  // no host function before it could fail
    uint64_t position = state->position;
    return EnqueueHostCall(waiter, [source, position]() -> Status {
      Status upstream = source->ErrorAt(position);
      if (upstream.ok()) return upstream;
      return Aborted("waited on an event of stream '" + source->name() +
                     "', which failed: " + upstream.ToString());
    });
  }

  Result<bool> DoEventQuery(const Event& event) override {
    const auto* state = static_cast<const CudaEventState*>(event.state());
    ZINF_RETURN_IF_ERROR(Bind());
    cudaError_t err = cudaEventQuery(state->event);
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaStatus(err, "cudaEventQuery on stream '" + state->stream->name() + "'");
  }

  Status DoEventSynchronize(const Event& event) override {
    const auto* state = static_cast<const CudaEventState*>(event.state());
    ZINF_RETURN_IF_ERROR(Bind());
    ZINF_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(state->event),
                              "cudaEventSynchronize on stream '" + state->stream->name() + "'");
    return state->stream->ErrorAt(state->position);
  }

  Status DoStreamSynchronize(Stream* stream) override {
    auto* cs = static_cast<CudaStream*>(stream);
    ZINF_RETURN_IF_ERROR(Bind());
    ZINF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cs->stream()),
                              "cudaStreamSynchronize on stream '" + cs->name() + "'");
    return cs->Sticky();
  }

  const std::string description_;
};

}  // namespace

Result<std::unique_ptr<Device>> MakeCudaDevice(const DeviceOptions& options) {
  return CudaDevice::Create(options);
}

}  // namespace zinf
