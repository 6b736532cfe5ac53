#include "src/comm/gloo_transport.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include "src/comm/tcp_store.h"

namespace zinf::comm {
namespace {

using Ms = std::chrono::milliseconds;

// Gloo's Store interface over the TCP store; Gloo wants exceptions.
class GlooTcpStore final : public gloo::rendezvous::Store {
 public:
  GlooTcpStore(TcpStoreClient& c, Ms timeout) : client_(c), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = client_.Set(key, std::vector<uint8_t>(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(s.message());
  }
  std::vector<char> get(const std::string& key) override {
    auto v = client_.Get(key, timeout_);
    if (!v.ok()) throw std::runtime_error(v.status().message());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Ms& timeout) override {
    for (const auto& k : keys) {
      auto v = client_.Get(k, timeout);
      if (!v.ok()) throw std::runtime_error(v.status().message());
    }
  }

 private:
  TcpStoreClient& client_;
  Ms timeout_;
};

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

class GlooTransport final : public Transport {
 public:
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string Describe() const override { return describe_; }

  Status Post(uint64_t tag, std::span<const SendOp> sends,
              std::span<const RecvOp> recvs) override {
    Pending& p = pending_[tag];
    int peer = -1;
    const char* what = "";
    try {
      for (const RecvOp& r : recvs) {
        if (r.bytes == 0) continue;
        peer = r.peer;
        what = "posting a receive from";
        p.recvs.push_back({r.peer, context_->createUnboundBuffer(r.data, r.bytes)});
        p.recvs.back().second->recv(r.peer, tag, 0, r.bytes);
      }
      for (const SendOp& s : sends) {
        if (s.bytes == 0) continue;
        peer = s.peer;
        what = "sending to";
        p.sends.push_back(
            {s.peer, context_->createUnboundBuffer(const_cast<void*>(s.data), s.bytes)});
        p.sends.back().second->send(s.peer, tag, 0, s.bytes);
      }
    } catch (const std::exception& e) {
      return Failed(peer, what, e, Ms(0));
    }
    return Status::Ok();
  }

  // Waits for each transfer with the time left. Gloo's TCP pairs do not fail a pending receive
  // when the peer's process dies, and a Gloo wait that times out closes every pair: so the wait
  // is never cut into slices; a watchdog thread asks the store every second whether the peer
  // being waited for closed its connection to it (its process ended), and aborts the wait if so.
  Status Wait(uint64_t tag, Ms timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto node = pending_.extract(tag);
    if (node.empty()) return Status::Ok();
    Pending& p = node.mapped();
    auto wait_one = [&](int who, gloo::transport::UnboundBuffer& b, bool recv) -> Status {
      const char* what = recv ? "receiving from" : "sending to";
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        watched_ = &b;
        watched_recv_ = recv;
        watched_peer_ = who;
      }
      bool done = false;
      Status failed;
      try {
        done = recv ? b.waitRecv(nullptr, Left(deadline)) : b.waitSend(nullptr, Left(deadline));
      } catch (const std::exception& e) {
        failed = Failed(who, what, e, timeout);
      }
      int dead = -1;
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        watched_ = nullptr;
        dead = std::exchange(dead_peer_, -1);
      }
      if (!failed.ok()) return failed;
      if (done) return Status::Ok();
      if (dead >= 0)
        return Status(StatusCode::kUnavailable,
                      fmt::format("rank {}: the connection with rank {} failed while {} it: rank "
                                  "{} exited or died (its store connection closed)",
                                  Global(rank_), Global(who), what, Global(who)));
      return Aborted(fmt::format("rank {}: the transfer with rank {} was aborted", Global(rank_),
                                 Global(who)));
    };
    for (auto& [from, buf] : p.recvs) ZINF_RETURN_IF_ERROR(wait_one(from, *buf, true));
    for (auto& [to, buf] : p.sends) ZINF_RETURN_IF_ERROR(wait_one(to, *buf, false));
    return Status::Ok();
  }

