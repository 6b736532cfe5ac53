#include "kernels/cpu/parallel.h"

#include <sched.h>
#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>

#include "kernels/cpu/worker_placement.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace zinf::kernels {
namespace {

// Orders this thread's non-temporal stores before whatever follows (the join of the loop).
void StoreFence() {
#if defined(__SSE__)
  _mm_sfence();
#endif
}

tbb::task_arena& ArenaFor(int threads) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<tbb::task_arena>> arenas;  // GUARDED_BY(mu)
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<tbb::task_arena>& arena = arenas[threads];
  if (!arena) arena = std::make_unique<tbb::task_arena>(threads);
  return *arena;
}

// How many ParallelForChunks calls this thread is inside. A thread that runs a chunk at depth 0
// is one of oneTBB's workers (a calling thread is at depth 1 or more, also when it runs chunks
// of other calls); a worker that calls ParallelForChunks from a chunk is at depth 1 there.
thread_local int tls_calls = 0;

// After a call of several chunks that all ran on its caller (parallel.h, "A worker woken onto
// its caller's CPU"): at most once a millisecond, oneTBB's workers are barred from the
// caller's CPU until they next run chunks.
void MoveWorkersOffThisCpu() {
  static const bool enabled = [] {
    const char* v = std::getenv("ZINF_WORKER_MOVES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  if (!enabled) return;
  static std::atomic<int64_t> last_ns{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_ns.load(std::memory_order_relaxed);
  if (now - last < 1'000'000 ||
      !last_ns.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    return;
  }
  TheWorkerPlacement().MoveOffCpu(sched_getcpu());
}

}  // namespace

int ResolveThreads(int requested) {
  return requested > 0 ? requested : std::max(1, tbb::info::default_concurrency());
}

void ParallelForChunks(size_t n, const ParallelOptions& options,
                       const std::function<void(size_t begin, size_t end)>& fn) {
  if (n == 0) return;
  const size_t chunk = std::max<size_t>(options.chunk_elems, 1);
  const size_t num_chunks = (n + chunk - 1) / chunk;
  const int threads = ResolveThreads(options.threads);
  // Chunks the calling thread ran (written by it only: no line shared with the workers).
  const int* const caller = &tls_calls;
  size_t caller_chunks = 0;
  auto run = [&](size_t first, size_t last) {
    const auto start = options.observer ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point{};
    const bool by_caller = &tls_calls == caller;
    // A oneTBB worker registers (or gets its mask back) before its chunks, so that a call it
    // makes from inside one knows it is a worker.
    if (!by_caller && tls_calls == 0) TheWorkerPlacement().NoteRun();
    for (size_t k = first; k < last; ++k) fn(k * chunk, std::min(n, (k + 1) * chunk));
    StoreFence();
    if (by_caller) caller_chunks += last - first;
    if (options.observer) {
      int worker = tbb::this_task_arena::current_thread_index();
      (*options.observer)(worker < 0 ? 0 : worker, first * chunk, std::min(n, last * chunk),
                          start, std::chrono::steady_clock::now());
    }
  };
  struct CallDepth {
    CallDepth() { ++tls_calls; }
    ~CallDepth() { --tls_calls; }
  } depth;
  if (num_chunks == 1 || threads == 1) {
    run(0, num_chunks);
    return;
  }
  // Only an outermost call from a thread that is not one of oneTBB's workers may move workers:
  // a worker that calls ParallelForChunks from inside a chunk (registered before it ran the
  // chunk) must not bar the others from its CPU, nor itself. (oneTBB's current_thread_index()
  // cannot tell: it stays 0 on a thread that has left an arena.)
  const bool outermost = tls_calls == 1 && !WorkerPlacement::CallingThreadRegistered();
  // static_partitioner: each thread walks one contiguous run of chunks, which keeps the
  // hardware prefetchers on long sequential streams.
  ArenaFor(threads).execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, num_chunks, 1),
        [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); },
        tbb::static_partitioner());
  });
  // More chunks than threads, all run by the caller: a worker had time to join and did not.
  // (With a chunk a thread, a worker that is awake may simply lose the race for its chunk.)
  if (outermost && num_chunks > static_cast<size_t>(threads) && caller_chunks == num_chunks) {
    MoveWorkersOffThisCpu();
  }
}

}  // namespace zinf::kernels
