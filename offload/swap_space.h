// offload/swap_space.h — the NVMe home of shards: extents in one preallocated swap file.
//
// Contract: a SwapSpace owns a (possibly striped) io::SwapFile of fixed capacity, registered
// with an io::Engine. Allocate() hands out extents aligned to the stripe unit when the request
// is at least one unit (so a large shard's requests start on a stripe boundary and spread over
// every drive), else to the O_DIRECT alignment; it never grows the file: running out is an
// error naming the capacity, made when shards are registered, never mid-run. Each shard may later
// get two extents (the two generations that make checkpoints a flush plus an atomic manifest);
// extents are plain (offset, bytes) values so that fits without changing this class.
//
// Thread-safety: Allocate may be called from any thread; the file and engine are shared.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/swap_file.h"
#include "zinf/status.h"

namespace zinf::offload {

struct Extent {
  uint64_t offset = 0;
  uint64_t bytes = 0;  // as requested; the space reserved is rounded up to the alignment
};

class SwapSpace {
 public:
  static Result<std::unique_ptr<SwapSpace>> Create(io::Engine& engine,
                                                   const io::SwapFileOptions& options);
  Result<Extent> Allocate(uint64_t bytes);

  io::FileId file() const { return file_; }
  io::Engine& engine() const { return engine_; }
  uint64_t capacity() const { return swap_->size(); }
  uint64_t allocated() const;
  uint32_t offset_align() const { return swap_->offset_align(); }
  uint32_t mem_align() const { return swap_->mem_align(); }
  // Rounds bytes up to what a transfer of this shard must cover (the O_DIRECT alignment).
  uint64_t Padded(uint64_t bytes) const;
  const io::SwapFile& swap_file() const { return *swap_; }
  // io::SwapFile::Sync and Paths.
  Status Sync() const { return swap_->Sync(); }
  std::vector<std::string> Paths() const { return swap_->Paths(); }

 private:
  SwapSpace(io::Engine& e) : engine_(e) {}
  io::Engine& engine_;
  std::unique_ptr<io::SwapFile> swap_;
  io::FileId file_ = 0;
  mutable std::mutex mu_;
  uint64_t next_ = 0;
};

}  // namespace zinf::offload
