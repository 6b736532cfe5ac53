// src/base/arena.h — a first-fit sub-allocator over one address range it does not own.
//
// Contract: an Arena hands out blocks of [base, base + bytes): every block's address and size
// are multiples of `alignment` (a power of two dividing the base address), freed blocks
// coalesce with their free neighbours. It never touches the memory, so it serves host memory
// (offload/'s pinned pool) and device memory (src/base/device_arena.h) alike. Allocate refuses
// with ResourceExhausted naming the request (exact bytes and rounded), the budget, the bytes in
// use and the largest free block. Free of an address that does not start a live block (a double
// free, memory from elsewhere) is refused with InvalidArgument and logged as an error: it is a
// bug the caller must hear of, never silently ignored. AllocateRest takes the largest free block
// whole (a tier manager carves it into slots).
//
// Thread-safety: every method may be called from any thread; one internal mutex.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "zinf/status.h"

namespace zinf {

class Arena {
 public:
  // `what` names the memory in messages ("pinned pool", "device arena").
  Arena(std::string what, void* base, uint64_t bytes, uint64_t alignment);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  Result<void*> Allocate(uint64_t bytes);
  // The largest free block, whole: its address and size (0 bytes: nothing free, not an error).
  std::pair<void*, uint64_t> AllocateRest();
  Status Free(void* p);

  // The bytes a block of `bytes` takes (rounded up to the alignment).
  uint64_t BlockBytes(uint64_t bytes) const { return (bytes + align_ - 1) / align_ * align_; }
  uint64_t budget_bytes() const { return bytes_; }
  uint64_t alignment() const { return align_; }
  void* base() const { return base_; }
  bool Contains(const void* p, uint64_t n) const;
  uint64_t bytes_in_use() const;
  uint64_t peak_bytes() const;
  uint64_t largest_free_block() const;
  // The size of the live block starting at p; NotFound when none starts there.
  Result<uint64_t> BlockSize(const void* p) const;

 private:
  Result<uint64_t> TakeLocked(uint64_t need);  // REQUIRES: mu_ held
  uint64_t LargestLocked() const;              // REQUIRES: mu_ held

  const std::string what_;
  uint8_t* const base_;
  const uint64_t bytes_;
  const uint64_t align_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // GUARDED_BY(mu_): offset -> bytes, coalesced
  std::map<uint64_t, uint64_t> used_;  // GUARDED_BY(mu_): offset -> bytes
  uint64_t in_use_ = 0;                // GUARDED_BY(mu_)
  uint64_t peak_ = 0;                  // GUARDED_BY(mu_)
};

}  // namespace zinf
