// kernels/cpu/worker_placement.h — moving a pool's worker off the CPU of the thread that woke
// it, when the scheduler queued it there (parallel.h, "A worker woken onto its caller's CPU").
//
// Contract:
// - NoteRun() is called by a worker thread when it has run work: the first call registers it;
//   after a MoveOffCpu that narrowed its mask, a later call restores the mask it had before
//   (the fast path reads the move count without the lock, so a move made at that very moment
//   is seen by the call after). The usual call is a thread-local read and a relaxed load.
// - MoveOffCpu(cpu) bars every registered worker whose mask allows `cpu`, except the calling
//   thread, from it (sched_setaffinity on the worker's thread id): a worker queued on that CPU
//   moves to another allowed CPU at once; one running elsewhere or asleep keeps its place. A
//   worker already barred from another CPU is barred from this one instead (its saved mask
//   less `cpu`), so it is never held to the CPU its caller now runs on. A worker whose mask
//   allows only `cpu` is left alone. Returns how many masks it changed.
// - A failed restore leaves the worker marked narrowed (retried by its next NoteRun after a
//   move); a failed narrowing leaves the mask as it was.
// - Registered threads must live as long as the object is used: a thread id is kept, and a
//   reused id would be moved. oneTBB's workers qualify: parallel.cc never destroys its arenas,
//   so oneTBB's scheduler and its workers last until the process exits. A test joins its
//   threads after their last NoteRun and uses a fresh object.
// - A thread registers with one WorkerPlacement only (its id and state are thread-local); the
//   process has one, TheWorkerPlacement().
// - Linux only (sched_setaffinity, sched_getaffinity).
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
  // Whether the calling thread has registered (with any WorkerPlacement).
  static bool CallingThreadRegistered();
  // Workers registered so far, and MoveOffCpu calls that changed at least one mask.
  size_t workers() const;
  uint64_t moves() const { return moves_.load(std::memory_order_relaxed); }

 private:
  struct Worker {
    pid_t tid = 0;
    int barred_cpu = -1;  // >= 0: its mask is `mask` less this CPU until a NoteRun restores it
    cpu_set_t mask{};     // the mask before the first move
  };
  mutable std::mutex mu_;
  std::vector<Worker> workers_;  // GUARDED_BY(mu_)
  std::atomic<uint64_t> moves_{0};
};

// The process's registry, used by ParallelForChunks (parallel.cc).
WorkerPlacement& TheWorkerPlacement();

}  // namespace zinf::kernels
