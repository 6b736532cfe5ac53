// bench/wake_placement.cc — where the kernel runs a thread that another, busy thread wakes,
// and how long the woken thread waits to run: the cold start of a thread pool after idle.
//
// Why (issue 13, README "The cold start, found and fixed"): after 30 ms idle, zinf's Adam at 1M elements ran at
// one thread's speed for several milliseconds, because oneTBB's worker, woken by the caller,
// was queued on the caller's own CPU (busy with its share of the loop) while the other CPU sat
// idle, and ran only when the scheduler's tick preempted the caller. This program shows that
// placement with nothing of zinf's: a waker sleeps `pause` ms, wakes a sleeping thread, and
// keeps its CPU busy for `busy` us; the woken thread records its CPU and its wake latency.
//   --mode futex: the thread sleeps in std::atomic::wait (a futex), as a plain pool's would.
//   --mode tbb:   the thread is a oneTBB worker of a 2-thread arena, woken by an enqueued task,
//                 as ParallelForChunks wakes it.
//
// Usage: wake_placement [--mode futex|tbb] [--pause-ms 30] [--busy-us 2000] [--reps 40]
// Prints how many wakes ran on the waker's CPU and the median and 90th percentile latency.
#include <sched.h>
#include <tbb/task_arena.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void BusyFor(std::chrono::microseconds d) {
  const auto end = Clock::now() + d;
  while (Clock::now() < end) _mm_pause();
}

struct Wake {
  std::atomic<int> cpu{-1};
  std::atomic<int64_t> latency_ns{0};
  Clock::time_point sent;
  void Record() {
    latency_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - sent)
                         .count(),
                     std::memory_order_relaxed);
    cpu.store(sched_getcpu(), std::memory_order_release);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "futex";
  int pause_ms = 30, busy_us = 2000, reps = 40;
  if (argc % 2 != 1) {
    std::fprintf(stderr, "wake_placement: flags come in pairs (--flag value)\n");
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") mode = v;
    else if (k == "--pause-ms") pause_ms = std::atoi(v.c_str());
    else if (k == "--busy-us") busy_us = std::atoi(v.c_str());
    else if (k == "--reps") reps = std::atoi(v.c_str());
    else {
      std::fprintf(stderr, "wake_placement: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if ((mode != "futex" && mode != "tbb") || pause_ms < 0 || busy_us < 0 || reps < 1) {
    std::fprintf(stderr, "wake_placement: --mode futex|tbb, --pause-ms/--busy-us >= 0, --reps >= 1\n");
    return 2;
  }
  Wake wake;
  std::atomic<int> generation{0};
  std::thread sleeper;
  tbb::task_arena arena(2);
  if (mode == "futex") {
    sleeper = std::thread([&] {
      for (int seen = 0;;) {
        generation.wait(seen);
        seen = generation.load();
        if (seen < 0) return;
        wake.Record();
      }
    });
  } else {
    // Start the arena's worker (the first enqueue creates its thread), so that every measured
    // wake is a wake, not a thread's creation.
    wake.sent = Clock::now();
    arena.enqueue([&wake] { wake.Record(); });
    while (wake.cpu.load(std::memory_order_acquire) < 0) std::this_thread::yield();
  }
  int same = 0;
  std::vector<double> latency_us;
  for (int r = 0; r < reps; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    wake.cpu.store(-1);
    const int my_cpu = sched_getcpu();
    wake.sent = Clock::now();
    if (mode == "futex") {
      generation.fetch_add(1);
      generation.notify_one();
    } else {
      arena.enqueue([&wake] { wake.Record(); });
    }
    BusyFor(std::chrono::microseconds(busy_us));
    while (wake.cpu.load(std::memory_order_acquire) < 0) std::this_thread::yield();
    if (wake.cpu.load() == my_cpu) ++same;
    latency_us.push_back(static_cast<double>(wake.latency_ns.load()) / 1e3);
  }
  if (mode == "futex") {
    generation.store(-1);
    generation.notify_one();
    sleeper.join();
  }
  std::sort(latency_us.begin(), latency_us.end());
  std::printf("mode %s, %d ms idle, waker busy %d us: %d of %d wakes ran on the waker's CPU; "
              "wake latency median %.0f us, 90th percentile %.0f us\n",
              mode.c_str(), pause_ms, busy_us, same, reps, latency_us[latency_us.size() / 2],
              latency_us[latency_us.size() * 9 / 10]);
  return 0;
}
