#include "io/engine.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "src/base/log.h"

namespace zinf::io {

struct Engine::FileEntry {
  bool live = false;
  FileLayout layout;
  std::vector<int> fixed;  // registered slot per member, -1 when not registered
};

struct Engine::Op {
  Ticket id = 0;
  Request req;
  Callback cb;
  uint64_t cut = 0;       // bytes of the request already cut into pieces
  uint32_t inflight = 0;  // pieces of this op holding a slot
  bool failed = false;
  Status status;
};

struct Engine::Slot {
  Op* op = nullptr;
  Piece piece;
  uint32_t member = 0;
  uint32_t retries = 0;
};

namespace {

// Backoff after a transient submit refusal: doubling from the first to the most.
constexpr std::chrono::microseconds kFirstSubmitBackoff{50};
constexpr std::chrono::microseconds kMaxSubmitBackoff{20000};

// Set on a thread while it runs completion callbacks: Submits made there are prepared but
// flushed together once the callbacks return.
thread_local const Engine* tls_in_callbacks = nullptr;

}  // namespace

Engine::Engine(std::unique_ptr<Backend> backend, const EngineOptions& options)
    : options_(options), backend_(std::move(backend)) {
  slots_.resize(options_.queue_depth);
  free_slots_.reserve(options_.queue_depth);
  for (uint32_t i = options_.queue_depth; i-- > 0;) free_slots_.push_back(i);
  raw_.resize(options_.queue_depth);
}

Engine::~Engine() {
  Status s = Drain();
  if (!s.ok()) Log().error("io: engine closed with an error in flight: {}", s.ToString());
  if (reaper_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_reaper_ = true;
    }
    work_cv_.notify_all();
    cv_.notify_all();
    reaper_.join();
  }
  for (auto& f : files_) {
    for (int slot : f.fixed) backend_->RemoveFile(slot);
  }
}

Result<FileId> Engine::AddFile(FileLayout layout) {
  if (layout.members.empty()) return InvalidArgument("AddFile: a file layout needs a member");
  if (layout.members.size() > 1 && layout.stripe_bytes == 0) {
    return InvalidArgument("AddFile: a striped layout needs stripe_bytes > 0");
  }
  if (layout.mem_align == 0 || layout.offset_align == 0) {
    return InvalidArgument("AddFile: alignments must be at least 1");
  }
  if (layout.stripe_bytes % layout.offset_align != 0) {
    return InvalidArgument(fmt::format("AddFile: stripe unit {} is not a multiple of the "
                                       "O_DIRECT alignment {} of {}",
                                       layout.stripe_bytes, layout.offset_align,
                                       layout.members[0].path));
  }
  std::lock_guard lock(mu_);
  FileEntry e;
  e.live = true;
  for (auto& m : layout.members) e.fixed.push_back(backend_->AddFile(m.fd));
  e.layout = std::move(layout);
  files_.push_back(std::move(e));
  return static_cast<FileId>(files_.size() - 1);
}

Status Engine::RemoveFile(FileId file) {
  std::lock_guard lock(mu_);
  if (file >= files_.size() || !files_[file].live) {
    return InvalidArgument(fmt::format("RemoveFile: unknown file id {}", file));
  }
  for (int slot : files_[file].fixed) backend_->RemoveFile(slot);
  files_[file] = FileEntry{};
  return Status::Ok();
}

