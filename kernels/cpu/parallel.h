// kernels/cpu/parallel.h — splitting an element range into chunks run on a oneTBB arena.
//
// Contract: ParallelForChunks calls fn(begin, end) once for each chunk [k*chunk, (k+1)*chunk)
// of [0, n) (the last one shorter), on at most `threads` threads of a task arena of that size
// (0 = every core this process may use). Arenas are created on first use per thread count and
// kept for the life of the process. With one chunk or one thread, fn runs on the calling thread.
// Chunk boundaries are multiples of chunk_elems, so the alignment of a buffer's start carries
// over to every chunk when chunk_elems is a multiple of 64. Each thread's run of chunks ends
// with a store fence (sfence), so fn may use non-temporal stores without fencing each chunk
// (a fence per chunk would stall every ~100 KiB on draining the write-combining buffers), and
// its results are visible to the caller when ParallelForChunks returns.
//
// A worker woken onto its caller's CPU: on some VMs (this project's 2-vCPU machine, whose
// kernel seldom hands a woken thread a vCPU that has been idle a few milliseconds), a worker
// woken after such an idle spell is queued on the CPU of the thread that woke it, which then runs the worker's share itself and
// its next calls too, while the other CPU stays idle until the scheduler's tick moves the
// worker (1-8 ms; bench/wake_placement shows it without zinf). So after an outermost call (not
// from inside a chunk) of more chunks than threads that ran wholly on its caller,
// ParallelForChunks bars oneTBB's workers from the caller's current CPU with sched_setaffinity
// (kernels/cpu/worker_placement.h), at most once a millisecond in the process: a worker queued
// there moves to an allowed CPU at once, others keep their place. A worker restores its mask
// the next time it runs a chunk of an outermost loop. Only threads that oneTBB created and that
// have run a chunk are moved, never a caller's, and never off the last CPU their mask allows; a
// mask changed (e.g. by taskset) while a worker is barred is reset to the one before the move.
// oneTBB's workers are the process's: a program that embeds zinf and runs its own oneTBB work
// shares them, and a barred worker busy with that work keeps its narrower mask until it next
// runs a chunk here. ZINF_WORKER_MOVES=0 in the environment (read once) turns the moves off.
//
// The ThreadSanitizer build implements this header with parallel_threads.cc (std::threads that
// TSan can see) instead of parallel.cc (oneTBB); it moves no worker.
//
// Thread-safety: may be called from several threads at once; calls sharing a thread count
// share one arena (their chunks then interleave on its threads).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>

namespace zinf::kernels {

// 32K elements: the chunk's fp32 param, grad, m and v (512 KiB) fit in a core's L2, and a
// chunk's time (tens of microseconds) dwarfs a task's scheduling cost.
inline constexpr size_t kDefaultChunkElems = size_t{32} << 10;

// Told once per thread's run of chunks, after it ends: which worker of the arena ran it (0 for
// the calling thread alone), the element range, and when it started and ended. For tracing
// (one Chrome-trace track per Adam worker); it must be cheap and thread-safe.
using RunObserver = std::function<void(int worker, size_t begin, size_t end,
                                       std::chrono::steady_clock::time_point start,
                                       std::chrono::steady_clock::time_point stop)>;

struct ParallelOptions {
  int threads = 0;  // 0 = all cores
  size_t chunk_elems = kDefaultChunkElems;
  const RunObserver* observer = nullptr;  // not owned; null = nobody listens
};

// The thread count `requested` stands for (0 -> oneTBB's default concurrency).
int ResolveThreads(int requested);

void ParallelForChunks(size_t n, const ParallelOptions& options,
                       const std::function<void(size_t begin, size_t end)>& fn);

}  // namespace zinf::kernels
