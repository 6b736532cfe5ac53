// The implementation-independent half of the Device seam: argument checks, the memory ledgers,
// stream ownership, shutdown, and the factory that picks an implementation.
#include "src/base/device.h"

#include <cassert>
#include <cmath>

#include <fmt/format.h>

#include "src/base/cuda_probe.h"
#include "src/base/log.h"

namespace zinf {

namespace {

uint64_t RoundUp(uint64_t bytes, uint64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

}  // namespace

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kAuto: return "auto";
    case DeviceKind::kHost: return "host";
    case DeviceKind::kCuda: return "cuda";
  }
  return "unknown";
}

Result<DeviceKind> ParseDeviceKind(std::string_view name) {
  for (DeviceKind k : {DeviceKind::kAuto, DeviceKind::kHost, DeviceKind::kCuda}) {
    if (name == DeviceKindName(k)) return k;
  }
  return InvalidArgument(fmt::format("device kind '{}': expected auto, host or cuda", name));
}

std::string_view CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return "h2d";
    case CopyKind::kDeviceToHost: return "d2h";
    case CopyKind::kDeviceToDevice: return "d2d";
  }
  return "unknown";
}

Status ValidateDeviceOptions(const DeviceOptions& o) {
  if (o.budget_bytes == 0) {
    return InvalidArgument("device budget_bytes is 0: give the device memory budget in bytes");
  }
  if (!std::isfinite(o.copy_gbps) || o.copy_gbps < 0) {
    return InvalidArgument(fmt::format("device copy_gbps {}: expected a finite rate >= 0 "
                                       "(0 = memcpy speed)", o.copy_gbps));
  }
  if (!std::isfinite(o.compute_flops) || o.compute_flops < 0) {
    return InvalidArgument(fmt::format("device compute_flops {}: expected a finite rate >= 0 "
                                       "(0 = unpaced)", o.compute_flops));
  }
  if (o.cuda_ordinal < 0) {
    return InvalidArgument(fmt::format("device cuda_ordinal {}: expected >= 0", o.cuda_ordinal));
  }
  return Status::Ok();
}

// --- Stream and Event ---

Stream::Stream(const Device* owner, std::string name, int index)
    : owner_(owner), name_(std::move(name)), index_(index) {}

Stream::~Stream() = default;

StreamStats Stream::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

void Stream::AddStats(const StreamStats& d) {
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.h2d_bytes += d.h2d_bytes;
  stats_.d2h_bytes += d.d2h_bytes;
  stats_.d2d_bytes += d.d2d_bytes;
  stats_.copies += d.copies;
  stats_.launches += d.launches;
  stats_.flops += d.flops;
  stats_.copy_seconds += d.copy_seconds;
  stats_.compute_seconds += d.compute_seconds;
  stats_.wait_seconds += d.wait_seconds;
}

EventState::~EventState() = default;

// --- Device ---

Device::Device(DeviceKind kind, const DeviceOptions& options)
    : kind_(kind),
      options_(options),
      device_memory_("device memory", options.budget_bytes),
      pinned_allocations_("pinned host memory"),
      registered_host_("registered host memory") {}

Device::~Device() {
  // Derived destructors must call ShutDown: their streams use their members.
  assert(shut_down_ && "a Device implementation did not call ShutDown() in its destructor");
}

void Device::ShutDown() {
  std::vector<std::unique_ptr<Stream>> streams;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams.swap(streams_);
    shut_down_ = true;
  }
  // Drain every stream before destroying any: work on one may wait on an event of another.
  for (auto& s : streams) DoStreamSynchronize(s.get()).IgnoreError();
  streams.clear();

  uint64_t leaked = 0;
  size_t leaked_ranges = 0;
  for (const auto& [ptr, bytes] : device_memory_.Snapshot()) {
    leaked += bytes;
    ++leaked_ranges;
    Free(ptr).IgnoreError();
  }
  for (const auto& [ptr, bytes] : pinned_allocations_.Snapshot()) {
    leaked += bytes;
    ++leaked_ranges;
    FreePinned(ptr).IgnoreError();
  }
  for (const auto& [ptr, bytes] : registered_host_.Snapshot()) {
    leaked += bytes;
    ++leaked_ranges;
    UnregisterHost(ptr).IgnoreError();
  }
  if (leaked_ranges > 0) {
    Log().warn("{} device: {} allocations or registrations ({} bytes) were still live at "
               "shutdown; released them",
               DeviceKindName(kind_), leaked_ranges, leaked);
  }
}