Status Engine::RegisterBuffer(void* base, size_t len) {
  std::lock_guard lock(mu_);
  if (!ops_.empty()) return FailedPrecondition("RegisterBuffer with requests in flight");
  auto* p = static_cast<const char*>(base);
  for (const iovec& r : requested_) {
    auto* rb = static_cast<const char*>(r.iov_base);
    if (p >= rb && p + len <= rb + r.iov_len) return Status::Ok();  // already registered
  }
  requested_.push_back(iovec{base, len});
  // The kernel takes fixed buffers of at most 1 GiB each (a larger one fails with EFAULT):
  // a larger range is registered as consecutive 1 GiB pieces.
  for (size_t off = 0; off < len; off += kMaxFixedBufferBytes) {
    regions_.push_back(iovec{const_cast<char*>(p) + off, std::min(kMaxFixedBufferBytes, len - off)});
  }
  std::sort(regions_.begin(), regions_.end(),
            [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
  Status s = backend_->RegisterBuffers(regions_);
  buffers_registered_ = s.ok();
  if (!s.ok() && s.code() != StatusCode::kUnimplemented) {
    // Typically RLIMIT_MEMLOCK for an unprivileged user: plain reads and writes still work.
    WarnOnce("io.register_buffers",
             fmt::format("io: {} could not register {} buffer(s) ({}); using unregistered "
                         "buffers (raise `ulimit -l` to allow it)",
                         backend_->Name(), regions_.size(), s.message()));
  }
  return Status::Ok();
}

int Engine::BufferIndex(const void* p, size_t len) const {
  if (!buffers_registered_ || regions_.empty()) return -1;
  auto it = std::upper_bound(regions_.begin(), regions_.end(), p,
                             [](const void* x, const iovec& r) { return x < r.iov_base; });
  if (it == regions_.begin()) return -1;
  --it;
  auto* base = static_cast<const char*>(it->iov_base);
  auto* q = static_cast<const char*>(p);
  if (q + len > base + it->iov_len) return -1;
  return static_cast<int>(it - regions_.begin());
}

Status Engine::Validate(const Request& r) const {
  if (r.file >= files_.size() || !files_[r.file].live) {
    return InvalidArgument(fmt::format("request names unknown file id {}", r.file));
  }
  const FileLayout& l = files_[r.file].layout;
  const std::string& path = l.members[0].path;
  if (r.len == 0 || r.buf == nullptr) {
    return InvalidArgument(fmt::format("{} {} offset {}: empty request (length {}, buffer {})",
                                       OpKindName(r.op), path, r.offset, r.len, r.buf));
  }
  if (r.offset > l.size || r.len > l.size - r.offset) {
    return OutOfRange(fmt::format("{} {} offset {} length {}: beyond the file's {} bytes",
                                  OpKindName(r.op), path, r.offset, r.len, l.size));
  }
  auto addr = reinterpret_cast<uintptr_t>(r.buf);
  if (addr % l.mem_align != 0 || r.offset % l.offset_align != 0 || r.len % l.offset_align != 0) {
    return InvalidArgument(fmt::format(
        "{} {} offset {} length {} buffer {}: misaligned for O_DIRECT on this file, which "
        "requires offset and length multiples of {} bytes and a buffer address multiple of {}",
        OpKindName(r.op), path, r.offset, r.len, r.buf, l.offset_align, l.mem_align));
  }
  return Status::Ok();
}

Result<Ticket> Engine::Enqueue(std::unique_lock<std::mutex>& lock, const Request& r,
                               Callback cb) {
  ZINF_RETURN_IF_ERROR(Validate(r));
  auto op = std::make_unique<Op>();
  const Ticket id = next_ticket_++;
  op->id = id;
  op->req = r;
  op->cb = std::move(cb);
  Op* raw = op.get();
  ops_.emplace(id, std::move(op));
  pending_[static_cast<int>(r.priority)].push_back(raw);
  work_cv_.notify_one();
  Pump();
  // `raw` may be gone after this (FlushLocked can release the lock): only `id` is used.
  if (tls_in_callbacks != this) FlushLocked(lock);
  return id;
}

Result<Ticket> Engine::Submit(const Request& request) {
  std::unique_lock lock(mu_);
  return Enqueue(lock, request, nullptr);
}

Status Engine::Submit(const Request& request, Callback done, Ticket* ticket) {
  if (!done) return InvalidArgument("Submit: empty callback");
  std::unique_lock lock(mu_);
  ZINF_ASSIGN_OR_RETURN(Ticket id, Enqueue(lock, request, std::move(done)));
  if (ticket != nullptr) *ticket = id;
  return Status::Ok();
}

bool Engine::Promote(Ticket ticket, Priority to) {
  std::unique_lock lock(mu_);
  auto it = ops_.find(ticket);
  if (it == ops_.end() || it->second->req.priority <= to) return false;
  Op* op = it->second.get();
  auto& from = pending_[static_cast<int>(op->req.priority)];
  auto at = std::find(from.begin(), from.end(), op);
  if (at == from.end()) return false;  // every byte is cut (or it failed)
  from.erase(at);
  op->req.priority = to;
  pending_[static_cast<int>(to)].push_back(op);
  stats_.promotions++;
  Pump();
  if (tls_in_callbacks != this) FlushLocked(lock);
  return true;
}

void Engine::Pump() {
  while (!free_slots_.empty()) {
    std::deque<Op*>* queue = nullptr;  // the most urgent priority with work
    for (auto& q : pending_) {
      if (!q.empty()) {
        queue = &q;
        break;
      }
    }
    if (queue == nullptr) break;
    Op* op = queue->front();
    const FileEntry& f = files_[op->req.file];
    const FileLayout& l = f.layout;
    uint64_t logical = op->req.offset + op->cut;
    uint64_t len = std::min<uint64_t>(options_.block_size, op->req.len - op->cut);
    uint32_t member = 0;
    uint64_t phys = logical;
    if (l.members.size() > 1) {
      uint64_t unit = logical / l.stripe_bytes;
      uint64_t within = logical % l.stripe_bytes;
      len = std::min(len, l.stripe_bytes - within);
      member = static_cast<uint32_t>(unit % l.members.size());
      phys = (unit / l.members.size()) * l.stripe_bytes + within;
    }
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    Slot& s = slots_[slot];
    s.op = op;
    s.member = member;
    s.retries = 0;
    s.piece.op = op->req.op;
    s.piece.fd = l.members[member].fd;
    s.piece.fixed_file = f.fixed[member];
    s.piece.offset = phys;
    s.piece.buf = static_cast<char*>(op->req.buf) + op->cut;
    s.piece.len = static_cast<uint32_t>(len);
    s.piece.buf_index = BufferIndex(s.piece.buf, len);
    s.piece.tag = slot;
    op->cut += len;
    op->inflight++;
    if (op->cut == op->req.len) queue->pop_front();
    PrepareSlot(slot);
  }
}

void Engine::PrepareSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  Status st = backend_->Prepare(s.piece);
  if (st.ok()) {
    pieces_in_flight_++;
    prepared_unflushed_ = true;
    return;
  }
  Op* op = s.op;
  Fail(op, st.WithContext(Describe(s)));
  ReleaseSlot(slot);
}

bool Engine::FlushLocked(std::unique_lock<std::mutex>& lock) {
  if (!prepared_unflushed_) return true;
  if (flushing_) return false;  // the thread backing off hands these over too
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto limit = std::chrono::milliseconds(options_.submit_timeout_ms);
  auto delay = kFirstSubmitBackoff;
  unsigned refusals = 0;
  while (prepared_unflushed_) {
    Status s = backend_->Flush();
    if (s.ok()) {
      prepared_unflushed_ = false;
      break;
    }
    refusals++;
    const bool transient = IsTransientSubmitErrno(s.errno_value());
    const auto waited = Clock::now() - start;
    if (transient && waited < limit) {
      // Not now: sleep without the lock (other threads keep submitting and reaping; they see
      // flushing_ and leave the flush to us), reap what completed, try again.
      stats_.submit_retries++;
      flushing_ = true;
      if (s.errno_value() != EINTR) {
        const auto nap = std::min<Clock::duration>(delay, limit - waited);
        lock.unlock();
        std::this_thread::sleep_for(nap);
        lock.lock();
        delay = std::min(delay * 2, kMaxSubmitBackoff);
      }
      ReapNow(lock);
      cv_.notify_all();
      continue;
    }
    if (transient) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
      s = s.WithContext(fmt::format("{} submit refused {} times in {} ms (limit {} ms)",
                                    backend_->Name(), refusals, ms, options_.submit_timeout_ms));
    }
    WithdrawAndFail(s);
    // Slots came free: start the requests that waited for one (handed over by the next turn,
    // which gives up at once if the kernel still refuses past the limit).
    Pump();
  }
  flushing_ = false;
  cv_.notify_all();
  return true;
}

