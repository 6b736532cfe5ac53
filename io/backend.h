// io/backend.h — the seam under the Engine: one way of running raw Pieces.
//
// Implementations: UringBackend (liburing), AioBackend (libaio), PosixBackend (worker threads
// doing pread/pwrite), FaultInjectingBackend (wraps another, for tests). A backend runs what it
// is given and reports each piece's raw result; it never retries, splits or interprets results:
// that is the Engine's job, written once.
//
// Contract of a piece's life: Prepare queues it; Flush hands every queued piece to the kernel
// (or to the posix workers). Each piece handed over gets exactly one completion from Wait. A
// piece the kernel did not take stays queued when Flush fails transiently, and is withdrawn by
// Withdraw: it never runs and never completes. So every prepared piece ends in exactly one of
// a completion or Withdraw's list.
//
// Thread-safety: Prepare/Flush/Withdraw/AddFile/RegisterBuffers/SetSubmitRule are called by one
// thread at a time (the Engine serialises them under its mutex); Wait is called by at most one
// thread at a time and may run concurrently with Prepare/Flush/Withdraw (io_uring's SQ and CQ
// sides are independent, io_submit/io_getevents are thread-safe syscalls).
#pragma once

#include <sys/uio.h>

#include <cerrno>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/request.h"
#include "zinf/status.h"

namespace zinf::io {

// What one kernel submit call does, for tests (see Backend::SetSubmitRule).
struct SubmitFault {
  enum Kind {
    kNone,   // the call runs for real
    kTake,   // the kernel takes only the first `take` (>= 1) of the queued pieces
    kErrno,  // the call fails with -err and takes nothing (EAGAIN, EBUSY, EINTR, EIO...)
  } kind = kNone;
  unsigned take = 0;
  int err = 0;
};
// Consulted before each kernel submit call with the number of pieces it would hand over.
using SubmitRule = std::function<SubmitFault(unsigned queued)>;

// io_uring_enter, io_submit: these errnos mean "not now" (the kernel is short of memory, its
// completion queue is full, a signal came); nothing was taken and the same call may work later.
inline bool IsTransientSubmitErrno(int err) {
  return err == EAGAIN || err == EBUSY || err == EINTR;
}

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view Name() const = 0;

  // Registers `fd` with the kernel when the backend supports fixed files; returns the slot to
  // put in Piece::fixed_file, or -1 when pieces must use the plain fd.
  virtual int AddFile(int fd) { return -1; }
  virtual void RemoveFile(int slot) {}

  // Registers host buffers once (io_uring fixed buffers). Unimplemented when the backend has no
  // such notion; the Engine then runs plain reads and writes on the same memory.
  virtual Status RegisterBuffers(std::span<const iovec> buffers) {
    return Unimplemented("buffer registration");
  }

  // Queues one piece; it runs no earlier than the next Flush. An error means the piece was
  // not queued (it will neither complete nor be withdrawn).
  virtual Status Prepare(const Piece& piece) = 0;
  // Hands every queued piece to the kernel. OK: all of them were taken. A transient error
  // (IsTransientSubmitErrno(status.errno_value())): the kernel took some or none and the rest
  // are still queued, for a later Flush or Withdraw. Any other error: the kernel took some or
  // none; the caller must Withdraw the rest.
  virtual Status Flush() = 0;
  // Takes back every queued piece the kernel has not taken, so that it never runs, and returns
  // their tags.
  virtual std::vector<uint64_t> Withdraw() = 0;

  // Blocks until at least `min_complete` completions are available (0: do not block), then
  // returns up to out.size() of them. The caller guarantees min_complete <= pieces handed over
  // and not yet completed.
  virtual Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) = 0;

  // Test seam: with a rule, each kernel submit call of Flush first asks it what to do, so that
  // a test sees the backend's own handling of a refused or partial submit (null: real calls
  // only). Returns false when the backend has no kernel submit call to fault.
  virtual bool SetSubmitRule(SubmitRule rule) { return false; }
};

struct BackendOptions {
  unsigned queue_depth = 32;   // most pieces the Engine will keep in flight
  unsigned posix_threads = 0;  // posix only; 0 = queue_depth
};

// Each factory fails (Unavailable/Unimplemented/...) when the system refuses the set-up.
Result<std::unique_ptr<Backend>> MakeUringBackend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> MakeAioBackend(const BackendOptions& options);
Result<std::unique_ptr<Backend>> MakePosixBackend(const BackendOptions& options);

}  // namespace zinf::io