Result<void*> Device::Allocate(uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("device Allocate"));
  ZINF_RETURN_IF_ERROR(DoMemoryCallSync("device Allocate"));
  if (bytes == 0) return InvalidArgument("device Allocate: 0 bytes requested");
  uint64_t accounted = RoundUp(bytes, kDeviceAlignment);
  Status admitted = device_memory_.Reserve(accounted);
  if (!admitted.ok()) {
    return admitted.WithContext(
        fmt::format("device Allocate {} bytes ({} with alignment)", bytes, accounted));
  }
  Result<void*> ptr = DoAllocate(accounted);
  if (!ptr.ok()) {
    device_memory_.Cancel(accounted);
    return ptr.status().WithContext(fmt::format("device Allocate {} bytes", bytes));
  }
  Status s = device_memory_.Commit(*ptr, bytes, accounted);
  if (!s.ok()) {  // the allocator handed out live memory twice: not ours to fix, but say so
    device_memory_.Cancel(accounted);
    return Internal("device Allocate: " + s.message());
  }
  allocations_++;
  return ptr;
}

Status Device::Free(void* ptr) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("device Free"));
  if (ptr == nullptr) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(uint64_t length, device_memory_.Length(ptr));
  ZINF_RETURN_IF_ERROR(DoCheckIdle(ptr, length, "device Free"));
  ZINF_RETURN_IF_ERROR(DoMemoryCallSync("device Free"));
  ZINF_ASSIGN_OR_RETURN(uint64_t accounted, device_memory_.Erase(ptr));
  (void)accounted;
  frees_++;
  return DoFree(ptr);
}

bool Device::IsDeviceMemory(const void* ptr, uint64_t bytes) const {
  return device_memory_.Covers(ptr, bytes);
}

Result<void*> Device::AllocatePinned(uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("AllocatePinned"));
  if (bytes == 0) return InvalidArgument("AllocatePinned: 0 bytes requested");
  uint64_t accounted = RoundUp(bytes, kPinnedAlignment);
  ZINF_RETURN_IF_ERROR(pinned_allocations_.Reserve(accounted));
  Result<void*> ptr = DoAllocatePinned(accounted);
  if (!ptr.ok()) {
    pinned_allocations_.Cancel(accounted);
    return ptr.status().WithContext(fmt::format("AllocatePinned {} bytes", bytes));
  }
  Status s = pinned_allocations_.Commit(*ptr, bytes, accounted);
  if (!s.ok()) {
    pinned_allocations_.Cancel(accounted);
    return Internal("AllocatePinned: " + s.message());
  }
  return ptr;
}

Status Device::FreePinned(void* ptr) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("FreePinned"));
  if (ptr == nullptr) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(uint64_t length, pinned_allocations_.Length(ptr));
  ZINF_RETURN_IF_ERROR(DoCheckIdle(ptr, length, "FreePinned"));
  ZINF_ASSIGN_OR_RETURN(uint64_t accounted, pinned_allocations_.Erase(ptr));
  (void)accounted;
  return DoFreePinned(ptr);
}

Status Device::RegisterHost(void* ptr, uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("RegisterHost"));
  if (ptr == nullptr || bytes == 0) {
    return InvalidArgument(fmt::format("RegisterHost: empty range {} + {} bytes", ptr, bytes));
  }
  if (pinned_allocations_.Overlaps(ptr, bytes) || registered_host_.Overlaps(ptr, bytes)) {
    return InvalidArgument(fmt::format(
        "RegisterHost: {} + {} bytes overlaps memory that is already pinned", ptr, bytes));
  }
  ZINF_RETURN_IF_ERROR(registered_host_.Reserve(bytes));
  Status s = DoRegisterHost(ptr, bytes);
  if (!s.ok()) {
    registered_host_.Cancel(bytes);
    return s.WithContext(fmt::format("RegisterHost {} + {} bytes", ptr, bytes));
  }
  s = registered_host_.Commit(ptr, bytes, bytes);
  if (!s.ok()) {  // lost a race with another registration of an overlapping range
    registered_host_.Cancel(bytes);
    DoUnregisterHost(ptr).IgnoreError();
    return s;
  }
  return Status::Ok();
}

