// src/base/range_ledger.h — live address ranges and their byte total, under a hard budget.
//
// Contract: the Device seam keeps one ledger per kind of memory (device allocations, pinned
// allocations, registered host ranges). Admission is two-phase so that a budget is never
// exceeded even while the real allocation is in progress on another thread:
//   Reserve(accounted)            admits bytes or refuses with ResourceExhausted naming the
//                                 request, the bytes in use and the budget; never exceeds it;
//   Commit(base, length, accounted) records the range once the memory exists (refused if it
//                                 overlaps a live range: the caller then Cancels);
//   Cancel(accounted)             returns a reservation whose allocation failed;
//   Erase(base)                   forgets a range and releases its accounted bytes.
// `accounted` may exceed `length` (alignment padding counts against the budget); Covers checks
// against `length`, so a copy into the padding is still refused. Peak is the high-water mark of
// bytes in use (reserved or committed) since construction or the last ResetPeak.
//
// This header is also compiled by nvcc (C++17): keep it free of C++20.
//
// Thread-safety: every method may be called from any thread; one internal mutex.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zinf/status.h"

namespace zinf {

class RangeLedger {
 public:
  static constexpr uint64_t kNoBudget = std::numeric_limits<uint64_t>::max();

  // `what` names the memory in messages ("device memory", "pinned host memory").
  explicit RangeLedger(std::string what, uint64_t budget_bytes = kNoBudget);

  Status Reserve(uint64_t accounted);
  void Cancel(uint64_t accounted);
  Status Commit(const void* base, uint64_t length, uint64_t accounted);
  // Returns the accounted bytes released; NotFound when `base` does not start a live range.
  Result<uint64_t> Erase(const void* base);

  // The length of the live range starting at `base`; NotFound when none starts there.
  Result<uint64_t> Length(const void* base) const;
  // True when [p, p + n) lies inside one live range (n == 0: p inside or at the end of one).
  bool Covers(const void* p, uint64_t n) const;
  // True when [p, p + n) intersects any live range.
  bool Overlaps(const void* p, uint64_t n) const;

  uint64_t budget_bytes() const { return budget_; }
  uint64_t in_use_bytes() const;
  uint64_t peak_bytes() const;
  size_t live_ranges() const;
  void ResetPeak();  // peak := bytes in use now

  // The live ranges as (base, length), for releasing what callers leaked at shutdown.
  std::vector<std::pair<void*, uint64_t>> Snapshot() const;

 private:
  struct Range {
    uint64_t length;
    uint64_t accounted;
  };

  Status NotLive(const void* base) const;  // the NotFound for a base that starts no range

  const std::string what_;
  const uint64_t budget_;
  mutable std::mutex mu_;
  uint64_t in_use_ = 0;                // GUARDED_BY(mu_): reserved + committed
  uint64_t peak_ = 0;                  // GUARDED_BY(mu_)
  std::map<uintptr_t, Range> ranges_;  // GUARDED_BY(mu_): keyed by base address
};

}  // namespace zinf
