// Tests of ParallelForChunks (kernels/cpu/parallel.h, oneTBB's parallel.cc or, in the TSan
// build, parallel_threads.cc): every element exactly once in its chunk, whatever the size,
// chunk and thread count; results visible when the call returns; calls nested in a chunk and
// calls from several threads at once; the observer's runs cover the range exactly once.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace zinf::kernels {
namespace {

// Marks every element of [0, n) through fn; checks each was marked once and each call got
// exactly a chunk [k * chunk, min(n, (k + 1) * chunk)).
void ExpectEachElementOnce(size_t n, size_t chunk, int threads) {
  std::vector<uint8_t> hits(n, 0);  // plain stores: the call's return must publish them
  std::atomic<size_t> calls{0}, bad{0};
  ParallelForChunks(n, {.threads = threads, .chunk_elems = chunk}, [&](size_t b, size_t e) {
    calls.fetch_add(1, std::memory_order_relaxed);
    if (b % chunk != 0 || e != std::min(n, b + chunk)) bad.fetch_add(1);
    for (size_t i = b; i < e; ++i) ++hits[i];
  });
  EXPECT_EQ(bad.load(), 0u) << "n " << n << " chunk " << chunk << " threads " << threads;
  EXPECT_EQ(calls.load(), (n + chunk - 1) / chunk);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += hits[i] != 1;
  EXPECT_EQ(wrong, 0u) << "n " << n << " chunk " << chunk << " threads " << threads;
}

TEST(ParallelForChunksTest, EveryElementOnceInItsChunk) {
  for (int threads : {0, 1, 2, 3, 5})
    for (size_t chunk : {size_t{1}, size_t{7}, size_t{64}, size_t{4096}})
      for (size_t n : {size_t{1}, size_t{2}, size_t{63}, size_t{64}, size_t{65}, size_t{1000},
                       size_t{100003}})
        ExpectEachElementOnce(n, chunk, threads);
  ExpectEachElementOnce(0, 64, 2);
}

// Back-to-back calls of a few chunks each, the buffer reused by the next call: each call's
// results are complete when it returns, and nothing of a call lands after it.
TEST(ParallelForChunksTest, BackToBackSmallCallsAreEachComplete) {
  std::vector<uint32_t> buf(8 * 64);
  for (uint32_t round = 1; round <= 2000; ++round) {
    const size_t n = 64 * (1 + round % 8);
    ParallelForChunks(n, {.threads = 2, .chunk_elems = 64}, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) buf[i] = round;
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], round) << "round " << round << " i " << i;
  }
}

TEST(ParallelForChunksTest, NestedCallsInAChunkComplete) {
  constexpr size_t kOuter = 16, kInner = 5000;
  std::vector<std::vector<uint8_t>> hits(kOuter, std::vector<uint8_t>(kInner, 0));
  ParallelForChunks(kOuter, {.threads = 2, .chunk_elems = 1}, [&](size_t b, size_t) {
    ParallelForChunks(kInner, {.threads = 2, .chunk_elems = 100}, [&](size_t ib, size_t ie) {
      for (size_t i = ib; i < ie; ++i) ++hits[b][i];
    });
  });
  for (size_t o = 0; o < kOuter; ++o)
    for (size_t i = 0; i < kInner; ++i) ASSERT_EQ(hits[o][i], 1) << o << " " << i;
}

TEST(ParallelForChunksTest, CallsFromSeveralThreadsAtOnce) {
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([] {
      for (int k = 0; k < 20; ++k) ExpectEachElementOnce(30011, 512, 2);
    });
  for (auto& t : ts) t.join();
}

TEST(ParallelForChunksTest, ObserverRunsCoverTheRangeOnce) {
  constexpr size_t kN = 200000, kChunk = 1024;
  std::mutex mu;
  std::vector<uint8_t> covered(kN, 0);
  size_t runs = 0, backwards = 0;
  RunObserver observer = [&](int worker, size_t b, size_t e,
                             std::chrono::steady_clock::time_point start,
                             std::chrono::steady_clock::time_point stop) {
    std::lock_guard<std::mutex> lock(mu);
    ++runs;
    if (worker < 0 || stop < start || b >= e) ++backwards;
    for (size_t i = b; i < e; ++i) ++covered[i];
  };
  for (int threads : {1, 2, 3}) {
    std::fill(covered.begin(), covered.end(), 0);
    runs = backwards = 0;
    ParallelForChunks(kN, {.threads = threads, .chunk_elems = kChunk, .observer = &observer},
                      [](size_t, size_t) {});
    EXPECT_GE(runs, 1u);
    EXPECT_EQ(backwards, 0u);
    size_t wrong = 0;
    for (size_t i = 0; i < kN; ++i) wrong += covered[i] != 1;
    EXPECT_EQ(wrong, 0u) << threads << " threads";
  }
}

// parallel.h, "A worker woken onto its caller's CPU": a call from inside a chunk (on oneTBB's
// worker or on the caller) never bars the thread that makes it from its own CPU, and the
// calling thread's mask is never changed. Each round waits out the once-a-millisecond limit.
TEST(ParallelForChunksTest, NestedCallsNeverMoveTheirOwnThread) {
  cpu_set_t process;
  ASSERT_EQ(sched_getaffinity(0, sizeof(process), &process), 0);
  if (CPU_COUNT(&process) < 2) GTEST_SKIP() << "this process may run on one CPU only";
  auto busy = [](std::chrono::microseconds d) {
    const auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
    }
  };
  std::atomic<int> changed{0}, nested{0};
  for (int round = 0; round < 40; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    // One chunk a thread; each keeps its thread busy around its nested call, so the nested call
    // (more chunks than threads) mostly runs wholly on the thread that makes it.
    ParallelForChunks(2, {.threads = 2, .chunk_elems = 1}, [&](size_t, size_t) {
      busy(std::chrono::microseconds(300));
      cpu_set_t before, after;
      sched_getaffinity(0, sizeof(before), &before);
      std::atomic<size_t> sum{0};
      ParallelForChunks(64, {.threads = 2, .chunk_elems = 1},
                        [&](size_t b, size_t) { sum.fetch_add(b, std::memory_order_relaxed); });
      if (sum.load() != 64 * 63 / 2) changed.fetch_add(1000);
      sched_getaffinity(0, sizeof(after), &after);
      if (!CPU_EQUAL(&before, &after)) changed.fetch_add(1);
      busy(std::chrono::microseconds(300));
      nested.fetch_add(1);
    });
  }
  EXPECT_EQ(nested.load(), 40 * 2);
  EXPECT_EQ(changed.load(), 0);
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
  EXPECT_TRUE(CPU_EQUAL(&mine, &process));
}

}  // namespace
}  // namespace zinf::kernels
