#include "kernels/cpu/worker_placement.h"

#include <sys/syscall.h>
#include <unistd.h>

namespace zinf::kernels {
namespace {

thread_local pid_t tls_tid = 0;       // this thread's id once registered
thread_local uint64_t tls_moves = 0;  // moves() when this thread last looked

}  // namespace

bool WorkerPlacement::CallingThreadRegistered() { return tls_tid != 0; }

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
    if (w.tid != tls_tid || w.barred_cpu < 0) continue;
    // This thread runs on an allowed CPU, so widening its mask moves nothing.
    if (sched_setaffinity(0, sizeof(w.mask), &w.mask) == 0) w.barred_cpu = -1;
  }
}

int WorkerPlacement::MoveOffCpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  int changed = 0;
  for (Worker& w : workers_) {
    if (w.tid == tls_tid || w.barred_cpu == cpu) continue;  // never the caller itself
    cpu_set_t mask = w.mask;
    if (w.barred_cpu < 0 && sched_getaffinity(w.tid, sizeof(mask), &mask) != 0) continue;
    if (!CPU_ISSET(cpu, &mask)) continue;
    cpu_set_t others = mask;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0) continue;
    if (sched_setaffinity(w.tid, sizeof(others), &others) != 0) continue;
    w.mask = mask;
    w.barred_cpu = cpu;
    ++changed;
  }
  // Under the mutex: a worker that sees the new count and takes the mutex finds its entry.
  if (changed > 0) moves_.fetch_add(1, std::memory_order_relaxed);
  return changed;
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