Status Device::UnregisterHost(void* ptr) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("UnregisterHost"));
  ZINF_ASSIGN_OR_RETURN(uint64_t length, registered_host_.Length(ptr));
  ZINF_RETURN_IF_ERROR(DoCheckIdle(ptr, length, "UnregisterHost"));
  ZINF_ASSIGN_OR_RETURN(uint64_t bytes, registered_host_.Erase(ptr));
  (void)bytes;
  return DoUnregisterHost(ptr);
}

Status Device::CheckIdle(const void* ptr, uint64_t bytes, std::string_view what) const {
  return DoCheckIdle(ptr, bytes, what);
}

bool Device::IsPinned(const void* ptr, uint64_t bytes) const {
  return pinned_allocations_.Covers(ptr, bytes) || registered_host_.Covers(ptr, bytes);
}

uint64_t Device::pinned_bytes() const {
  return pinned_allocations_.in_use_bytes() + registered_host_.in_use_bytes();
}

DeviceCallStats Device::call_stats() const {
  return {allocations_.load(), frees_.load(), stream_syncs_.load(), event_syncs_.load()};
}

Status Device::BindCurrentThread() {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("BindCurrentThread"));
  return DoBindCurrentThread();
}

Result<Stream*> Device::CreateStream(std::string name) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("CreateStream"));
  std::lock_guard<std::mutex> lock(streams_mu_);
  if (shut_down_) return FailedPrecondition("CreateStream: the device is shutting down");
  int index = static_cast<int>(streams_.size());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, DoCreateStream(std::move(name), index));
  streams_.push_back(std::move(stream));
  return streams_.back().get();
}

std::vector<Stream*> Device::streams() const {
  std::lock_guard<std::mutex> lock(streams_mu_);
  std::vector<Stream*> out;
  for (const auto& s : streams_) out.push_back(s.get());
  return out;
}

Status Device::CheckStream(const Stream* stream, std::string_view op) const {
  if (stream == nullptr) return InvalidArgument(fmt::format("{}: null stream", op));
  if (stream->device() != this) {
    return InvalidArgument(
        fmt::format("{}: stream '{}' belongs to another device", op, stream->name()));
  }
  return Status::Ok();
}

Status Device::CheckEvent(const Event& event, std::string_view op) const {
  if (event.recorded() && event.state()->owner != this) {
    return InvalidArgument(fmt::format("{}: the event was recorded on another device", op));
  }
  return Status::Ok();
}

Status Device::CheckCopy(Stream* stream, CopyKind kind, const void* dst, const void* src,
                         uint64_t bytes) const {
  std::string op = fmt::format("copy {} {} bytes {} -> {}", CopyKindName(kind), bytes, src, dst);
  ZINF_RETURN_IF_ERROR(CheckStream(stream, op));
  op += fmt::format(" on stream '{}'", stream->name());
  bool dst_on_device = kind != CopyKind::kDeviceToHost;
  bool src_on_device = kind != CopyKind::kHostToDevice;
  auto check = [&](const void* p, bool on_device, std::string_view role) -> Status {
    if (on_device) {
      if (!device_memory_.Covers(p, bytes)) {
        return InvalidArgument(fmt::format(
            "{}: the {} is not inside one live device allocation", op, role));
      }
      return Status::Ok();
    }
    if (p == nullptr) return InvalidArgument(fmt::format("{}: null host {}", op, role));
    if (options_.require_pinned_host && !IsPinned(p, bytes)) {
      return InvalidArgument(fmt::format(
          "{}: the host {} is not pinned (AllocatePinned or RegisterHost it: a pageable copy "
          "would be synchronous on a GPU)",
          op, role));
    }
    return Status::Ok();
  };
  ZINF_RETURN_IF_ERROR(check(dst, dst_on_device, "destination"));
  return check(src, src_on_device, "source");
}

