// posix backend: worker threads doing blocking pread/pwrite. Works everywhere; the fallback
// when io_uring and libaio are refused. Dedicated threads rather than a TBB arena because each
// task blocks in the kernel for the whole transfer, which would starve TBB's compute workers.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "io/backend.h"

namespace zinf::io {
namespace {

class PosixBackend final : public Backend {
 public:
  explicit PosixBackend(unsigned threads) {
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~PosixBackend() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::string_view Name() const override { return "posix"; }

  Status Prepare(const Piece& p) override {
    std::lock_guard lock(mu_);
    staged_.push_back(p);
    return Status::Ok();
  }

  // Hands the staged pieces to the workers (the "kernel" of this backend, which never refuses
  // unless a test's submit rule says so).
  Status Flush() override {
    size_t handed = 0;
    Status status;
    {
      std::lock_guard lock(mu_);
      while (!staged_.empty()) {
        const unsigned queued = static_cast<unsigned>(staged_.size());
        SubmitFault f = rule_ ? rule_(queued) : SubmitFault{};
        if (f.kind == SubmitFault::kErrno) {
          status = Status::FromErrno(f.err, fmt::format("posix submit ({} queued)", queued));
          break;
        }
        size_t n = f.kind == SubmitFault::kTake ? std::clamp(f.take, 1u, queued) : queued;
        work_.insert(work_.end(), staged_.begin(), staged_.begin() + static_cast<long>(n));
        staged_.erase(staged_.begin(), staged_.begin() + static_cast<long>(n));
        handed += n;
      }
    }
    if (handed > 0) work_cv_.notify_all();
    return status;
  }

  std::vector<uint64_t> Withdraw() override {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> tags;
    for (const Piece& p : staged_) tags.push_back(p.tag);
    staged_.clear();
    return tags;
  }

  bool SetSubmitRule(SubmitRule rule) override {
    std::lock_guard lock(mu_);
    rule_ = std::move(rule);
    return true;
  }

  Result<size_t> Wait(std::span<RawCompletion> out, size_t min_complete) override {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return done_.size() >= min_complete; });
    size_t n = std::min(out.size(), done_.size());
    for (size_t i = 0; i < n; ++i) {
      out[i] = done_.front();
      done_.pop_front();
    }
    return n;
  }

 private:
  void WorkerLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      work_cv_.wait(lock, [&] { return stop_ || !work_.empty(); });
      if (stop_ && work_.empty()) return;
      Piece p = work_.front();
      work_.pop_front();
      lock.unlock();
      ssize_t rc = p.op == OpKind::kRead
                       ? ::pread(p.fd, p.buf, p.len, static_cast<off_t>(p.offset))
                       : ::pwrite(p.fd, p.buf, p.len, static_cast<off_t>(p.offset));
      RawCompletion c{p.tag, rc < 0 ? -static_cast<int64_t>(errno) : static_cast<int64_t>(rc)};
      lock.lock();
      done_.push_back(c);
      done_cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<Piece> staged_;  // prepared, not yet flushed
  std::deque<Piece> work_;    // handed to the workers
  std::deque<RawCompletion> done_;
  bool stop_ = false;
  SubmitRule rule_;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakePosixBackend(const BackendOptions& options) {
  unsigned threads = options.posix_threads ? options.posix_threads
                                           : std::max(options.queue_depth, 1u);
  return std::unique_ptr<Backend>(new PosixBackend(threads));
}

}  // namespace zinf::io