  // The watchdog: every second, whether the rank being waited for has closed its store
  // connection (or rank 0's store is gone): then the wait is aborted (it returns false).
  void StartWatchdog() {
    if (client_ == nullptr) return;  // the file store cannot tell
    watchdog_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(watch_mu_);
      while (!stopping_) {
        watch_cv_.wait_for(lock, Ms(1000), [&] { return stopping_; });
        if (stopping_ || watched_ == nullptr) continue;
        const int peer = watched_peer_;
        lock.unlock();
        auto gone = PeerGone(peer);
        const bool dead = !gone.ok() || *gone;  // no store: rank 0 is gone
        lock.lock();
        if (dead && watched_ != nullptr && watched_peer_ == peer) {
          dead_peer_ = peer;
          if (watched_recv_) {
            watched_->abortWaitRecv();
          } else {
            watched_->abortWaitSend();
          }
        }
      }
    });
  }

  ~GlooTransport() override {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      stopping_ = true;
    }
    watch_cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    pending_.clear();
  }

  // The pairs are closed first: a peer's data for a step still posted then never arrives at a
  // receive whose buffer is gone (Gloo would abort the process), and nothing lands after this.
  void Cancel() override {
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
    }
    pending_.clear();
  }

  // The store keeps "<prefix>/rank/<r>/closed" once rank r's claiming connection closed; a
  // store that cannot be reached is an error (rank 0 gone). The watchdog only asks during a Wait.
  Result<bool> PeerGone(int peer) override {
    if (client_ == nullptr) return false;  // the file store cannot tell
    return client_->Has(fmt::format("{}/rank/{}/closed", prefix_, Global(peer)));
  }

  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::unique_ptr<gloo::rendezvous::Store> base_store_;  // the TCP or file store
  std::unique_ptr<gloo::rendezvous::Store> store_;       // base_store_ under the job's prefix
  std::shared_ptr<gloo::rendezvous::Context> context_;
  int rank_ = 0, world_ = 1;
  // A group's ranks in the world (rank_ and the peers are the group's); empty: the world.
  std::vector<int> members_;
  std::string describe_;
  std::string prefix_;  // the job's keys in the store

  // The watchdog's view of the wait in progress.
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  gloo::transport::UnboundBuffer* watched_ = nullptr;  // GUARDED_BY(watch_mu_)
  bool watched_recv_ = false;                          // GUARDED_BY(watch_mu_)
  int watched_peer_ = -1;                              // GUARDED_BY(watch_mu_)
  int dead_peer_ = -1;                                 // GUARDED_BY(watch_mu_)
  bool stopping_ = false;                              // GUARDED_BY(watch_mu_)
  std::thread watchdog_;

 private:
  using Buf = std::unique_ptr<gloo::transport::UnboundBuffer>;
  struct Pending {
    std::vector<std::pair<int, Buf>> recvs, sends;  // (peer, buffer)
  };
  std::map<uint64_t, Pending> pending_;  // posted steps by tag

  int Global(int r) const { return members_.empty() ? r : members_[static_cast<size_t>(r)]; }
  static Ms Left(std::chrono::steady_clock::time_point deadline) {
    return std::max(Ms(1), std::chrono::duration_cast<Ms>(deadline -
                                                          std::chrono::steady_clock::now()));
  }
  Status Failed(int peer, const char* what, const std::exception& e, Ms timeout) const {
    const std::string msg = e.what();
    if (msg.find("imed out") != std::string::npos)
      return Aborted(fmt::format("rank {}: no answer from rank {} within {} s while {} it "
                                 "(stuck, or issuing other collectives?): {}",
                                 Global(rank_), Global(peer), double(timeout.count()) / 1000.0,
                                 what, msg));
    return Status(StatusCode::kUnavailable,
                  fmt::format("rank {}: the connection with rank {} failed while {} it (rank {} "
                              "dead?): {}",
                              Global(rank_), Global(peer), what, Global(peer), msg));
  }
};

void ConnectMesh(const WorldEnv& env, Ms timeout, const std::string& prefix,
                 const std::string& mesh_prefix, int rank, int size, GlooTransport& t);

