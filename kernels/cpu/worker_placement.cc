#include "kernels/cpu/worker_placement.h"

#include <sys/syscall.h>
#include <unistd.h>

namespace zinf::kernels {
namespace {

thread_local pid_t tls_tid = 0;       // this thread's id once registered
thread_local uint64_t tls_moves = 0;  // moves() when this thread last looked

}  // namespace

void WorkerPlacement::NoteRun() {
  if (tls_tid != 0 && moves_.load(std::memory_order_relaxed) == tls_moves) return;
  std::lock_guard<std::mutex> lock(mu_);
  tls_moves = moves_.load(std::memory_order_relaxed);
  if (tls_tid == 0) {
    tls_tid = static_cast<pid_t>(syscall(SYS_gettid));
    workers_.push_back({.tid = tls_tid});
    return;
  }
  for (Worker& w : workers_) {
    if (w.tid != tls_tid || !w.narrowed) continue;
    // Best effort: on failure the worker keeps the narrower mask (still a valid one).
    sched_setaffinity(0, sizeof(w.mask), &w.mask);
    w.narrowed = false;
  }
}

int WorkerPlacement::MoveOffCpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  int narrowed = 0;
  for (Worker& w : workers_) {
    if (w.narrowed) continue;
    cpu_set_t mask;
    if (sched_getaffinity(w.tid, sizeof(mask), &mask) != 0 || !CPU_ISSET(cpu, &mask)) continue;
    cpu_set_t others = mask;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) continue;
    if (sched_setaffinity(w.tid, sizeof(others), &others) != 0) continue;
    w.mask = mask;
    w.narrowed = true;
    ++narrowed;
  }
  // Released under the mutex: a worker that sees the new count restores its mask.
  if (narrowed > 0) moves_.fetch_add(1, std::memory_order_relaxed);
  return narrowed;
}

size_t WorkerPlacement::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.size();
}

WorkerPlacement& TheWorkerPlacement() {
  static auto* p = new WorkerPlacement;  // never freed: oneTBB's workers outlive static dtors
  return *p;
}

}  // namespace zinf::kernels
