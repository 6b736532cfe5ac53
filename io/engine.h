// io/engine.h — asynchronous block I/O on registered (optionally striped) files.
//
// Contract:
// - Create() picks a backend: uring, aio or posix as asked; `auto` tries io_uring, then libaio,
//   then posix threads, and logs once which engine runs and why the better ones were refused.
//   io_uring is skipped when EngineOptions::allow_uring is false or ZINF_IO_DISABLE_URING=1.
// - Submit() validates a request (file known, within the file, aligned as the file's O_DIRECT
//   alignment requires: errors name the alignment) and returns at once (unless the kernel
//   refuses submits: then it may back off for up to submit_timeout_ms, see below). A request
//   that passes validation is accepted, and every later failure, including the kernel refusing
//   the submit, is reported through that request (Wait's status or the callback), never only
//   logged. The request is split into pieces of at most block_size bytes, never crossing a
//   stripe boundary; at most queue_depth pieces are in flight. Pending requests are cut in
//   order of Request::priority (demand, then prefetch, then background), first come first
//   served within one; a piece already in the kernel is not preempted. A short transfer is
//   resubmitted for its remainder, EAGAIN and EINTR are retried (max_retries per piece), any
//   other error fails the request with a status naming the file, physical offset, length and
//   errno. End of file on a read is OutOfRange. A request is reported OK only when every byte was
//   transferred, and is reported (callback or Wait) only after none of its pieces is still in
//   the kernel, so its buffer is free to reuse.
// - Submitting to the kernel (io_uring_enter, io_submit): a transient refusal (EAGAIN, EBUSY,
//   EINTR) is retried with exponential backoff (50 us doubling to 20 ms; the engine's lock is
//   not held while sleeping, and completions are reaped meanwhile, which is what frees the
//   kernel's memory or completion queue) for at most submit_timeout_ms in all. A hard refusal,
//   or a transient one past that time, withdraws every piece the kernel did not take (it never
//   runs) and fails its request with the submit error and the piece's file, offset and length;
//   pieces the kernel did take complete normally, and a request with pieces of both kinds is
//   reported (failed) once those taken are done. Other requests are not affected. (libaio's
//   io_submit refuses only its first iocb on a hard error: that piece completes with the error
//   and the rest go on.) Only one thread backs off at a time; the others neither flush nor
//   block in the kernel meanwhile.
// - Completions are reaped by whichever thread calls Poll/Wait/Drain; callbacks run on that
//   thread without the engine's lock held and may Submit more work (those submissions are
//   batched into one kernel call after the callbacks return). A request that fails before any
//   of its pieces reaches the kernel (a refused Prepare or submit) still reports through Wait
//   (its own error) or its callback (run by the next Poll/Wait/Drain or the reaper).
//
// Thread-safety: all public methods may be called from any number of threads at once, except
// AddFile/RemoveFile/RegisterBuffer, which REQUIRE that no request is in flight.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "io/backend.h"
#include "io/request.h"
#include "zinf/status.h"