void Engine::ReapNow(std::unique_lock<std::mutex>& lock) {
  if (reaping_ || pieces_in_flight_ == 0) return;
  reaping_ = true;
  lock.unlock();
  Result<size_t> got = backend_->Wait(raw_, 0);
  lock.lock();
  reaping_ = false;
  if (!got.ok()) {
    Status s = got.status().WithContext(fmt::format("io: {} reaping", backend_->Name()));
    Log().error("{}", s.ToString());
    if (reaper_error_.ok()) reaper_error_ = s;
    return;
  }
  for (size_t i = 0; i < *got; ++i) OnRaw(raw_[i]);
  Pump();
}

void Engine::WithdrawAndFail(const Status& why) {
  std::vector<uint64_t> tags = backend_->Withdraw();
  prepared_unflushed_ = false;
  size_t withdrawn = 0;
  for (uint64_t tag : tags) {
    if (tag >= slots_.size() || slots_[tag].op == nullptr) {
      Log().error("io: {} withdrew a piece of unknown slot {}", backend_->Name(), tag);
      continue;
    }
    Slot& s = slots_[tag];
    pieces_in_flight_--;
    stats_.withdrawn_pieces++;
    withdrawn++;
    Fail(s.op, why.WithContext(Describe(s) + ": never handed to the kernel"));
    ReleaseSlot(static_cast<uint32_t>(tag));
  }
  Log().error("io: {} submit failed; {} piece(s) withdrawn, their requests fail: {}",
              backend_->Name(), withdrawn, why.ToString());
}

