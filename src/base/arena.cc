#include "src/base/arena.h"

#include <algorithm>

#include <fmt/format.h>

#include "src/base/log.h"
#include "src/base/units.h"

namespace zinf {

Arena::Arena(std::string what, void* base, uint64_t bytes, uint64_t alignment)
    : what_(std::move(what)),
      base_(static_cast<uint8_t*>(base)),
      bytes_(bytes / alignment * alignment),
      align_(alignment) {
  if (bytes_ > 0) free_.emplace(0, bytes_);
}

Result<uint64_t> Arena::TakeLocked(uint64_t need) {
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t off = it->first;
    const uint64_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_.emplace(off + need, left);
    used_.emplace(off, need);
    in_use_ += need;
    peak_ = std::max(peak_, in_use_);
    return off;
  }
  return ResourceExhausted("");
}

uint64_t Arena::LargestLocked() const {
  uint64_t largest = 0;
  for (const auto& [o, b] : free_) largest = std::max(largest, b);
  return largest;
}

Result<void*> Arena::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument(fmt::format("{}: allocation of 0 bytes", what_));
  const uint64_t need = BlockBytes(bytes);
  std::lock_guard lock(mu_);
  auto off = TakeLocked(need);
  if (off.ok()) return static_cast<void*>(base_ + *off);
  return ResourceExhausted(fmt::format(
      "{}: no free block of {} bytes ({}; {} bytes asked, rounded up to the {}-byte alignment): "
      "budget {} bytes, {} in use, largest free block {} bytes ({})",
      what_, need, FormatBytesHuman(need), bytes, align_, bytes_, in_use_, LargestLocked(),
      FormatBytesHuman(LargestLocked())));
}

std::pair<void*, uint64_t> Arena::AllocateRest() {
  std::lock_guard lock(mu_);
  const uint64_t largest = LargestLocked();
  if (largest == 0) return {nullptr, 0};
  auto off = TakeLocked(largest);
  return {base_ + *off, largest};
}

Status Arena::Free(void* p) {
  if (p == nullptr) return Status::Ok();
  std::lock_guard lock(mu_);
  const auto* q = static_cast<const uint8_t*>(p);
  auto u = q >= base_ ? used_.find(static_cast<uint64_t>(q - base_)) : used_.end();
  if (u == used_.end()) {
    Status s = InvalidArgument(fmt::format(
        "{}: Free of {} which does not start a live block (a double free, or memory from "
        "elsewhere): refused", what_, p));
    Log().error("{}", s.message());
    return s;
  }
  const uint64_t off = u->first, bytes = u->second;
  used_.erase(u);
  in_use_ -= bytes;
  auto [it, ok] = free_.emplace(off, bytes);
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
  return Status::Ok();
}

bool Arena::Contains(const void* p, uint64_t n) const {
  const auto* q = static_cast<const uint8_t*>(p);
  return q >= base_ && q + n <= base_ + bytes_;
}

uint64_t Arena::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

uint64_t Arena::peak_bytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

uint64_t Arena::largest_free_block() const {
  std::lock_guard lock(mu_);
  return LargestLocked();
}

Result<uint64_t> Arena::BlockSize(const void* p) const {
  std::lock_guard lock(mu_);
  const auto* q = static_cast<const uint8_t*>(p);
  auto u = q >= base_ ? used_.find(static_cast<uint64_t>(q - base_)) : used_.end();
  if (u == used_.end()) {
    return NotFound(fmt::format("{}: {} does not start a live block", what_, p));
  }
  return u->second;
}

}  // namespace zinf