Status Rendezvous(const WorldEnv& env, Ms timeout, GlooTransport& t) {
  const std::string prefix = fmt::format("zinf/{}", env.run_id.empty() ? "job" : env.run_id);
  std::unique_ptr<gloo::rendezvous::Store>& base = t.base_store_;
  if (env.store_dir.empty()) {
    if (env.rank == 0) {
      ZINF_ASSIGN_OR_RETURN(t.server_, TcpStoreServer::Start(env.master_addr, env.master_port));
    }
    ZINF_ASSIGN_OR_RETURN(t.client_,
                          TcpStoreClient::Connect(env.master_addr, env.master_port, timeout));
    const std::vector<uint8_t> me{uint8_t(env.rank & 0xff), uint8_t(env.rank >> 8)};
    ZINF_ASSIGN_OR_RETURN(bool claimed,
                          t.client_->Claim(fmt::format("{}/rank/{}", prefix, env.rank), me));
    if (!claimed)
      return FailedPrecondition(fmt::format(
          "RANK={} joined twice at {}: two processes were given the same RANK", env.rank,
          t.client_->address()));
    base = std::make_unique<GlooTcpStore>(*t.client_, timeout);
  } else {
    base = std::make_unique<gloo::rendezvous::FileStore>(env.store_dir);
  }
  // WORLD_SIZE must be rank 0's.
  const std::string world_key = prefix + "/world";
  if (env.rank == 0) {
    const std::string w = std::to_string(env.world);
    base->set(world_key, std::vector<char>(w.begin(), w.end()));
  } else {
    base->wait({world_key}, timeout);
    const auto v = base->get(world_key);
    const std::string theirs(v.begin(), v.end());
    if (theirs != std::to_string(env.world))
      return FailedPrecondition(fmt::format(
          "wrong world size: rank 0 runs WORLD_SIZE={}, rank {} was given WORLD_SIZE={}", theirs,
          env.rank, env.world));
  }
  ConnectMesh(env, timeout, prefix, prefix + "/gloo", env.rank, env.world, t);
  return Status::Ok();
}

// Gloo's full mesh of `size` ranks (this one `rank` among them) through the store's keys under
// `mesh_prefix`; the watchdog started.
void ConnectMesh(const WorldEnv& env, Ms timeout, const std::string& prefix,
                 const std::string& mesh_prefix, int rank, int size, GlooTransport& t) {
  t.store_ = std::make_unique<gloo::rendezvous::PrefixStore>(mesh_prefix, *t.base_store_);
  gloo::transport::tcp::attr attr;
  if (!env.socket_host.empty()) {
    attr.hostname = env.socket_host;
  } else if (IsLoopback(env.master_addr)) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {0};
    ::gethostname(host, sizeof(host) - 1);
    attr.hostname = host;
  }
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  t.context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
  t.context_->setTimeout(timeout);
  t.context_->connectFullMesh(*t.store_, dev);
  t.rank_ = rank;
  t.world_ = size;
  t.prefix_ = prefix;
  t.StartWatchdog();
  t.describe_ = fmt::format("gloo tcp {} ({} ranks)", attr.hostname, size);
}

// A group's mesh: its own store connection (no claim: the world's transport holds this rank's),
// its own keys.
Status RendezvousGroup(const WorldEnv& env, Ms timeout, const std::string& name,
                       std::span<const int> members, GlooTransport& t) {
  const std::string prefix = fmt::format("zinf/{}", env.run_id.empty() ? "job" : env.run_id);
  const auto me = std::find(members.begin(), members.end(), env.rank);
  if (me == members.end()) {
    return InvalidArgument(fmt::format("rank {} is not in the group {}", env.rank, name));
  }
  if (env.store_dir.empty()) {
    ZINF_ASSIGN_OR_RETURN(t.client_,
                          TcpStoreClient::Connect(env.master_addr, env.master_port, timeout));
    t.base_store_ = std::make_unique<GlooTcpStore>(*t.client_, timeout);
  } else {
    t.base_store_ = std::make_unique<gloo::rendezvous::FileStore>(env.store_dir);
  }
  t.members_.assign(members.begin(), members.end());
  ConnectMesh(env, timeout, prefix, prefix + "/gloo-" + name,
              static_cast<int>(me - members.begin()), static_cast<int>(members.size()), t);
  t.describe_ += " " + name;
  return Status::Ok();
}

}  // namespace

