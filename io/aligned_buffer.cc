#include "io/aligned_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

namespace zinf::io {

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes, size_t alignment) {
  if (bytes == 0) return InvalidArgument("AlignedBuffer: size must be > 0");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return InvalidArgument(fmt::format("AlignedBuffer: alignment {} is not a power of two",
                                       alignment));
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t size = (bytes + page - 1) / page * page;
  // Large buffers on huge pages: physically contiguous 2 MiB runs, so a 1 MiB O_DIRECT request
  // is one scatter-gather segment instead of 256 (a virtio disk with max_segments 254 splits
  // it in two otherwise), and fewer TLB misses. Advisory: ignored where THP is off.
  const bool huge = size >= kHugePageBytes;
  if (huge && alignment < kHugePageBytes) alignment = kHugePageBytes;
  // mmap is page-aligned; over-map to reach larger alignments, then trim.
  const size_t extra = alignment > page ? alignment : 0;
  void* p = mmap(nullptr, size + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno, fmt::format("mmap {} bytes for I/O buffers", size + extra));
  }
  auto addr = reinterpret_cast<uintptr_t>(p);
  uintptr_t aligned = (addr + alignment - 1) & ~(uintptr_t{alignment} - 1);
  if (aligned > addr) munmap(p, aligned - addr);
  size_t tail = (addr + size + extra) - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  if (huge) madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  AlignedBuffer b;
  b.data_ = reinterpret_cast<uint8_t*>(aligned);
  b.size_ = bytes;
  b.mapped_ = size;
  return b;
}

AlignedBuffer::~AlignedBuffer() {
  if (data_ != nullptr) munmap(data_, mapped_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_ != nullptr) munmap(data_, mapped_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace zinf::io
