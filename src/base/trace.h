// src/base/trace.h — Chrome trace-event JSON (opens in chrome://tracing and ui.perfetto.dev).
//
// Contract: a Tracer collects complete events ("ph":"X": name, track, start, duration) and
// counters while enabled, and Write() emits {"traceEvents": [...]} with one named track
// ("thread") per Track() name — one per device stream, I/O queue, Adam worker. Times are
// microseconds since the tracer was made. A disabled tracer (the default, and a null pointer
// everywhere the code takes a Tracer*) costs one branch per event.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Tracer(bool enabled = true);
  bool enabled() const { return enabled_; }

  // A stable id for a named track (created on first use).
  int Track(std::string_view name);
  // An event on `track` from `start` to `end`; `args` is a JSON object's text or empty.
  void Complete(int track, std::string_view name, Clock::time_point start, Clock::time_point end,
                std::string_view category = "", std::string_view args = "");
  void Counter(std::string_view name, Clock::time_point at, double value);

  size_t event_count() const;
  std::string ToJson() const;
  Status Write(const std::string& path) const;

 private:
  struct Event {
    int track;
    std::string name, category, args;
    double ts_us, dur_us;
    bool counter;
    double value;
  };
  double Micros(Clock::time_point t) const;

  const bool enabled_;
  const Clock::time_point origin_;
  mutable std::mutex mu_;
  std::vector<std::string> tracks_;
  std::vector<Event> events_;
};

// Records one span on destruction (or at End()).
class TraceSpan {
 public:
  TraceSpan(Tracer* t, int track, std::string_view name, std::string_view category = "")
      : tracer_(t && t->enabled() ? t : nullptr), track_(track), name_(name), category_(category),
        start_(Tracer::Clock::now()) {}
  ~TraceSpan() { End(); }
  void End() {
    if (tracer_) tracer_->Complete(track_, name_, start_, Tracer::Clock::now(), category_);
    tracer_ = nullptr;
  }

 private:
  Tracer* tracer_;
  int track_;
  std::string name_, category_;
  Tracer::Clock::time_point start_;
};

}  // namespace zinf
