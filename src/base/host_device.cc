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
#include <unordered_map>
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
  // skip: the stream failed earlier; the task must not do its work, only release what it holds.
  using Task = std::function<Status(bool skip)>;
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

  // Queues a task; refuses with the sticky error once the stream has failed. `what` names the
  // work in deadlock reports ("copy h2d 4096 bytes", "Launch"): a string literal or a string
  // that outlives the task.
  Status Enqueue(Task task, std::string what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      queue_.push_back({std::move(task), std::move(what)});
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

  // As WaitFor, until `deadline`: false (and what the stream is running) when it passed.
  bool WaitUntil(uint64_t position, Clock::time_point deadline, std::string* running) {
    std::unique_lock<std::mutex> lock(mu_);
    if (done_cv_.wait_until(lock, deadline, [&] { return completed_ >= position; })) return true;
    *running = fmt::format("task {} of {} ({}), running for {:.1f} s", completed_ + 1, enqueued_,
                           running_, SecondsSince(running_since_));
    return false;
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
    // Everything this thread runs is the stream's own work: no device calls from here.
    StreamCallbackScope scope(this);
    for (;;) {
      Queued item;
      bool skip;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        item = std::move(queue_.front());
        queue_.pop_front();
        skip = !error_.ok();
        running_ = std::move(item.what);
        running_since_ = Clock::now();
      }
      // A skipped task still runs with skip set (the task releases what it holds).
      Status status = RunGuarded(item.task, skip);
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

  static Status RunGuarded(const Task& task, bool skip) {
    try {
      return task(skip);
    } catch (const std::exception& e) {
      return Internal(fmt::format("task threw: {}", e.what()));
    } catch (...) {
      return Internal("task threw a non-standard exception");
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits for tasks
  std::condition_variable done_cv_;  // synchronizers wait for completions
  struct Queued {
    Task task;
    std::string what;
  };
  std::deque<Queued> queue_;         // GUARDED_BY(mu_)
  std::string running_;              // GUARDED_BY(mu_): the task running or last run
  Clock::time_point running_since_;  // GUARDED_BY(mu_)
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

HostDevice::HostDevice(const DeviceOptions& options)
    : Device(DeviceKind::kHost, options), inflight_(std::make_unique<InflightCopies>()) {
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

// The ranges of copies enqueued and not finished, so that a Free of memory they use is caught.
class HostDevice::InflightCopies {
 public:
  uint64_t Add(const void* p, uint64_t bytes, const HostStream* stream, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = ++next_;
    const auto a = reinterpret_cast<uintptr_t>(p);
    live_.emplace(id, Entry{a, a + bytes, stream, std::move(what)});
    return id;
  }
  void Remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(id);
  }
  // A description of the first live copy that overlaps [p, p + bytes), or empty.
  std::string Using(const void* p, uint64_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : live_) {
      if (e.begin < a + bytes && a < e.end) {
        return fmt::format("{} on stream '{}'", e.what, e.stream->name());
      }
    }
    return {};
  }

 private:
  struct Entry {
    uintptr_t begin, end;
    const HostStream* stream;
    std::string what;
  };
  mutable std::mutex mu_;
  uint64_t next_ = 0;                       // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, Entry> live_;  // GUARDED_BY(mu_)
};

Status HostDevice::DoCheckIdle(const void* ptr, uint64_t bytes, std::string_view what) const {
  std::string user = inflight_->Using(ptr, bytes);
  if (user.empty()) return Status::Ok();
  return DeviceRuleViolation(fmt::format(
      "{} of {} + {} bytes while an enqueued, unfinished {} still uses it: wait for that work "
      "(an event or a stream synchronization) before the memory is freed or reused",
      what, ptr, bytes, user));
}

Status HostDevice::DoMemoryCallSync(std::string_view op) {
  // What cudaMalloc/cudaFree may do: wait until the work enqueued on every stream so far has
  // run. A stream stuck past the timeout is the deadlock a GPU would show.
  const auto deadline = Clock::now() + Seconds(options().host_sync_timeout_seconds);
  for (Stream* s : streams()) {
    auto* hs = static_cast<HostStream*>(s);
    std::string running;
    if (!hs->WaitUntil(hs->Position(), deadline, &running)) {
      return DeviceRuleViolation(fmt::format(
          "{}: it synchronizes the whole device (as cudaMalloc/cudaFree), but stream '{}' has "
          "not finished its enqueued work within {} s: it is stuck in {}. A lock held across "
          "Allocate/Free that this stream's callbacks take deadlocks on a GPU; allocate "
          "memory once and sub-allocate instead",
          op, hs->name(), options().host_sync_timeout_seconds, running));
    }
  }
  return Status::Ok();
}

Status HostDevice::DoCopy(Stream* stream, CopyKind kind, void* dst, const void* src,
                          uint64_t bytes) {
  auto* hs = static_cast<HostStream*>(stream);
  PacedResource* lane = kind == CopyKind::kHostToDevice   ? h2d_lane_.get()
                        : kind == CopyKind::kDeviceToHost ? d2h_lane_.get()
                                                          : nullptr;
  std::string what = fmt::format("copy {} of {} bytes {} -> {}", CopyKindName(kind), bytes, src,
                                 dst);
  const uint64_t dst_id = inflight_->Add(dst, bytes, hs, what);
  const uint64_t src_id = inflight_->Add(src, bytes, hs, what);
  InflightCopies* inflight = inflight_.get();
  Status st = hs->Enqueue([hs, lane, kind, dst, src, bytes, inflight, dst_id,
                           src_id](bool skip) -> Status {
    struct Done {  // the ranges are free once the task ends, however it ends
      InflightCopies* r;
      uint64_t a, b;
      ~Done() {
        r->Remove(a);
        r->Remove(b);
      }
    } done{inflight, dst_id, src_id};
    if (skip) return Status::Ok();
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
  }, std::move(what));
  if (!st.ok()) {
    inflight_->Remove(dst_id);
    inflight_->Remove(src_id);
  }
  return st;
}

Status HostDevice::DoLaunch(Stream* stream, std::function<Status()> fn, double flops) {
  auto* hs = static_cast<HostStream*>(stream);
  PacedResource* compute = flops > 0 ? compute_.get() : nullptr;
  return hs->Enqueue([hs, compute, flops, fn = std::move(fn)](bool skip) -> Status {
    if (skip) return Status::Ok();
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
  }, "a Launch function");
}

Result<Event> HostDevice::DoRecord(Stream* stream) {
  auto* hs = static_cast<HostStream*>(stream);
  auto state = std::make_shared<HostEventState>();
  state->owner = this;
  state->EventState::stream = stream;
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
  return waiter->Enqueue([waiter, source, position](bool skip) -> Status {
    if (skip) return Status::Ok();
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
  }, fmt::format("a wait for stream '{}' (position {})", source->name(), position));
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
