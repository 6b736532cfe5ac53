// io/backend.h — the seam under the Engine: one way of running raw Pieces.
//
// Implementations: UringBackend (liburing), AioBackend (libaio), PosixBackend (worker threads
// doing pread/pwrite), FaultInjectingBackend (wraps another, for tests). A backend runs what it
// is given and reports each piece's raw result; it never retries, splits or interprets results:
// that is the Engine's job, written once.
//
// Thread-safety: Prepare/Flush/AddFile/RegisterBuffers are called by one thread at a time
// (the Engine serialises them under its mutex); Wait is called by at most one thread at a time
// and may run concurrently with Prepare/Flush (io_uring's SQ and CQ sides are independent,
// io_submit/io_getevents are thread-safe syscalls).
#pragma once

#include <sys/uio.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "io/request.h"
#include "zinf/status.h"

namespace zinf::io {

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

  // Queues one piece. The backend may run it at once (posix) or at the next Flush.
  virtual Status Prepare(const Piece& piece) = 0;
  // Hands everything prepared to the kernel.
  virtual Status Flush() = 0;

  // Blocks until at least `min_complete` completions are available (0: do not block), then
  // returns up to out.size() of them. The caller guarantees min_complete <= pieces in flight.
  virtual Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) = 0;
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