std::string Engine::Describe(const Slot& s) const {
  const FileLayout& l = files_[s.op->req.file].layout;
  return fmt::format("{} {} offset {} length {} (request offset {} length {})",
                     OpKindName(s.piece.op), l.members[s.member].path, s.piece.offset,
                     s.piece.len, s.op->req.offset, s.op->req.len);
}

void Engine::Fail(Op* op, Status status) {
  if (!op->failed) {
    op->failed = true;
    op->status = std::move(status);
    stats_.failed_requests++;
    // Pieces not yet cut are never issued.
    auto& q = pending_[static_cast<int>(op->req.priority)];
    auto it = std::find(q.begin(), q.end(), op);
    if (it != q.end()) q.erase(it);
  }
}

void Engine::ReleaseSlot(uint32_t slot) {
  Slot& s = slots_[slot];
  Op* op = s.op;
  s.op = nullptr;
  free_slots_.push_back(slot);
  op->inflight--;
  if (op->inflight == 0 && (op->failed || op->cut == op->req.len)) {
    auto it = ops_.find(op->id);
    if (op->cb) {
      to_notify_.push_back(std::move(it->second));
    } else {
      // A ticket's status is ready for Wait at once (even when no piece ever reached the kernel).
      finished_.emplace(op->id, op->status);
      finished_since_poll_++;
      cv_.notify_all();
    }
    ops_.erase(it);
  }
}

void Engine::OnRaw(const RawCompletion& c) {
  if (c.tag >= slots_.size() || slots_[c.tag].op == nullptr) {
    Log().error("io: {} returned a completion for unknown slot {}", backend_->Name(), c.tag);
    return;
  }
  uint32_t slot = static_cast<uint32_t>(c.tag);
  Slot& s = slots_[slot];
  pieces_in_flight_--;
  stats_.pieces++;
  Op* op = s.op;
  int64_t res = c.result;
  if (res < 0) {
    int err = static_cast<int>(-res);
    if ((err == EAGAIN || err == EINTR) && s.retries < options_.max_retries && !op->failed) {
      s.retries++;
      stats_.retries++;
      PrepareSlot(slot);
      return;
    }
    Fail(op, Status::FromErrno(err, Describe(s)));
  } else if (res == 0) {
    Fail(op, s.piece.op == OpKind::kRead
                 ? OutOfRange(Describe(s) + ": end of file")
                 : IoError(Describe(s) + ": the kernel wrote 0 bytes"));
  } else if (static_cast<uint64_t>(res) > s.piece.len) {
    Fail(op, Internal(fmt::format("{}: {} bytes reported for a {}-byte piece", Describe(s), res,
                                  s.piece.len)));
  } else {
    (s.piece.op == OpKind::kRead ? stats_.bytes_read : stats_.bytes_written) +=
        static_cast<uint64_t>(res);
    if (static_cast<uint64_t>(res) < s.piece.len && !op->failed) {
      // Short transfer: the rest of this piece goes again.
      stats_.short_transfers++;
      s.piece.offset += static_cast<uint64_t>(res);
      s.piece.buf = static_cast<char*>(s.piece.buf) + res;
      s.piece.len -= static_cast<uint32_t>(res);
      s.retries = 0;
      PrepareSlot(slot);
      return;
    }
  }
  ReleaseSlot(slot);
}

