#include "src/base/host_device.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace zinf {

namespace {

using Clock = std::chrono::steady_clock;

// Rounded up, so that a paced deadline is never earlier than the exact one.
Clock::duration Seconds(double seconds) {
  return std::chrono::ceil<Clock::duration>(std::chrono::duration<double>(seconds));
}

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

// A resource with a fixed rate (bytes/s or FLOP/s) shared by several threads: bookings are
// served one after another, each lasting units / rate.
class HostDevice::PacedResource {
 public:
  explicit PacedResource(double units_per_second) : rate_(units_per_second) {}

  double rate() const { return rate_; }

  // Books `units` of work starting when the previous booking ends (or now, if idle).
  std::pair<Clock::time_point, Clock::time_point> Book(double units) {
    std::lock_guard<std::mutex> lock(mu_);
    Clock::time_point start = std::max(Clock::now(), free_at_);
    free_at_ = start + Seconds(units / rate_);
    return {start, free_at_};
  }

 private:
  const double rate_;
  std::mutex mu_;
  Clock::time_point free_at_{};  // GUARDED_BY(mu_)
};

// One worker thread running a FIFO of tasks. Positions are counted from 1: task k is the k-th
// enqueued; an event at position p completes when `completed_ >= p`.
class HostDevice::HostStream final : public Stream {
 public:
  using Task = std::function<Status()>;
  using Stream::AddStats;  // tasks account their own work

  HostStream(const Device* owner, std::string name, int index)
      : Stream(owner, std::move(name), index), worker_([this] { Run(); }) {}

  ~HostStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    work_cv_.notify_one();
    worker_.join();  // the worker drains the queue first
  }

  // Queues a task; refuses with the sticky error once the stream has failed.
  Status Enqueue(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      queue_.push_back(std::move(task));
      ++enqueued_;
    }
    work_cv_.notify_one();
    return Status::Ok();
  }

  // The position of the last task enqueued so far.
  uint64_t Position() {
    std::lock_guard<std::mutex> lock(mu_);
    return enqueued_;
  }

  bool Reached(uint64_t position) {
    std::lock_guard<std::mutex> lock(mu_);
    return completed_ >= position;
  }

  void WaitFor(uint64_t position) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= position; });
  }

  // The sticky error if the failing task is at or before `position`, else OK.
  Status ErrorAt(uint64_t position) {
    std::lock_guard<std::mutex> lock(mu_);
    return error_position_ <= position ? error_ : Status::Ok();
  }

  // Waits for everything enqueued so far; returns the sticky error.
  Status Synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t target = enqueued_;
    done_cv_.wait(lock, [&] { return completed_ >= target; });
    return error_;
  }

 private:
  void Run() {
    for (;;) {
      Task task;
      bool skip;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        task = std::move(queue_.front());
        queue_.pop_front();
        skip = !error_.ok();
      }
      Status status = skip ? Status::Ok() : RunGuarded(task);
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++completed_;
        if (!status.ok() && error_.ok()) {
          error_ = status.WithContext(fmt::format("stream '{}'", name()));
          error_position_ = completed_;
        }
      }
      done_cv_.notify_all();
    }
  }

  static Status RunGuarded(const Task& task) {
    try {
      return task();
    } catch (const std::exception& e) {
      return Internal(fmt::format("task threw: {}", e.what()));
    } catch (...) {
      return Internal("task threw a non-standard exception");
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits for tasks
  std::condition_variable done_cv_;  // synchronizers wait for completions
  std::deque<Task> queue_;           // GUARDED_BY(mu_)
  uint64_t enqueued_ = 0;            // GUARDED_BY(mu_)
  uint64_t completed_ = 0;           // GUARDED_BY(mu_)
  Status error_;                     // GUARDED_BY(mu_): the first failure, sticky
  uint64_t error_position_ = std::numeric_limits<uint64_t>::max();  // GUARDED_BY(mu_)
  bool stopping_ = false;            // GUARDED_BY(mu_)
  std::thread worker_;               // last: starts after the members it uses exist
};

struct HostDevice::HostEventState final : EventState {
  // The stream is owned by the device, which outlives its events (device.h REQUIRES).
  HostStream* stream = nullptr;
  uint64_t position = 0;
};

Result<std::unique_ptr<HostDevice>> HostDevice::Create(const DeviceOptions& options) {
  ZINF_RETURN_IF_ERROR(ValidateDeviceOptions(options));
  return std::unique_ptr<HostDevice>(new HostDevice(options));
}

Result<std::unique_ptr<Device>> MakeHostDevice(const DeviceOptions& options) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<HostDevice> device, HostDevice::Create(options));
  return std::unique_ptr<Device>(std::move(device));
}

HostDevice::HostDevice(const DeviceOptions& options) : Device(DeviceKind::kHost, options) {
  if (options.copy_gbps > 0) {
    h2d_lane_ = std::make_unique<PacedResource>(options.copy_gbps * kBytesPerGb);
    d2h_lane_ = std::make_unique<PacedResource>(options.copy_gbps * kBytesPerGb);
  }
  if (options.compute_flops > 0) compute_ = std::make_unique<PacedResource>(options.compute_flops);
}

HostDevice::~HostDevice() { ShutDown(); }

std::string HostDevice::Describe() const {
  std::string copy = options().copy_gbps > 0 ? fmt::format("{} GB/s", options().copy_gbps)
                                             : std::string("memcpy speed");
  std::string compute = options().compute_flops > 0
                            ? fmt::format("{:.3g} FLOP/s", options().compute_flops)
                            : std::string("unpaced");
  return fmt::format("host-emulated device (budget {} bytes, copies {}, compute {})",
                     budget_bytes(), copy, compute);
}

