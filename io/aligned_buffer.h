// io/aligned_buffer.h — host memory for O_DIRECT transfers, allocated once and reused.
//
// Contract: Allocate returns zeroed memory aligned to at least `alignment` (rounded up to the
// page size) and at least `bytes` long, backed by anonymous mmap so the pages are real and
// never shared with the C heap. Buffers of 2 MiB and more are 2 MiB-aligned and asked to be
// backed by transparent huge pages (MADV_HUGEPAGE: physically contiguous, so large O_DIRECT
// requests are not split for the device's segment limit). Move-only; the memory is unmapped on
// destruction.
//
// Thread-safety: the object is a value; its memory is the caller's to share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zinf/status.h"

namespace zinf::io {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  static Result<AlignedBuffer> Allocate(size_t bytes, size_t alignment = 4096);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace zinf::io
