#include "io/engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
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

// Set on a thread while it runs completion callbacks: Submits made there are prepared but
// flushed together once the callbacks return.
thread_local const Engine* tls_in_callbacks = nullptr;

std::string UringDisabledHint() {
  std::ifstream f("/proc/sys/kernel/io_uring_disabled");
  int v = 0;
  if (f >> v && v != 0) return fmt::format(" (kernel.io_uring_disabled = {})", v);
  return "";
}

}  // namespace

std::string_view EngineKindName(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto: return "auto";
    case EngineKind::kUring: return "uring";
    case EngineKind::kAio: return "aio";
    case EngineKind::kPosix: return "posix";
  }
  return "?";
}

Result<EngineKind> ParseEngineKind(std::string_view name) {
  if (name == "auto") return EngineKind::kAuto;
  if (name == "uring" || name == "io_uring") return EngineKind::kUring;
  if (name == "aio" || name == "libaio") return EngineKind::kAio;
  if (name == "posix" || name == "psync") return EngineKind::kPosix;
  return InvalidArgument(fmt::format("unknown I/O engine '{}': expected uring, aio, posix or auto",
                                     name));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return InvalidArgument(fmt::format("queue_depth {} out of range: expected 1..4096",
                                       options.queue_depth));
  }
  if (options.block_size == 0 || options.block_size > (1u << 30)) {
    return InvalidArgument(fmt::format("block_size {} out of range: expected 1 byte..1 GiB",
                                       options.block_size));
  }
  BackendOptions bo{options.queue_depth, options.posix_threads};
  switch (options.kind) {
    case EngineKind::kUring: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakeUringBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kAio: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakeAioBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kPosix: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakePosixBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kAuto: break;
  }
  std::string why;
  const char* env = std::getenv("ZINF_IO_DISABLE_URING");
  bool env_off = env != nullptr && std::string_view(env) != "" && std::string_view(env) != "0";
  if (!options.allow_uring || env_off) {
    why = env_off ? "io_uring disabled by ZINF_IO_DISABLE_URING" : "io_uring disabled by config";
  } else {
    auto u = MakeUringBackend(bo);
    if (u.ok()) {
      InfoOnce("io.engine.uring", "io: engine uring (io_uring)");
      return WithBackend(std::move(u).value(), options);
    }
    why = "io_uring refused: " + u.status().message() + UringDisabledHint();
  }
  auto a = MakeAioBackend(bo);
  if (a.ok()) {
    WarnOnce("io.engine.aio", "io: engine aio (libaio); " + why);
    auto e = WithBackend(std::move(a).value(), options);
    e->fallback_reason_ = why;
    return e;
  }
  why += "; libaio refused: " + a.status().message();
  ZINF_ASSIGN_OR_RETURN(auto p, MakePosixBackend(bo));
  WarnOnce("io.engine.posix", "io: engine posix (pread/pwrite threads); " + why);
  auto e = WithBackend(std::move(p), options);
  e->fallback_reason_ = why;
  return e;
}

std::unique_ptr<Engine> Engine::WithBackend(std::unique_ptr<Backend> backend,
                                            const EngineOptions& options) {
  return std::unique_ptr<Engine>(new Engine(std::move(backend), options));
}

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

Result<Engine::Op*> Engine::Enqueue(const Request& r, Callback cb) {
  ZINF_RETURN_IF_ERROR(Validate(r));
  auto op = std::make_unique<Op>();
  op->id = next_ticket_++;
  op->req = r;
  op->cb = std::move(cb);
  Op* raw = op.get();
  ops_.emplace(raw->id, std::move(op));
  pending_.push_back(raw);
  work_cv_.notify_one();
  Pump();
  if (tls_in_callbacks != this) {
    Status s = FlushLocked();
    if (!s.ok()) Log().error("io: {} submit failed: {}", backend_->Name(), s.ToString());
  }
  return raw;
}

Result<Ticket> Engine::Submit(const Request& request) {
  std::lock_guard lock(mu_);
  ZINF_ASSIGN_OR_RETURN(Op * op, Enqueue(request, nullptr));
  return op->id;
}

Status Engine::Submit(const Request& request, Callback done) {
  if (!done) return InvalidArgument("Submit: empty callback");
  std::lock_guard lock(mu_);
  ZINF_ASSIGN_OR_RETURN(Op * op, Enqueue(request, std::move(done)));
  (void)op;
  return Status::Ok();
}

void Engine::Pump() {
  while (!free_slots_.empty() && !pending_.empty()) {
    Op* op = pending_.front();
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
    if (op->cut == op->req.len) pending_.pop_front();
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

Status Engine::FlushLocked() {
  if (!prepared_unflushed_) return Status::Ok();
  prepared_unflushed_ = false;
  return backend_->Flush();
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
    auto it = std::find(pending_.begin(), pending_.end(), op);
    if (it != pending_.end()) pending_.erase(it);
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
    to_notify_.push_back(std::move(it->second));
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
  if (reaping_) {
    // Another thread is in the backend's Wait; its reap will wake us.
    if (block) cv_.wait(lock);
    return size_t{0};
  }
  Status flushed = FlushLocked();
  if (!flushed.ok()) return flushed;
  if (pieces_in_flight_ > 0) {
    reaping_ = true;
    lock.unlock();
    Result<size_t> got = backend_->Wait(raw_, block ? 1 : 0);
    lock.lock();
    reaping_ = false;
    if (!got.ok()) {
      cv_.notify_all();
      return got.status().WithContext(fmt::format("io: {} reaping", backend_->Name()));
    }
    for (size_t i = 0; i < *got; ++i) OnRaw(raw_[i]);
    Pump();
  }
  if (to_notify_.empty()) {
    cv_.notify_all();
    return size_t{0};
  }
  std::vector<std::unique_ptr<Op>> done;
  done.swap(to_notify_);
  size_t finished = done.size();
  bool any_callbacks = false;
  for (auto& op : done) {
    if (!op->cb) finished_.emplace(op->id, op->status);
    else any_callbacks = true;
  }
  Status s = FlushLocked();
  cv_.notify_all();
  if (any_callbacks) {
    lock.unlock();
    tls_in_callbacks = this;
    for (auto& op : done) {
      if (op->cb) op->cb(op->status);
    }
    tls_in_callbacks = nullptr;
    done.clear();
    lock.lock();
    Status s2 = FlushLocked();
    if (s.ok()) s = s2;
  }
  if (!s.ok()) return s;
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