Result<void*> HostDevice::DoAllocate(uint64_t bytes) {
  void* p = std::aligned_alloc(kDeviceAlignment, bytes);
  if (p == nullptr) {
    return ResourceExhausted(fmt::format("host RAM behind the emulated device: aligned_alloc "
                                         "of {} bytes failed", bytes));
  }
  return p;
}

Status HostDevice::DoFree(void* ptr) {
  std::free(ptr);
  return Status::Ok();
}

Result<void*> HostDevice::DoAllocatePinned(uint64_t bytes) {
  void* p = std::aligned_alloc(kPinnedAlignment, bytes);
  if (p == nullptr) {
    return ResourceExhausted(fmt::format("aligned_alloc of {} bytes failed", bytes));
  }
  return p;
}

Status HostDevice::DoFreePinned(void* ptr) {
  std::free(ptr);
  return Status::Ok();
}

Status HostDevice::DoRegisterHost(void*, uint64_t) { return Status::Ok(); }
Status HostDevice::DoUnregisterHost(void*) { return Status::Ok(); }

Result<std::unique_ptr<Stream>> HostDevice::DoCreateStream(std::string name, int index) {
  return std::unique_ptr<Stream>(new HostStream(this, std::move(name), index));
}

Status HostDevice::DoCopy(Stream* stream, CopyKind kind, void* dst, const void* src,
                          uint64_t bytes) {
  auto* hs = static_cast<HostStream*>(stream);
  PacedResource* lane = kind == CopyKind::kHostToDevice   ? h2d_lane_.get()
                        : kind == CopyKind::kDeviceToHost ? d2h_lane_.get()
                                                          : nullptr;
  return hs->Enqueue([hs, lane, kind, dst, src, bytes]() -> Status {
    Clock::time_point t0 = Clock::now();
    auto* d = static_cast<unsigned char*>(dst);
    auto* s = static_cast<const unsigned char*>(src);
    if (lane == nullptr) {
      std::memcpy(d, s, bytes);
    } else {
      // Each chunk lands when the link would have delivered its last byte.
      auto [start, end] = lane->Book(static_cast<double>(bytes));
      for (uint64_t off = 0; off < bytes; off += kCopyChunkBytes) {
        uint64_t len = std::min<uint64_t>(kCopyChunkBytes, bytes - off);
        Clock::time_point lands =
            off + len == bytes ? end
                               : start + Seconds(static_cast<double>(off + len) / lane->rate());
        std::this_thread::sleep_until(lands);
        std::memcpy(d + off, s + off, len);
      }
    }
    StreamStats delta;
    delta.copies = 1;
    if (kind == CopyKind::kHostToDevice) delta.h2d_bytes = bytes;
    if (kind == CopyKind::kDeviceToHost) delta.d2h_bytes = bytes;
    if (kind == CopyKind::kDeviceToDevice) delta.d2d_bytes = bytes;
    delta.copy_seconds = SecondsSince(t0);
    hs->AddStats(delta);
    return Status::Ok();
  });
}

Status HostDevice::DoLaunch(Stream* stream, std::function<Status()> fn, double flops) {
  auto* hs = static_cast<HostStream*>(stream);
  PacedResource* compute = flops > 0 ? compute_.get() : nullptr;
  return hs->Enqueue([hs, compute, flops, fn = std::move(fn)]() -> Status {
    Clock::time_point t0 = Clock::now();
    Clock::time_point done{};
    if (compute != nullptr) done = compute->Book(flops).second;
    Status status = fn();
    if (compute != nullptr) std::this_thread::sleep_until(done);
    StreamStats delta;
    delta.launches = 1;
    delta.flops = flops;
    delta.compute_seconds = SecondsSince(t0);
    hs->AddStats(delta);
    return status.ok() ? status : status.WithContext("Launch");
  });
}

Result<Event> HostDevice::DoRecord(Stream* stream) {
  auto* hs = static_cast<HostStream*>(stream);
  auto state = std::make_shared<HostEventState>();
  state->owner = this;
  state->stream = hs;
  state->position = hs->Position();
  return Event(std::move(state));
}

Status HostDevice::DoStreamWaitEvent(Stream* stream, const Event& event) {
  auto* waiter = static_cast<HostStream*>(stream);
  const auto* state = static_cast<const HostEventState*>(event.state());
  HostStream* source = state->stream;
  if (source == waiter) return Status::Ok();  // FIFO already orders it
  uint64_t position = state->position;
  return waiter->Enqueue([waiter, source, position]() -> Status {
    Clock::time_point t0 = Clock::now();
    source->WaitFor(position);
    StreamStats delta;
    delta.wait_seconds = SecondsSince(t0);
    waiter->AddStats(delta);
    Status upstream = source->ErrorAt(position);
    if (!upstream.ok()) {
      return Aborted(fmt::format("waited on an event of stream '{}', which failed: {}",
                                 source->name(), upstream.ToString()));
    }
    return Status::Ok();
  });
}

Result<bool> HostDevice::DoEventQuery(const Event& event) {
  const auto* state = static_cast<const HostEventState*>(event.state());
  return state->stream->Reached(state->position);
}

Status HostDevice::DoEventSynchronize(const Event& event) {
  const auto* state = static_cast<const HostEventState*>(event.state());
  HostStream* source = state->stream;
  source->WaitFor(state->position);
  return source->ErrorAt(state->position);
}

Status HostDevice::DoStreamSynchronize(Stream* stream) {
  return static_cast<HostStream*>(stream)->Synchronize();
}

}  // namespace zinf
