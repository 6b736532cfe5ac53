// kernels/cpu/worker_placement.h — moving a pool's worker off the CPU of the thread that woke
// it, when the scheduler queued it there (parallel.h, "A worker woken onto its caller's CPU").
//
// Contract:
// - NoteRun() is called by a worker thread each time it runs work: the first call registers it;
//   after a MoveOffCpu that narrowed its mask, the next call restores the mask it had before.
//   The usual call is a thread-local read and a relaxed atomic load.
// - MoveOffCpu(cpu) bars every registered worker whose mask allows `cpu` from it
//   (sched_setaffinity on the worker's thread id): a worker queued on that CPU moves to another
//   allowed CPU at once; one running elsewhere or asleep keeps its place. A worker whose mask
//   allows only `cpu`, or that is already narrowed, is left alone. Returns how many masks it
//   narrowed.
// - A thread registers with one WorkerPlacement only (its id and state are thread-local); the
//   process has one, TheWorkerPlacement(). A registered thread must outlive the object's use
//   (a pool's workers live as long as the process; a test joins its threads after their last
//   NoteRun and creates a fresh object).
// - Linux only (sched_setaffinity, sched_getcpu).
//
// Thread-safety: all methods may be called from any thread; the registry is under one mutex.
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

namespace zinf::kernels {

class WorkerPlacement {
 public:
  void NoteRun();
  int MoveOffCpu(int cpu);
  // Workers registered so far, and MoveOffCpu calls that narrowed at least one mask.
  size_t workers() const;
  uint64_t moves() const { return moves_.load(std::memory_order_relaxed); }

 private:
  struct Worker {
    pid_t tid = 0;
    bool narrowed = false;  // its mask excludes one CPU until its next NoteRun
    cpu_set_t mask{};       // the mask before the move
  };
  mutable std::mutex mu_;
  std::vector<Worker> workers_;      // GUARDED_BY(mu_)
  std::atomic<uint64_t> moves_{0};
};

// The process's registry, used by ParallelForChunks (parallel.cc).
WorkerPlacement& TheWorkerPlacement();

}  // namespace zinf::kernels
