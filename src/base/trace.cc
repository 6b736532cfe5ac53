#include "src/base/trace.h"

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace zinf {

Tracer::Tracer(bool enabled) : enabled_(enabled), origin_(Clock::now()) {}

double Tracer::Micros(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

int Tracer::Track(std::string_view name) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i] == name) return static_cast<int>(i);
  }
  tracks_.emplace_back(name);
  return static_cast<int>(tracks_.size() - 1);
}

void Tracer::Complete(int track, std::string_view name, Clock::time_point start,
                      Clock::time_point end, std::string_view category, std::string_view args) {
  if (!enabled_) return;
  Event e{track, std::string(name), std::string(category), std::string(args), Micros(start),
          Micros(end) - Micros(start), false, 0};
  std::lock_guard lock(mu_);
  events_.push_back(std::move(e));
}

void Tracer::Counter(std::string_view name, Clock::time_point at, double value) {
  if (!enabled_) return;
  Event e{0, std::string(name), "", "", Micros(at), 0, true, value};
  std::lock_guard lock(mu_);
  events_.push_back(std::move(e));
}

size_t Tracer::event_count() const {
  std::lock_guard lock(mu_);
  return events_.size();
}

std::string Tracer::ToJson() const {
  std::lock_guard lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"tid", 0},
                    {"args", {{"name", "zinf"}}}});
  for (size_t i = 0; i < tracks_.size(); ++i) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1},
                      {"tid", static_cast<int>(i)}, {"args", {{"name", tracks_[i]}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1},
                      {"tid", static_cast<int>(i)}, {"args", {{"sort_index", i}}}});
  }
  for (const Event& e : events_) {
    if (e.counter) {
      events.push_back({{"ph", "C"}, {"name", e.name}, {"pid", 1}, {"ts", e.ts_us},
                        {"args", {{"value", e.value}}}});
      continue;
    }
    nlohmann::json j = {{"ph", "X"}, {"name", e.name}, {"pid", 1}, {"tid", e.track},
                        {"ts", e.ts_us}, {"dur", e.dur_us}};
    if (!e.category.empty()) j["cat"] = e.category;
    if (!e.args.empty()) j["args"] = nlohmann::json::parse(e.args, nullptr, false);
    events.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

Status Tracer::Write(const std::string& path) const {
  std::ofstream out(path);
  if (!out) return Status::FromErrno(errno, "open trace file " + path);
  out << ToJson();
  out.close();
  if (!out) return Status::FromErrno(errno, "write trace file " + path);
  return Status::Ok();
}

}  // namespace zinf
