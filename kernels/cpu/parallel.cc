#include "kernels/cpu/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

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
  auto run = [&](size_t first, size_t last) {
    const auto start = options.observer ? std::chrono::steady_clock::now()
                                        : std::chrono::steady_clock::time_point{};
    for (size_t k = first; k < last; ++k) fn(k * chunk, std::min(n, (k + 1) * chunk));
    StoreFence();
    if (options.observer) {
      int worker = tbb::this_task_arena::current_thread_index();
      (*options.observer)(worker < 0 ? 0 : worker, first * chunk, std::min(n, last * chunk),
                          start, std::chrono::steady_clock::now());
    }
  };
  if (num_chunks == 1 || threads == 1) {
    run(0, num_chunks);
    return;
  }
  // static_partitioner: each thread walks one contiguous run of chunks, which keeps the
  // hardware prefetchers on long sequential streams.
  ArenaFor(threads).execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<size_t>(0, num_chunks, 1),
        [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); },
        tbb::static_partitioner());
  });
}

}  // namespace zinf::kernels
