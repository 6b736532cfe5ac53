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
  auto mapping = io::AlignedBuffer::Allocate(bytes, align);
  if (!mapping.ok()) return mapping.status().WithContext("pinned pool");
  void* p = mapping->data();
  auto pool = std::unique_ptr<PinnedPool>(new PinnedPool());
  pool->mapping_ = std::move(*mapping);
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
  pool->arena_ = std::make_unique<Arena>("pinned pool", p, bytes, align);
  return pool;
}

PinnedPool::~PinnedPool() {
  if (base_ != nullptr && locked_) munlock(base_, budget_);
  // mapping_ unmaps it.
}

Status PinnedPool::RegisterWith(io::Engine& engine) {
  return engine.RegisterBuffer(base_, budget_);
}

Result<PinnedBlock> PinnedPool::Allocate(uint64_t bytes) {
  auto p = arena_->Allocate(bytes);
  if (!p.ok()) return p.status();
  return PinnedBlock{static_cast<uint8_t*>(*p), bytes};
}

PinnedBlock PinnedPool::AllocateRest() {
  auto [p, bytes] = arena_->AllocateRest();
  return PinnedBlock{static_cast<uint8_t*>(p), bytes};
}

Status PinnedPool::Free(PinnedBlock block) {
  if (!block) return Status::Ok();
  return arena_->Free(block.data);
}

}  // namespace zinf::offload
