// io/fault_backend.h — a Backend wrapper that injects faults, for tests of everything above it.
//
// Contract: for every piece prepared, `rule` decides a Fault:
//   kNone   the piece runs on the wrapped backend as given;
//   kShort  the piece runs with its length cut to `short_len` (the real, partial transfer
//           happens and its real result is reported — a genuine short read or write);
//   kErrno  the piece does NOT run; its completion reports -err (EIO, ENOSPC, EAGAIN, EINTR...),
//           exactly what a kernel reports for a transfer that did not happen. Like a real
//           piece it is handed over at the next successful Flush (only then can Wait report
//           it) and is withdrawn with the others when the caller gives up on a failed Flush.
//   kRefuse Prepare itself fails with `err` (a backend out of queue entries): the piece is not
//           queued at all.
// Submit faults: set_submit_rule installs a SubmitRule in the wrapped backend (see
// Backend::SetSubmitRule), so each of its kernel submit calls can be refused transiently
// (EAGAIN, EBUSY, EINTR), refused for good (EIO...) or take only part of the batch, and the
// wrapped backend's own recovery (io_uring's withdrawal of unsubmitted SQEs) really runs.
// Counts of each injected fault are kept so a test can check that faults really occurred.
// Held completions: while HoldCompletions(true) is in force, Wait hands over nothing (a poll
// returns none, a blocking Wait waits for the release), so pieces stay in flight and what is
// submitted after them stays queued in the engine, as behind a slow drive.
//
// Thread-safety: as Backend (Prepare/Flush/Withdraw from one thread at a time, Wait
// concurrently). set_rule and set_submit_rule REQUIRE that nothing is in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <vector>

#include "io/backend.h"

namespace zinf::io {

struct Fault {
  enum Kind { kNone, kShort, kErrno, kRefuse } kind = kNone;
  int err = 0;            // kErrno, kRefuse
  uint32_t short_len = 0; // kShort: bytes to really transfer (0 < short_len < piece.len)
};

using FaultRule = std::function<Fault(const Piece&)>;

// A seeded random plan. Each piece gets at most one fault, by the p_* probabilities; each
// kernel submit call (RandomSubmitFaults) at most one of the p_submit_* faults. Short lengths
// are multiples of `align` so that O_DIRECT accepts the remainder.
struct RandomFaultPlan {
  double p_short = 0, p_eagain = 0, p_eintr = 0, p_eio = 0, p_enospc = 0;
  // Per submit call: refused with EAGAIN / EBUSY (transient), refused with EIO (hard), or only
  // a random part of the batch taken.
  double p_submit_eagain = 0, p_submit_ebusy = 0, p_submit_eio = 0, p_submit_partial = 0;
  uint32_t align = 4096;
  uint64_t seed = 1;
  // Only pieces of this kind get faults (both when unset).
  std::optional<OpKind> only;
};
FaultRule RandomFaults(const RandomFaultPlan& plan);
SubmitRule RandomSubmitFaults(const RandomFaultPlan& plan);

struct FaultCounts {
  uint64_t shorts = 0, errors = 0, eagain = 0, eintr = 0, eio = 0, enospc = 0, passed = 0;
  uint64_t refused = 0;  // Prepare calls failed (kRefuse)
  // Submit calls: refused transiently (EAGAIN, EBUSY, EINTR), refused otherwise, partly taken.
  uint64_t submit_transient = 0, submit_hard = 0, submit_partial = 0;
};

class FaultInjectingBackend final : public Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultRule rule);
  std::string_view Name() const override { return inner_->Name(); }
  int AddFile(int fd) override { return inner_->AddFile(fd); }
  void RemoveFile(int slot) override { inner_->RemoveFile(slot); }
  Status RegisterBuffers(std::span<const iovec> b) override { return inner_->RegisterBuffers(b); }
  Status Prepare(const Piece& piece) override;
  Status Flush() override;
  std::vector<uint64_t> Withdraw() override;
  Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) override;
  bool SetSubmitRule(SubmitRule rule) override { return set_submit_rule(std::move(rule)); }

  // Replaces the piece rule.
  void set_rule(FaultRule rule);
  // Replaces the submit rule (null: none); false when the wrapped backend cannot take one.
  bool set_submit_rule(SubmitRule rule);
  FaultCounts counts() const;
  // Holds (true) or releases (false) every completion, see above. Release before the engine
  // drains or is destroyed: a held Wait blocks until then.
  void HoldCompletions(bool hold);

 private:
  std::unique_ptr<Backend> inner_;
  FaultRule rule_;
  mutable std::mutex mu_;  // guards staged_, synthetic_, inner_inflight_, counts_
  std::vector<RawCompletion> staged_;     // kErrno pieces prepared, not yet handed over
  std::vector<RawCompletion> synthetic_;  // kErrno pieces handed over, for Wait to report
  size_t inner_inflight_ = 0;
  FaultCounts counts_;
  std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool held_ = false;  // guarded by hold_mu_
};

}  // namespace zinf::io
