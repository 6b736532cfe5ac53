// libaio backend: io_submit batches, io_getevents batches. What DeepSpeed's aio uses.
#include <libaio.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "io/backend.h"

namespace zinf::io {
namespace {

class AioBackend final : public Backend {
 public:
  ~AioBackend() override {
    if (ctx_ != nullptr) io_destroy(ctx_);
  }

  static Result<std::unique_ptr<Backend>> Make(const BackendOptions& options) {
    auto b = std::unique_ptr<AioBackend>(new AioBackend());
    unsigned depth = std::max(options.queue_depth, 1u);
    int rc = io_setup(static_cast<int>(depth), &b->ctx_);
    if (rc < 0) {
      b->ctx_ = nullptr;
      return Status::FromErrno(-rc, fmt::format(
          "io_setup (queue depth {}; see /proc/sys/fs/aio-max-nr)", depth));
    }
    b->iocbs_.resize(depth);
    b->free_.reserve(depth);
    for (auto& cb : b->iocbs_) b->free_.push_back(&cb);
    b->events_.resize(depth);
    return std::unique_ptr<Backend>(std::move(b));
  }

  std::string_view Name() const override { return "aio"; }

  Status Prepare(const Piece& p) override {
    std::lock_guard lock(mu_);
    if (free_.empty()) return Internal("aio: more pieces prepared than the queue depth");
    iocb* cb = free_.back();
    free_.pop_back();
    if (p.op == OpKind::kRead) io_prep_pread(cb, p.fd, p.buf, p.len, static_cast<long long>(p.offset));
    else io_prep_pwrite(cb, p.fd, p.buf, p.len, static_cast<long long>(p.offset));
    cb->data = reinterpret_cast<void*>(p.tag);
    pending_.push_back(cb);
    return Status::Ok();
  }

  // io_submit until everything queued is taken. No retry of a transient refusal here
  // (EAGAIN: the kernel is short of resources, EINTR): it goes back to the Engine, which backs
  // off without its lock held and reaps completions meanwhile.
  Status Flush() override {
    std::lock_guard lock(mu_);
    size_t done = 0;
    Status status;
    while (done < pending_.size()) {
      const size_t queued = pending_.size() - done;
      SubmitFault f = rule_ ? rule_(static_cast<unsigned>(queued)) : SubmitFault{};
      int rc;
      if (f.kind == SubmitFault::kErrno) {
        rc = -f.err;
      } else {
        size_t n = f.kind == SubmitFault::kTake ? std::clamp<size_t>(f.take, 1, queued) : queued;
        rc = io_submit(ctx_, static_cast<long>(n), pending_.data() + done);
      }
      if (rc == 0) rc = -EAGAIN;
      if (rc < 0 && IsTransientSubmitErrno(-rc)) {
        status = Status::FromErrno(-rc, fmt::format("io_submit ({} queued)", queued));
        break;
      }
      if (rc < 0) {
        // The first iocb was refused (EBADF, EINVAL...): it completes with that error, so that
        // every piece handed over still gets exactly one completion, and the rest go on.
        iocb* cb = pending_[done++];
        refused_.push_back({reinterpret_cast<uint64_t>(cb->data), rc});
        free_.push_back(cb);
        continue;
      }
      done += static_cast<size_t>(rc);
      inflight_ += static_cast<size_t>(rc);
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(done));
    return status;
  }

  std::vector<uint64_t> Withdraw() override {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> tags;
    for (iocb* cb : pending_) {
      tags.push_back(reinterpret_cast<uint64_t>(cb->data));
      free_.push_back(cb);
    }
    pending_.clear();
    return tags;
  }

  bool SetSubmitRule(SubmitRule rule) override {
    std::lock_guard lock(mu_);
    rule_ = std::move(rule);
    return true;
  }

  Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) override {
    size_t got = 0;
    long min;
    {
      std::lock_guard lock(mu_);
      while (!refused_.empty() && got < out.size()) {
        out[got++] = refused_.back();
        refused_.pop_back();
      }
      min_complete = min_complete > got ? min_complete - got : 0;
      min = static_cast<long>(std::min<size_t>(min_complete, inflight_));
    }
    out = out.subspan(got);
    long max = static_cast<long>(std::min(out.size(), events_.size()));
    if (max == 0) return got;
    int rc;
    timespec zero{0, 0};
    do {
      rc = io_getevents(ctx_, min, max, events_.data(), min > 0 ? nullptr : &zero);
    } while (rc == -EINTR);
    if (rc < 0) return Status::FromErrno(-rc, "io_getevents");
    std::lock_guard lock(mu_);
    for (int i = 0; i < rc; ++i) {
      iocb* cb = events_[i].obj;
      out[i].tag = reinterpret_cast<uint64_t>(cb->data);
      // res holds bytes or -errno (a long stored in libaio's unsigned field).
      out[i].result = static_cast<int64_t>(static_cast<long>(events_[i].res));
      free_.push_back(cb);
    }
    inflight_ -= static_cast<size_t>(rc);
    return got + static_cast<size_t>(rc);
  }

 private:
  AioBackend() = default;

  std::mutex mu_;  // guards free_, pending_, refused_, inflight_, rule_; never held in io_getevents
  io_context_t ctx_ = nullptr;
  std::vector<iocb> iocbs_;
  std::vector<iocb*> free_;
  std::vector<iocb*> pending_;
  std::vector<RawCompletion> refused_;  // pieces io_submit refused, reported by the next Wait
  std::vector<io_event> events_;
  size_t inflight_ = 0;
  SubmitRule rule_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeAioBackend(const BackendOptions& options) {
  return AioBackend::Make(options);
}

}  // namespace zinf::io