Status Device::CopyToDevice(Stream* stream, void* dst, const void* src, uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("CopyToDevice"));
  if (bytes == 0) return CheckStream(stream, "CopyToDevice");
  ZINF_RETURN_IF_ERROR(CheckCopy(stream, CopyKind::kHostToDevice, dst, src, bytes));
  return DoCopy(stream, CopyKind::kHostToDevice, dst, src, bytes);
}

Status Device::CopyToHost(Stream* stream, void* dst, const void* src, uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("CopyToHost"));
  if (bytes == 0) return CheckStream(stream, "CopyToHost");
  ZINF_RETURN_IF_ERROR(CheckCopy(stream, CopyKind::kDeviceToHost, dst, src, bytes));
  return DoCopy(stream, CopyKind::kDeviceToHost, dst, src, bytes);
}

Status Device::CopyOnDevice(Stream* stream, void* dst, const void* src, uint64_t bytes) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("CopyOnDevice"));
  if (bytes == 0) return CheckStream(stream, "CopyOnDevice");
  ZINF_RETURN_IF_ERROR(CheckCopy(stream, CopyKind::kDeviceToDevice, dst, src, bytes));
  return DoCopy(stream, CopyKind::kDeviceToDevice, dst, src, bytes);
}

Status Device::Launch(Stream* stream, std::function<Status()> fn, double flops) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("Launch"));
  ZINF_RETURN_IF_ERROR(CheckStream(stream, "Launch"));
  if (!fn) return InvalidArgument(fmt::format("Launch on stream '{}': empty function",
                                              stream->name()));
  if (!std::isfinite(flops) || flops < 0) {
    return InvalidArgument(fmt::format("Launch on stream '{}': flops {} must be finite and >= 0",
                                       stream->name(), flops));
  }
  return DoLaunch(stream, std::move(fn), flops);
}

Result<Event> Device::Record(Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("Record"));
  ZINF_RETURN_IF_ERROR(CheckStream(stream, "Record"));
  return DoRecord(stream);
}

Status Device::StreamWaitEvent(Stream* stream, const Event& event) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("StreamWaitEvent"));
  ZINF_RETURN_IF_ERROR(CheckStream(stream, "StreamWaitEvent"));
  ZINF_RETURN_IF_ERROR(CheckEvent(event, "StreamWaitEvent"));
  if (!event.recorded()) return Status::Ok();
  return DoStreamWaitEvent(stream, event);
}

Result<bool> Device::EventQuery(const Event& event) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("EventQuery"));
  ZINF_RETURN_IF_ERROR(CheckEvent(event, "EventQuery"));
  if (!event.recorded()) return true;
  return DoEventQuery(event);
}

Status Device::EventSynchronize(const Event& event) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("EventSynchronize"));
  event_syncs_++;
  ZINF_RETURN_IF_ERROR(CheckEvent(event, "EventSynchronize"));
  if (!event.recorded()) return Status::Ok();
  return DoEventSynchronize(event);
}

Status Device::StreamSynchronize(Stream* stream) {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("StreamSynchronize"));
  stream_syncs_++;
  ZINF_RETURN_IF_ERROR(CheckStream(stream, "StreamSynchronize"));
  return DoStreamSynchronize(stream);
}

Status Device::Synchronize() {
  ZINF_RETURN_IF_ERROR(CheckNotInStreamCallback("Synchronize"));
  stream_syncs_++;
  Status first;
  for (Stream* s : streams()) {
    Status st = DoStreamSynchronize(s);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

// --- Factory ---

Result<std::unique_ptr<Device>> MakeDevice(const DeviceOptions& options) {
  ZINF_RETURN_IF_ERROR(ValidateDeviceOptions(options));
  switch (options.kind) {
    case DeviceKind::kHost: return MakeHostDevice(options);
    case DeviceKind::kCuda: return MakeCudaDevice(options);
    case DeviceKind::kAuto: break;
  }
  CudaProbe probe = ProbeCuda();
  if (probe.device_count > 0) return MakeCudaDevice(options);
  InfoOnce("device-auto-host",
           "no GPU answers (" + probe.detail + "): using the host-emulated device");
  return MakeHostDevice(options);
}

}  // namespace zinf
