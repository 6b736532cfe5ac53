// io_uring backend: batched SQEs, fixed files and fixed buffers, batched CQE reaping.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include <fmt/format.h>

#include "io/backend.h"

namespace zinf::io {
namespace {

// Fixed-file table size: sparse, filled as files are added.
constexpr unsigned kFixedFileSlots = 256;

class UringBackend final : public Backend {
 public:
  ~UringBackend() override {
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }

  static Result<std::unique_ptr<Backend>> Make(const BackendOptions& options) {
    auto b = std::unique_ptr<UringBackend>(new UringBackend());
    // SQ sized to the queue depth; CQ twice that so resubmissions never overflow it.
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = 2 * std::max(options.queue_depth, 1u);
    int rc = io_uring_queue_init_params(std::max(options.queue_depth, 1u), &b->ring_, &params);
    if (rc < 0) {
      return Status::FromErrno(-rc, fmt::format("io_uring_setup (queue depth {})",
                                                options.queue_depth));
    }
    b->ring_ok_ = true;
    rc = io_uring_register_files_sparse(&b->ring_, kFixedFileSlots);
    b->fixed_files_ = rc == 0;
    b->slot_used_.assign(kFixedFileSlots, false);
    return std::unique_ptr<Backend>(std::move(b));
  }

  std::string_view Name() const override { return "uring"; }

  int AddFile(int fd) override {
    if (!fixed_files_) return -1;
    for (unsigned i = 0; i < kFixedFileSlots; ++i) {
      if (slot_used_[i]) continue;
      if (io_uring_register_files_update(&ring_, i, &fd, 1) != 1) return -1;
      slot_used_[i] = true;
      return static_cast<int>(i);
    }
    return -1;
  }

  void RemoveFile(int slot) override {
    if (slot < 0 || !fixed_files_) return;
    int none = -1;
    io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &none, 1);
    slot_used_[slot] = false;
  }

  Status RegisterBuffers(std::span<const iovec> buffers) override {
    if (buffers_registered_) io_uring_unregister_buffers(&ring_);
    buffers_registered_ = false;
    if (buffers.empty()) return Status::Ok();
    int rc = io_uring_register_buffers(&ring_, buffers.data(),
                                       static_cast<unsigned>(buffers.size()));
    if (rc < 0) {
      return Status::FromErrno(-rc, fmt::format("io_uring_register_buffers ({} buffers)",
                                                buffers.size()));
    }
    buffers_registered_ = true;
    return Status::Ok();
  }

  Status Prepare(const Piece& p) override {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // The engine keeps at most queue_depth pieces and the SQ holds at least that many.
      return Internal(fmt::format("io_uring submission queue full ({} entries queued): more "
                                  "pieces prepared than the queue depth",
                                  io_uring_sq_ready(&ring_)));
    }
    int fd = p.fixed_file >= 0 ? p.fixed_file : p.fd;
    bool fixed_buf = p.buf_index >= 0 && buffers_registered_;
    if (p.op == OpKind::kRead) {
      if (fixed_buf) io_uring_prep_read_fixed(sqe, fd, p.buf, p.len, p.offset, p.buf_index);
      else io_uring_prep_read(sqe, fd, p.buf, p.len, p.offset);
    } else {
      if (fixed_buf) io_uring_prep_write_fixed(sqe, fd, p.buf, p.len, p.offset, p.buf_index);
      else io_uring_prep_write(sqe, fd, p.buf, p.len, p.offset);
    }
    if (p.fixed_file >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data64(sqe, p.tag);
    return Status::Ok();
  }

  // One io_uring_enter per attempt, no retry here: a transient refusal (EAGAIN, EBUSY, EINTR)
  // goes back to the Engine, which backs off without its lock held and reaps completions
  // meanwhile (what frees the kernel's memory or completion queue).
  Status Flush() override {
    while (true) {
      const unsigned queued = PublishTail();
      if (queued == 0) return Status::Ok();
      SubmitFault f = rule_ ? rule_(queued) : SubmitFault{};
      int rc;
      if (f.kind == SubmitFault::kErrno) {
        rc = -f.err;
      } else {
        unsigned n = f.kind == SubmitFault::kTake ? std::clamp(f.take, 1u, queued) : queued;
        unsigned flags = io_uring_cq_has_overflow(&ring_) ? IORING_ENTER_GETEVENTS : 0;
        rc = io_uring_enter(static_cast<unsigned>(ring_.ring_fd), n, 0, flags, nullptr);
      }
      if (rc < 0) {
        return Status::FromErrno(-rc, fmt::format("io_uring_enter (submit {} queued)", queued));
      }
      if (rc == 0) {
        return Status::FromErrno(EAGAIN, fmt::format("io_uring_enter took none of {} queued",
                                                     queued));
      }
    }
  }

  // Without SQPOLL the kernel reads the SQ only inside io_uring_enter with to_submit > 0, which
  // only Flush calls (Wait enters with to_submit 0): entries between the kernel's head and our
  // tail are not taken and never will be once the tail is moved back to the head.
  std::vector<uint64_t> Withdraw() override {
    io_uring_sq& sq = ring_.sq;
    const unsigned head = io_uring_smp_load_acquire(sq.khead);
    std::vector<uint64_t> tags;
    for (unsigned i = head; i != sq.sqe_tail; ++i) {
      // The SQE the kernel would run for entry i (liburing keeps the index array the identity).
      tags.push_back(sq.sqes[sq.array[i & sq.ring_mask]].user_data);
    }
    sq.sqe_head = sq.sqe_tail = head;
    io_uring_smp_store_release(sq.ktail, head);
    return tags;
  }

  bool SetSubmitRule(SubmitRule rule) override {
    rule_ = std::move(rule);
    return true;
  }

  Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) override {
    io_uring_cqe* cqe = nullptr;
    if (min_complete > 0) {
      int rc;
      do {
        rc = io_uring_wait_cqe_nr(&ring_, &cqe, static_cast<unsigned>(min_complete));
      } while (rc == -EINTR || rc == -EAGAIN);
      if (rc < 0) return Status::FromErrno(-rc, "io_uring_wait_cqe");
    }
    // Reap everything that is there in one batch.
    std::vector<io_uring_cqe*>& batch = batch_;
    batch.resize(out.size());
    unsigned n = io_uring_peek_batch_cqe(&ring_, batch.data(), static_cast<unsigned>(out.size()));
    for (unsigned i = 0; i < n; ++i) {
      out[i].tag = io_uring_cqe_get_data64(batch[i]);
      out[i].result = batch[i]->res;
    }
    io_uring_cq_advance(&ring_, n);
    return static_cast<size_t>(n);
  }

 private:
  UringBackend() = default;

  // Makes every prepared SQE visible to the kernel (what io_uring_submit does before entering)
  // and returns how many it has not taken yet.
  unsigned PublishTail() {
    io_uring_sq& sq = ring_.sq;
    if (sq.sqe_head != sq.sqe_tail) {
      sq.sqe_head = sq.sqe_tail;
      io_uring_smp_store_release(sq.ktail, sq.sqe_tail);
    }
    return sq.sqe_tail - io_uring_smp_load_acquire(sq.khead);
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  bool fixed_files_ = false;
  bool buffers_registered_ = false;
  SubmitRule rule_;
  std::vector<bool> slot_used_;
  std::vector<io_uring_cqe*> batch_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeUringBackend(const BackendOptions& options) {
  return UringBackend::Make(options);
}

}  // namespace zinf::io
