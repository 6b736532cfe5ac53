#include "src/comm/local_transport.h"

#include <chrono>
#include <cstring>

#include <fmt/format.h>

namespace zinf::comm {

class LocalTransport final : public Transport {
 public:
  LocalTransport(LocalGroup& g, int rank) : group_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override { return group_.world_; }
  std::string Describe() const override {
    return group_.world_ == 1 ? "single rank" : fmt::format("local threads ({})", group_.world_);
  }

  Status Post(uint64_t tag, std::span<const SendOp> sends,
              std::span<const RecvOp> recvs) override {
    {
      std::lock_guard<std::mutex> lock(group_.mu_);
      if (group_.dead_[size_t(rank_)])
        return Status(StatusCode::kUnavailable, fmt::format("rank {} was killed", rank_));
      for (const SendOp& s : sends) {
        if (group_.dead_[size_t(s.peer)])
          return Status(StatusCode::kUnavailable,
                        fmt::format("rank {}: rank {} closed its connection (dead?)", rank_,
                                    s.peer));
        const auto* b = static_cast<const uint8_t*>(s.data);
        group_.mail_[{s.peer, rank_, tag}] = std::vector<uint8_t>(b, b + s.bytes);
      }
    }
    group_.cv_.notify_all();
    auto& pending = pending_[tag];
    pending.insert(pending.end(), recvs.begin(), recvs.end());
    return Status::Ok();
  }

  Status Wait(uint64_t tag, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto node = pending_.extract(tag);
    if (node.empty()) return Status::Ok();
    std::unique_lock<std::mutex> lock(group_.mu_);
    for (const RecvOp& r : node.mapped()) {
      const LocalGroup::Key key{rank_, r.peer, tag};
      for (;;) {
        auto it = group_.mail_.find(key);
        if (it != group_.mail_.end()) {
          if (it->second.size() != r.bytes)
            return Internal(fmt::format("rank {}: rank {} sent {} bytes where {} were expected",
                                        rank_, r.peer, it->second.size(), r.bytes));
          if (r.bytes > 0) std::memcpy(r.data, it->second.data(), r.bytes);
          group_.mail_.erase(it);
          break;
        }
        if (group_.dead_[size_t(r.peer)] || group_.dead_[size_t(rank_)])
          return Status(StatusCode::kUnavailable,
                        fmt::format("rank {}: rank {} closed its connection (dead?)", rank_,
                                    r.peer));
        if (group_.cv_.wait_until(lock, deadline) == std::cv_status::timeout &&
            group_.mail_.count(key) == 0) {
          return Aborted(fmt::format("rank {}: no answer from rank {} within {} s (stuck or "
                                     "issuing other collectives?)",
                                     rank_, r.peer, double(timeout.count()) / 1000.0));
        }
      }
    }
    return Status::Ok();
  }

  void Cancel() override { pending_.clear(); }

 private:
  LocalGroup& group_;
  int rank_;
  std::map<uint64_t, std::vector<RecvOp>> pending_;  // posted receives by tag
};

LocalGroup::LocalGroup(int world) : world_(world < 1 ? 1 : world), dead_(size_t(world_), 0) {}

std::unique_ptr<Transport> LocalGroup::Join(int rank) {
  return std::make_unique<LocalTransport>(*this, rank);
}

void LocalGroup::Kill(int rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dead_[size_t(rank)] = 1;
  }
  cv_.notify_all();
}

}  // namespace zinf::comm