// Gloo writes to its sockets with write(2)/writev(2): a peer that died would end this process
// with SIGPIPE (exit 141, no message) instead of failing the collective with EPIPE, which the
// watchdog turns into an error naming the rank. Ignored once, unless someone installed a
// handler of their own (Python already ignores it).
void IgnoreSigpipe() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

Result<std::unique_ptr<Transport>> ConnectGloo(const WorldEnv& env, Ms timeout) {
  IgnoreSigpipe();
  auto t = std::make_unique<GlooTransport>();
  try {
    Status s = Rendezvous(env, timeout, *t);
    if (!s.ok()) return s.WithContext(fmt::format("rank {}: joining the world", env.rank));
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("rank {}: joining the world of {} through {}: {}", env.rank,
                              env.world, env.Describe(), e.what()));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

Result<std::unique_ptr<Transport>> ConnectGlooGroup(const WorldEnv& env, Ms timeout,
                                                    const std::string& name,
                                                    std::span<const int> members) {
  IgnoreSigpipe();
  auto t = std::make_unique<GlooTransport>();
  try {
    Status s = RendezvousGroup(env, timeout, name, members, *t);
    if (!s.ok()) return s.WithContext(fmt::format("rank {}: joining the group {}", env.rank, name));
  } catch (const std::exception& e) {
    return Status(StatusCode::kUnavailable,
                  fmt::format("rank {}: joining the group {} ({} ranks) through {}: {}", env.rank,
                              name, members.size(), env.Describe(), e.what()));
  }
  return std::unique_ptr<Transport>(std::move(t));
}

namespace {
gloo::rendezvous::Context& Ctx(Transport& t) { return *static_cast<GlooTransport&>(t).context_; }
std::shared_ptr<gloo::Context> Shared(Transport& t) {
  return static_cast<GlooTransport&>(t).context_;
}
Status Caught(const char* what, const std::exception& e) {
  return Status(StatusCode::kUnavailable, fmt::format("gloo {}: {}", what, e.what()));
}
}  // namespace

Status GlooRaw::AllReduce(Transport& t, float* buf, size_t count) {
  try {
    gloo::AllreduceOptions o(Shared(t));
    o.setOutput(buf, count);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(
        &gloo::sum<float>));
    gloo::allreduce(o);
  } catch (const std::exception& e) {
    return Caught("allreduce", e);
  }
  return Status::Ok();
}

Status GlooRaw::AllGather(Transport& t, const float* send, float* recv, size_t count) {
  try {
    gloo::AllgatherOptions o(Shared(t));
    o.setInput(const_cast<float*>(send), count);
    o.setOutput(recv, count * size_t(Ctx(t).size));
    gloo::allgather(o);
  } catch (const std::exception& e) {
    return Caught("allgather", e);
  }
  return Status::Ok();
}

Result<std::function<Status()>> GlooRaw::PrepareReduceScatter(Transport& t, float* buf,
                                                              size_t count_per_rank) {
  try {
    const int w = Ctx(t).size;
    const std::vector<int> recv(static_cast<size_t>(w), static_cast<int>(count_per_rank));
    const std::vector<float*> ptrs{buf};
    auto rs = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
        Shared(t), ptrs, int(count_per_rank) * w, recv);
    return std::function<Status()>([rs]() -> Status {
      try {
        rs->run();
      } catch (const std::exception& e) {
        return Caught("reduce-scatter", e);
      }
      return Status::Ok();
    });
  } catch (const std::exception& e) {
    return Caught("reduce-scatter set-up", e);
  }
}

}  // namespace zinf::comm
