#include "offload/pinned_pool.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <fmt/format.h>

#include "src/base/host_info.h"
#include "src/base/units.h"

namespace zinf::offload {

Result<std::unique_ptr<PinnedPool>> PinnedPool::Create(const PinnedPoolOptions& o) {
  if (o.budget_bytes == 0) return InvalidArgument("pinned pool: budget must be > 0 bytes");
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) != 0) {
    return InvalidArgument(fmt::format("pinned pool: alignment {} is not a power of two",
                                       o.alignment));
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t align = std::max<uint64_t>(o.alignment, page);
  const uint64_t bytes = o.budget_bytes / align * align;
  if (bytes == 0) {
    return InvalidArgument(fmt::format("pinned pool: budget {} is below one aligned block ({})",
                                       o.budget_bytes, align));
  }
  uint64_t avail = MemAvailableBytes();
  if (avail != 0 && bytes > avail) {
    return ResourceExhausted(fmt::format(
        "pinned pool: budget {} ({}) exceeds the memory available now, {} ({}); lower "
        "zinf.budgets.pinned_bytes", bytes, FormatBytesHuman(bytes), avail,
        FormatBytesHuman(avail)));
  }
  if (o.lock_memory) {
    rlimit lim{};
    if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
        bytes > lim.rlim_cur && geteuid() != 0) {
      return ResourceExhausted(fmt::format(
          "pinned pool: budget {} ({}) exceeds RLIMIT_MEMLOCK {} ({}); raise it (`ulimit -l "
          "{}` or memlock in /etc/security/limits.conf), grant CAP_IPC_LOCK, or lower "
          "zinf.budgets.pinned_bytes", bytes, FormatBytesHuman(bytes), lim.rlim_cur,
          FormatBytesHuman(lim.rlim_cur), (bytes + 1023) / 1024));
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Status::FromErrno(errno, fmt::format("pinned pool: mmap {} bytes", bytes));
  }
  auto pool = std::unique_ptr<PinnedPool>(new PinnedPool());
  pool->base_ = static_cast<uint8_t*>(p);
  pool->budget_ = bytes;
  pool->alignment_ = static_cast<uint32_t>(align);
  if (o.lock_memory) {
    if (mlock(p, bytes) != 0) {
      int e = errno;
      return Status::FromErrno(e, fmt::format(
          "pinned pool: mlock {} bytes (raise `ulimit -l`, grant CAP_IPC_LOCK, or lower "
          "zinf.budgets.pinned_bytes)", bytes));
    }
    pool->locked_ = true;
  }
  pool->free_.emplace(0, bytes);
  return pool;
}

PinnedPool::~PinnedPool() {
  if (base_ != nullptr) {
    if (locked_) munlock(base_, budget_);
    munmap(base_, budget_);
  }
}

Status PinnedPool::RegisterWith(io::Engine& engine) {
  return engine.RegisterBuffer(base_, budget_);
}

Result<PinnedBlock> PinnedPool::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("pinned pool: allocation of 0 bytes");
  const uint64_t need = (bytes + alignment_ - 1) / alignment_ * alignment_;
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first;
    uint64_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_.emplace(off + need, left);
    used_.emplace(off, need);
    in_use_ += need;
    peak_ = std::max(peak_, in_use_);
    return PinnedBlock{base_ + off, bytes};
  }
  uint64_t largest = 0;
  for (auto& [o, b] : free_) largest = std::max(largest, b);
  return ResourceExhausted(fmt::format(
      "pinned pool: no free block of {} bytes (budget {}, in use {}, largest free {})", need,
      budget_, in_use_, largest));
}

void PinnedPool::Free(PinnedBlock block) {
  if (!block) return;
  std::lock_guard lock(mu_);
  uint64_t off = static_cast<uint64_t>(block.data - base_);
  auto u = used_.find(off);
  if (u == used_.end()) return;  // not ours or freed twice: ignore rather than corrupt
  uint64_t bytes = u->second;
  used_.erase(u);
  in_use_ -= bytes;
  auto [it, ok] = free_.emplace(off, bytes);
  // Coalesce with the next and the previous free block.
  auto next = std::next(it);
  if (next != free_.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free_.erase(next);
  }
  if (it != free_.begin()) {
    auto prev = std::prev(it);
    if (prev->first + prev->second == it->first) {
      prev->second += it->second;
      free_.erase(it);
    }
  }
}

uint64_t PinnedPool::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

uint64_t PinnedPool::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

uint64_t PinnedPool::largest_free_block() const {
  std::lock_guard lock(mu_);
  uint64_t largest = 0;
  for (auto& [o, b] : free_) largest = std::max(largest, b);
  return largest;
}

}  // namespace zinf::offload
