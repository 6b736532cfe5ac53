// Tracer: valid Chrome trace-event JSON with one named track per Track().
#include "src/base/trace.h"

#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace zinf {
namespace {

TEST(TracerTest, WritesNamedTracksAndCompleteEvents) {
  Tracer t;
  int nvme = t.Track("nvme");
  int adam = t.Track("adam");
  EXPECT_EQ(t.Track("nvme"), nvme);
  auto t0 = Tracer::Clock::now();
  t.Complete(nvme, "read unit0", t0, t0 + std::chrono::milliseconds(2), "io", R"({"bytes":4096})");
  std::thread([&] { TraceSpan s(&t, adam, "adam unit0"); }).join();
  t.Counter("pinned_bytes", t0, 1234);
  auto j = nlohmann::json::parse(t.ToJson());
  int names = 0, complete = 0, counters = 0;
  for (auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names++;
    if (e["ph"] == "X") {
      complete++;
      EXPECT_GE(e["dur"].get<double>(), 0);
    }
    if (e["ph"] == "C") counters++;
  }
  EXPECT_EQ(names, 2);
  EXPECT_EQ(complete, 2);
  EXPECT_EQ(counters, 1);
}

TEST(TracerTest, DisabledRecordsNothing) {
  Tracer t(false);
  { TraceSpan s(&t, t.Track("x"), "y"); }
  TraceSpan null_tracer(nullptr, 0, "z");
  EXPECT_EQ(t.event_count(), 0u);
}

}  // namespace
}  // namespace zinf