Result<size_t> Engine::PollLocked(std::unique_lock<std::mutex>& lock, bool block) {
  FlushLocked(lock);
  const bool ready = !to_notify_.empty() || finished_since_poll_ > 0;
  if (reaping_ || flushing_) {
    // Another thread is in the backend's Wait, or backing off from a refused submit (pieces
    // may still be outside the kernel: blocking on them could be forever); it wakes us.
    if (block && !ready) cv_.wait(lock);
  } else if (pieces_in_flight_ > 0) {
    // FlushLocked handed every prepared piece over (or withdrew it): each one in flight is in
    // the kernel and completes, so blocking for one is safe.
    reaping_ = true;
    lock.unlock();
    Result<size_t> got = backend_->Wait(raw_, block && !ready ? 1 : 0);
    lock.lock();
    reaping_ = false;
    if (!got.ok()) {
      cv_.notify_all();
      return got.status().WithContext(fmt::format("io: {} reaping", backend_->Name()));
    }
    for (size_t i = 0; i < *got; ++i) OnRaw(raw_[i]);
    Pump();
    FlushLocked(lock);  // retries, remainders and newly cut pieces
  }
  size_t finished = std::exchange(finished_since_poll_, 0);
  cv_.notify_all();
  if (to_notify_.empty()) return finished;
  std::vector<std::unique_ptr<Op>> done;
  done.swap(to_notify_);
  finished += done.size();
  lock.unlock();
  tls_in_callbacks = this;
  for (auto& op : done) op->cb(op->status);
  tls_in_callbacks = nullptr;
  done.clear();
  lock.lock();
  FlushLocked(lock);  // what the callbacks submitted, in one kernel call
  return finished;
}

Status Engine::Wait(Ticket ticket) {
  std::unique_lock lock(mu_);
  while (true) {
    auto it = finished_.find(ticket);
    if (it != finished_.end()) {
      Status s = std::move(it->second);
      finished_.erase(it);
      return s;
    }
    auto live = ops_.find(ticket);
    if (live == ops_.end()) return InvalidArgument(fmt::format("Wait: unknown ticket {}", ticket));
    if (live->second->cb) return InvalidArgument("Wait: the request has a callback");
    auto r = PollLocked(lock, true);
    if (!r.ok()) return r.status();
  }
}

Result<size_t> Engine::Poll(bool block) {
  std::unique_lock lock(mu_);
  return PollLocked(lock, block);
}

Status Engine::Drain() {
  std::unique_lock lock(mu_);
  while (!ops_.empty() || !to_notify_.empty()) {
    auto r = PollLocked(lock, true);
    if (!r.ok()) return r.status();
  }
  if (!reaper_error_.ok()) return std::exchange(reaper_error_, Status::Ok());
  return Status::Ok();
}

void Engine::StartReaper() {
  std::lock_guard lock(mu_);
  if (reaper_.joinable()) return;
  reaper_ = std::thread([this] {
    std::unique_lock lock(mu_);
    while (!stop_reaper_) {
      if (ops_.empty() && to_notify_.empty()) {
        work_cv_.wait(lock);
        continue;
      }
      auto r = PollLocked(lock, true);
      if (!r.ok()) {
        Log().error("io: reaper: {}", r.status().ToString());
        if (reaper_error_.ok()) reaper_error_ = r.status();
      }
    }
  });
}

Status Engine::Read(FileId file, uint64_t offset, void* buf, size_t len) {
  ZINF_ASSIGN_OR_RETURN(Ticket t, Submit(Request{OpKind::kRead, file, offset, buf, len}));
  return Wait(t);
}

Status Engine::Write(FileId file, uint64_t offset, const void* buf, size_t len) {
  ZINF_ASSIGN_OR_RETURN(Ticket t, Submit(Request{OpKind::kWrite, file, offset,
                                                 const_cast<void*>(buf), len}));
  return Wait(t);
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t Engine::requests_in_flight() const {
  std::lock_guard lock(mu_);
  return ops_.size();
}

}  // namespace zinf::io
