// offload/pinned_pool.h — the one arena of page-locked host memory, under a hard byte budget.
//
// Contract: Create() maps `budget_bytes` once (io/aligned_buffer.h: huge pages when 2 MiB or
// more), and locks it in RAM (mlock) so the
// kernel's DMA (O_DIRECT, io_uring fixed buffers, later cudaHostRegister) never waits on a page
// fault. Before mapping it checks RLIMIT_MEMLOCK (unless the process may lock without limit)
// and MemAvailable, and refuses with a message that says what to change. Allocate() hands out
// blocks aligned to `alignment` from the arena (first fit, freed blocks coalesce:
// src/base/arena.h); it never grows the arena: when no block fits it returns ResourceExhausted
// with the numbers. Blocks taken at start (the optimizer's slabs, shards homed here) are
// allocated first; the tier manager then takes the rest whole (AllocateRest) and carves it into
// fixed-size slots, so that nothing fragments mid-run. Free of a block the pool did not hand
// out, or freed twice, is refused loudly (an error status, logged). bytes_in_use() never
// exceeds budget_bytes().
//
// Thread-safety: Allocate/Free/stats may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "io/aligned_buffer.h"
#include "io/engine.h"
#include "src/base/arena.h"
#include "zinf/status.h"

namespace zinf::offload {

struct PinnedPoolOptions {
  uint64_t budget_bytes = 0;
  uint32_t alignment = 4096;  // every block's address and size are multiples of this
  bool lock_memory = true;    // mlock the arena (the point of "pinned")
};

struct PinnedBlock {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  explicit operator bool() const { return data != nullptr; }
};

class PinnedPool {
 public:
  static Result<std::unique_ptr<PinnedPool>> Create(const PinnedPoolOptions& options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // Registers the whole arena with the engine once (io_uring fixed buffers).
  Status RegisterWith(io::Engine& engine);

  Result<PinnedBlock> Allocate(uint64_t bytes);
  // The largest free block, whole ({} when nothing is free).
  PinnedBlock AllocateRest();
  Status Free(PinnedBlock block);  // a null block: OK

  uint64_t budget_bytes() const { return budget_; }
  uint64_t bytes_in_use() const { return arena_->bytes_in_use(); }
  uint64_t peak_bytes() const { return arena_->peak_bytes(); }
  uint64_t largest_free_block() const { return arena_->largest_free_block(); }
  // The pool memory an Allocate(bytes) takes (bytes rounded up to the pool's alignment).
  uint64_t BlockBytes(uint64_t bytes) const { return arena_->BlockBytes(bytes); }
  uint64_t alignment() const { return alignment_; }
  uint8_t* base() const { return base_; }

 private:
  PinnedPool() = default;
  io::AlignedBuffer mapping_;  // the memory (huge pages when large)
  uint8_t* base_ = nullptr;
  uint64_t budget_ = 0;
  uint32_t alignment_ = 4096;
  bool locked_ = false;
  std::unique_ptr<Arena> arena_;
};

}  // namespace zinf::offload