namespace zinf::io {

enum class EngineKind { kAuto, kUring, kAio, kPosix };
std::string_view EngineKindName(EngineKind kind);
Result<EngineKind> ParseEngineKind(std::string_view name);  // "auto", "uring", "aio", "posix"

inline constexpr uint64_t kDefaultBlockBytes = 1 << 20;
inline constexpr unsigned kDefaultQueueDepth = 32;

struct EngineOptions {
  EngineKind kind = EngineKind::kAuto;
  uint64_t block_size = kDefaultBlockBytes;  // largest piece handed to the kernel
  unsigned queue_depth = kDefaultQueueDepth;  // most pieces in flight
  unsigned posix_threads = 0;                 // posix engine's workers; 0 = queue_depth
  bool allow_uring = true;                    // false: auto never tries io_uring
  unsigned max_retries = 1000;                // EAGAIN/EINTR resubmissions per piece
  // How long transient submit refusals (EAGAIN, EBUSY, EINTR from io_uring_enter/io_submit)
  // are retried, with backoff, before the pieces not taken are withdrawn and their requests
  // fail (0: they fail at the first refusal).
  unsigned submit_timeout_ms = 10000;
  // Wraps the backend chosen (tests: a FaultInjectingBackend under a whole training run).
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
};

// One file of a (possibly striped) set, opened by the caller (see io/file.h).
struct FileMember {
  int fd = -1;
  std::string path;
};

// How logical offsets map to member files: stripe unit k of the set lives in member
// k % members.size() at offset (k / members.size()) * stripe_bytes.
struct FileLayout {
  std::vector<FileMember> members;
  uint64_t stripe_bytes = 0;  // REQUIRED when members.size() > 1
  uint64_t size = 0;          // logical size; requests beyond it are refused
  uint32_t mem_align = 1;     // buffer address alignment (O_DIRECT), 1 when buffered
  uint32_t offset_align = 1;  // offset and length alignment (O_DIRECT), 1 when buffered
};

struct EngineStats {
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  uint64_t pieces = 0;           // pieces completed (including resubmissions)
  uint64_t retries = 0;          // EAGAIN/EINTR resubmissions
  uint64_t short_transfers = 0;  // short results resubmitted for their remainder
  uint64_t failed_requests = 0;
  uint64_t submit_retries = 0;    // kernel submit calls retried after a transient refusal
  uint64_t withdrawn_pieces = 0;  // pieces taken back after a failed submit (never ran)
  uint64_t promotions = 0;        // requests moved to a more urgent priority (Promote)
};

using Ticket = uint64_t;

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options);
  // An engine over a given backend (tests wrap a real one in a FaultInjectingBackend).
  static std::unique_ptr<Engine> WithBackend(std::unique_ptr<Backend> backend,
                                             const EngineOptions& options);
  ~Engine();  // waits for every request in flight

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::string_view name() const { return backend_->Name(); }
  const EngineOptions& options() const { return options_; }
  // Why `auto` did not get a better engine; empty when it got io_uring or was not `auto`.
  const std::string& fallback_reason() const { return fallback_reason_; }
  bool buffers_registered() const { return buffers_registered_; }

  Result<FileId> AddFile(FileLayout layout);
  Status RemoveFile(FileId file);
  // Registers [base, base+len) with the kernel (io_uring fixed buffers; a range above 1 GiB, the
  // kernel's limit per buffer, as 1 GiB pieces) in addition to those
  // registered before (memory inside a registered range is not registered again). Memory that
  // is not registered still works, through plain reads/writes.
  Status RegisterBuffer(void* base, size_t len);

  // Async with a ticket for Wait.
  Result<Ticket> Submit(const Request& request);
  // Async with a callback that runs exactly once when the request is done; on an error
  // return the callback never runs. `ticket` (optional) receives the request's ticket, for
  // Promote only (Wait does not take it).
  Status Submit(const Request& request, Callback done, Ticket* ticket = nullptr);
  // A caller now waits for a request submitted at a lower priority (a prefetch it needs now):
  // if some of its bytes are not yet cut into pieces, it moves to the back of `to`'s queue
  // (and its failure is reported as before). Its pieces already in the kernel are not
  // preempted. True when it moved; false when it is finished, unknown, already as urgent or
  // wholly in the kernel.
  bool Promote(Ticket ticket, Priority to);
  // Blocks until the ticket's request is done and returns its status (the ticket is consumed).
  Status Wait(Ticket ticket);
  // Reaps what has completed and runs callbacks; with `block`, waits for at least one piece
  // when any is in flight. Returns the number of requests finished.
  Result<size_t> Poll(bool block);
  // Waits until no request is in flight.
  Status Drain();

  // Starts a thread that reaps completions whenever requests are in flight, so the queue stays
  // full (and callbacks run) while the submitting threads compute. Idempotent. The thread sleeps
  // in the kernel while I/O is in flight and on a condition variable when none is. A reap error
  // is logged and returned by the next Drain.
  void StartReaper();

  // Blocking conveniences.
  Status Read(FileId file, uint64_t offset, void* buf, size_t len);
  Status Write(FileId file, uint64_t offset, const void* buf, size_t len);

  EngineStats stats() const;
  size_t requests_in_flight() const;

 private:
  struct Op;
  struct Slot;
  struct FileEntry;

  Engine(std::unique_ptr<Backend> backend, const EngineOptions& options);
  Status Validate(const Request& r) const;
  // REQUIRES: `lock` holds mu_ (each of these may release it for a while and retake it).
  Result<Ticket> Enqueue(std::unique_lock<std::mutex>& lock, const Request& r, Callback cb);
  Result<size_t> PollLocked(std::unique_lock<std::mutex>& lock, bool block);
  // Hands the prepared pieces to the kernel (see the contract). Returns false when another
  // thread is backing off from a refused submit (it owns the flush, these pieces included).
  bool FlushLocked(std::unique_lock<std::mutex>& lock);
  void ReapNow(std::unique_lock<std::mutex>& lock);     // non-blocking, while backing off
  void Pump();                                          // REQUIRES: mu_ held
  void PrepareSlot(uint32_t slot);                      // REQUIRES: mu_ held
  void WithdrawAndFail(const Status& why);              // REQUIRES: mu_ held
  void OnRaw(const RawCompletion& c);                   // REQUIRES: mu_ held
  void Fail(Op* op, Status status);                     // REQUIRES: mu_ held
  void ReleaseSlot(uint32_t slot);                      // REQUIRES: mu_ held
  std::string Describe(const Slot& s) const;            // REQUIRES: mu_ held
  int BufferIndex(const void* p, size_t len) const;

  EngineOptions options_;
  std::unique_ptr<Backend> backend_;
  std::string fallback_reason_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a reap finished
  std::vector<FileEntry> files_;
  std::vector<iovec> requested_;  // the ranges given to RegisterBuffer
  std::vector<iovec> regions_;  // registered buffers (at most 1 GiB each), sorted by base
  static constexpr size_t kMaxFixedBufferBytes = size_t{1} << 30;  // the kernel's limit
  bool buffers_registered_ = false;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<Op*> pending_[kPriorities];  // ops with bytes not yet cut, by priority
  std::unordered_map<Ticket, std::unique_ptr<Op>> ops_;  // unfinished ops
  std::unordered_map<Ticket, Status> finished_;         // finished ops awaiting Wait
  std::vector<std::unique_ptr<Op>> to_notify_;  // finished callback ops, callbacks not yet run
  std::vector<RawCompletion> raw_;
  Ticket next_ticket_ = 1;
  uint32_t pieces_in_flight_ = 0;
  bool prepared_unflushed_ = false;  // pieces prepared since the last complete Flush
  bool reaping_ = false;             // a thread is in backend_->Wait (mu_ released)
  bool flushing_ = false;            // a thread is backing off from a refused submit
  size_t finished_since_poll_ = 0;   // ticket ops finished since a Poll last counted them
  EngineStats stats_;
  std::condition_variable work_cv_;  // a request was submitted (wakes the reaper)
  std::thread reaper_;
  bool stop_reaper_ = false;
  Status reaper_error_;
};

}  // namespace zinf::io
