// io/fault_backend.h — a Backend wrapper that injects faults, for tests of everything above it.
//
// Contract: for every piece prepared, `rule` decides a Fault:
//   kNone   the piece runs on the wrapped backend as given;
//   kShort  the piece runs with its length cut to `short_len` (the real, partial transfer
//           happens and its real result is reported — a genuine short read or write);
//   kErrno  the piece does NOT run; its completion reports -err (EIO, ENOSPC, EAGAIN, EINTR...),
//           exactly what a kernel reports for a transfer that did not happen.
// Counts of each injected fault are kept so a test can check that faults really occurred.
//
// Thread-safety: as Backend (Prepare/Flush from one thread at a time, Wait concurrently).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <vector>

#include "io/backend.h"

namespace zinf::io {

struct Fault {
  enum Kind { kNone, kShort, kErrno } kind = kNone;
  int err = 0;            // kErrno
  uint32_t short_len = 0; // kShort: bytes to really transfer (0 < short_len < piece.len)
};

using FaultRule = std::function<Fault(const Piece&)>;

// A seeded random rule: each piece gets at most one fault, by these probabilities. Short
// lengths are multiples of `align` so that O_DIRECT accepts the remainder.
struct RandomFaultPlan {
  double p_short = 0, p_eagain = 0, p_eintr = 0, p_eio = 0, p_enospc = 0;
  uint32_t align = 4096;
  uint64_t seed = 1;
  // Only pieces of this kind get faults (both when unset).
  std::optional<OpKind> only;
};
FaultRule RandomFaults(const RandomFaultPlan& plan);

struct FaultCounts {
  uint64_t shorts = 0, errors = 0, eagain = 0, eintr = 0, eio = 0, enospc = 0, passed = 0;
};

class FaultInjectingBackend final : public Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultRule rule);
  std::string_view Name() const override { return inner_->Name(); }
  int AddFile(int fd) override { return inner_->AddFile(fd); }
  void RemoveFile(int slot) override { inner_->RemoveFile(slot); }
  Status RegisterBuffers(std::span<const iovec> b) override { return inner_->RegisterBuffers(b); }
  Status Prepare(const Piece& piece) override;
  Status Flush() override { return inner_->Flush(); }
  Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) override;

  // Replaces the rule (REQUIRES: nothing in flight).
  void set_rule(FaultRule rule);
  FaultCounts counts() const;

 private:
  std::unique_ptr<Backend> inner_;
  FaultRule rule_;
  mutable std::mutex mu_;  // guards synthetic_, inner_inflight_, counts_
  std::vector<RawCompletion> synthetic_;
  size_t inner_inflight_ = 0;
  FaultCounts counts_;
};

}  // namespace zinf::io
