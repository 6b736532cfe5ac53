// kernels/cpu/parallel_threads.cc — ParallelForChunks on plain std::threads, for the
// ThreadSanitizer build only (ZINF_SANITIZE=thread; CMake compiles this file instead of
// parallel.cc there).
//
// Why it exists: Debian's oneTBB is not built with -fsanitize=thread, so TSan cannot see the
// synchronization inside its scheduler (the hand-off of a task to a worker and the join of
// parallel_for) and reports zinf's own reads after a parallel loop as races. This stand-in keeps
// parallel.h's contract — the same chunks, one contiguous run of chunks per thread (as
// tbb::static_partitioner gives), the caller takes part, nesting from inside a chunk is allowed,
// worker indices for the observer — with std::mutex and std::condition_variable, which TSan
// intercepts. It is not tuned for speed and is never built into a release binary.
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace zinf::kernels {
namespace {

// As in parallel.cc: orders this thread's non-temporal stores before the join.
void StoreFence() {
#if defined(__SSE__)
  _mm_sfence();
#endif
}

// The worker index of the calling thread within its pool (0: not a pool thread).
thread_local int tls_worker = 0;

// A fixed set of threads - 1 workers taking jobs from one queue.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 1; i < threads; ++i) {
      workers_.emplace_back([this, i] {
        tls_worker = i;
        while (auto job = Take(/*block=*/true)) job();
      });
    }
  }
  // Process-lifetime pools are never destroyed (as oneTBB's arenas in parallel.cc).

  void Post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

  // A queued job, or an empty function when there is none and `block` is false.
  std::function<void()> Take(bool block) {
    std::unique_lock<std::mutex> lock(mu_);
    if (block) cv_.wait(lock, [&] { return !jobs_.empty(); });
    if (jobs_.empty()) return {};
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    return job;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // GUARDED_BY(mu_)
  std::vector<std::thread> workers_;
};

Pool& PoolFor(int threads) {
  static std::mutex mu;
  static auto* pools = new std::map<int, std::unique_ptr<Pool>>;  // GUARDED_BY(mu); never freed
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<Pool>& pool = (*pools)[threads];
  if (!pool) pool = std::make_unique<Pool>(threads);
  return *pool;
}

// Counts the runs of one call still going; the caller waits on it, running queued jobs
// meanwhile so that a call nested in a chunk cannot wait for workers that wait for it.
struct Join {
  std::mutex mu;
  std::condition_variable cv;
  int left = 0;  // GUARDED_BY(mu)
};

}  // namespace

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
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
      (*options.observer)(tls_worker, first * chunk, std::min(n, last * chunk), start,
                          std::chrono::steady_clock::now());
    }
  };
  if (num_chunks == 1 || threads == 1) {
    run(0, num_chunks);
    return;
  }
  // One contiguous run of chunks per thread, sizes differing by at most one chunk.
  const size_t runs = std::min<size_t>(num_chunks, static_cast<size_t>(threads));
  auto bounds = [&](size_t i) { return i * num_chunks / runs; };
  Pool& pool = PoolFor(threads);
  Join join;
  join.left = static_cast<int>(runs - 1);
  for (size_t i = 1; i < runs; ++i) {
    pool.Post([&, i] {
      run(bounds(i), bounds(i + 1));
      std::lock_guard<std::mutex> lock(join.mu);
      if (--join.left == 0) join.cv.notify_all();
    });
  }
  run(bounds(0), bounds(1));
  while (true) {
    {
      std::unique_lock<std::mutex> lock(join.mu);
      if (join.left == 0) return;
    }
    if (auto job = pool.Take(/*block=*/false)) {
      job();
      continue;
    }
    std::unique_lock<std::mutex> lock(join.mu);
    join.cv.wait_for(lock, std::chrono::milliseconds(1), [&] { return join.left == 0; });
  }
}

}  // namespace zinf::kernels
