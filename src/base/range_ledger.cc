#include "src/base/range_ledger.h"

#include <algorithm>

#include <fmt/format.h>

namespace zinf {

RangeLedger::RangeLedger(std::string what, uint64_t budget_bytes)
    : what_(std::move(what)), budget_(budget_bytes) {}

Status RangeLedger::Reserve(uint64_t accounted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (accounted > budget_ - in_use_) {
    return ResourceExhausted(fmt::format(
        "{}: requested {} bytes but {} of the {}-byte budget are in use ({} free)", what_,
        accounted, in_use_, budget_, budget_ - in_use_));
  }
  in_use_ += accounted;
  peak_ = std::max(peak_, in_use_);
  return Status::Ok();
}

void RangeLedger::Cancel(uint64_t accounted) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= std::min(accounted, in_use_);
}

Status RangeLedger::Commit(const void* base, uint64_t length, uint64_t accounted) {
  auto b = reinterpret_cast<uintptr_t>(base);
  std::lock_guard<std::mutex> lock(mu_);
  auto next = ranges_.lower_bound(b);
  bool overlaps_next = next != ranges_.end() && next->first < b + std::max<uint64_t>(length, 1);
  bool overlaps_prev = false;
  if (next != ranges_.begin()) {
    auto prev = std::prev(next);
    overlaps_prev = prev->first + prev->second.length > b;
  }
  if (overlaps_next || overlaps_prev) {
    return InvalidArgument(fmt::format("{}: range {} + {} bytes overlaps a live range", what_,
                                       base, length));
  }
  ranges_.emplace(b, Range{length, accounted});
  return Status::Ok();
}

Status RangeLedger::NotLive(const void* base) const {
  return NotFound(fmt::format("{}: {} is not the start of a live range (double free, or memory "
                              "from elsewhere)", what_, base));
}

Result<uint64_t> RangeLedger::Erase(const void* base) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(reinterpret_cast<uintptr_t>(base));
  if (it == ranges_.end()) return NotLive(base);
  uint64_t accounted = it->second.accounted;
  ranges_.erase(it);
  in_use_ -= std::min(accounted, in_use_);
  return accounted;
}

Result<uint64_t> RangeLedger::Length(const void* base) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.find(reinterpret_cast<uintptr_t>(base));
  if (it == ranges_.end()) return NotLive(base);
  return it->second.length;
}

bool RangeLedger::Covers(const void* p, uint64_t n) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.upper_bound(a);
  if (it == ranges_.begin()) return false;
  --it;
  uint64_t offset = a - it->first;
  return offset <= it->second.length && n <= it->second.length - offset;
}

bool RangeLedger::Overlaps(const void* p, uint64_t n) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint64_t len = std::max<uint64_t>(n, 1);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranges_.lower_bound(a);
  if (it != ranges_.end() && it->first < a + len) return true;
  if (it == ranges_.begin()) return false;
  --it;
  return it->first + it->second.length > a;
}

uint64_t RangeLedger::in_use_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_use_;
}

uint64_t RangeLedger::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

size_t RangeLedger::live_ranges() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ranges_.size();
}

void RangeLedger::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

std::vector<std::pair<void*, uint64_t>> RangeLedger::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<void*, uint64_t>> out;
  out.reserve(ranges_.size());
  for (const auto& [base, range] : ranges_) {
    out.emplace_back(reinterpret_cast<void*>(base), range.length);
  }
  return out;
}

}  // namespace zinf
