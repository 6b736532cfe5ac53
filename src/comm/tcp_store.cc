#include "src/comm/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace zinf::comm {
namespace {

enum Op : uint8_t { kSet = 1, kGet = 2, kClaim = 3 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kExisted = 2 };
constexpr uint32_t kMaxKey = 4096;
constexpr uint64_t kMaxValue = uint64_t{64} << 20;

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= size_t(k);
  }
  return true;
}

Result<addrinfo*> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints,
                               &res);
  if (rc != 0)
    return InvalidArgument(fmt::format("cannot resolve the store address '{}' (MASTER_ADDR): {}",
                                       host, ::gai_strerror(rc)));
  return res;
}

}  // namespace

Result<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                              uint16_t port) {
  ZINF_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, true));
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  int last_errno = 0;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last_errno = errno;
      continue;
    }
    // A port left in TIME_WAIT by an earlier job is free; one another listener holds is not.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      s->listen_fd_ = fd;
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      s->port_ = ntohs(ss.ss_family == AF_INET6
                           ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
      break;
    }
    last_errno = errno;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (s->listen_fd_ < 0) {
    if (last_errno == EADDRINUSE)
      return Status(StatusCode::kAlreadyExists,
                    fmt::format("the rendezvous port {}:{} (MASTER_ADDR:MASTER_PORT) is in use: "
                                "another job holds it; choose another MASTER_PORT",
                                host, port),
                    last_errno);
    return Status::FromErrno(last_errno, fmt::format("listen on {}:{} (MASTER_ADDR:MASTER_PORT)",
                                                     host, port));
  }
  s->acceptor_ = std::thread([p = s.get()] { p->Accept(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  if (listen_fd_ < 0) return;  // never started
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::thread> servers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clients_) ::shutdown(fd, SHUT_RDWR);
    servers.swap(servers_);
  }
  cv_.notify_all();
  for (auto& t : servers) t.join();
}

void TcpStoreServer::Accept() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    clients_.push_back(fd);
    servers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  std::vector<std::string> claimed;  // keys this connection claimed
  for (;;) {
    uint8_t op = 0;
    uint32_t klen = 0;
    if (!ReadAll(fd, &op, 1) || !ReadAll(fd, &klen, 4) || klen > kMaxKey) break;
    std::string key(klen, '\0');
    if (!ReadAll(fd, key.data(), klen)) break;
    if (op == kSet || op == kClaim) {
      uint64_t vlen = 0;
      if (!ReadAll(fd, &vlen, 8) || vlen > kMaxValue) break;
      std::vector<uint8_t> v(vlen);
      if (vlen > 0 && !ReadAll(fd, v.data(), vlen)) break;
      uint8_t reply = kOk;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (op == kClaim && data_.count(key) != 0) {
          reply = kExisted;
        } else {
          data_[key] = std::move(v);
          if (op == kClaim) claimed.push_back(key);
        }
      }
      cv_.notify_all();
      if (!WriteAll(fd, &reply, 1)) break;
    } else if (op == kGet) {
      uint32_t timeout_ms = 0;
      if (!ReadAll(fd, &timeout_ms, 4)) break;
      std::vector<uint8_t> v;
      bool found = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        found = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                             [&] { return stopping_ || data_.count(key) != 0; }) &&
                data_.count(key) != 0;
        if (found) v = data_[key];
      }
      const uint8_t reply = found ? kOk : kTimeout;
      const uint64_t vlen = v.size();
      if (!WriteAll(fd, &reply, 1)) break;
      if (found && (!WriteAll(fd, &vlen, 8) || (vlen > 0 && !WriteAll(fd, v.data(), vlen))))
        break;
    } else {
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // The claimant's process is gone (or closed its client): say so under "<key>/closed".
  if (!stopping_)
    for (const auto& k : claimed) data_[k + "/closed"] = {};
  cv_.notify_all();
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (*it == fd) {
      clients_.erase(it);
      break;
    }
  }
  ::close(fd);
}

Result<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(
    const std::string& host, uint16_t port, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int last_errno = 0;
  for (;;) {
    ZINF_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, false));
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) {
        last_errno = errno;
        continue;
      }
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        ::freeaddrinfo(res);
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        std::unique_ptr<TcpStoreClient> c(new TcpStoreClient());
        c->fd_ = fd;
        c->host_ = host;
        c->port_ = port;
        return c;
      }
      last_errno = errno;
      ::close(fd);
    }
    ::freeaddrinfo(res);
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status(StatusCode::kUnavailable,
                fmt::format("no rendezvous store answered at {}:{} (MASTER_ADDR:MASTER_PORT) "
                            "within {} s: is rank 0 running? ({})",
                            host, port, double(timeout.count()) / 1000.0,
                            std::strerror(last_errno)),
                last_errno);
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::address() const { return fmt::format("{}:{}", host_, port_); }

Status TcpStoreClient::Request(uint8_t op, const std::string& key,
                               const std::vector<uint8_t>* value, uint32_t timeout_ms,
                               uint8_t* reply, std::vector<uint8_t>* out) {
  // A store that stops answering without closing (rank 0 stopped, a partition) fails the request
  // instead of hanging: the reply may take the Get's own wait plus a margin.
  const uint64_t limit_ms = uint64_t{timeout_ms} + 30000;
  timeval tv{static_cast<time_t>(limit_ms / 1000), static_cast<suseconds_t>(limit_ms % 1000 * 1000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const uint32_t klen = uint32_t(key.size());
  bool ok = WriteAll(fd_, &op, 1) && WriteAll(fd_, &klen, 4) && WriteAll(fd_, key.data(), klen);
  if (ok && value != nullptr) {
    const uint64_t vlen = value->size();
    ok = WriteAll(fd_, &vlen, 8) && (vlen == 0 || WriteAll(fd_, value->data(), vlen));
  }
  if (ok && op == kGet) ok = WriteAll(fd_, &timeout_ms, 4);
  ok = ok && ReadAll(fd_, reply, 1);
  if (ok && op == kGet && *reply == kOk) {
    uint64_t vlen = 0;
    ok = ReadAll(fd_, &vlen, 8) && vlen <= kMaxValue;
    if (ok) {
      out->resize(vlen);
      ok = vlen == 0 || ReadAll(fd_, out->data(), vlen);
    }
  }
  if (!ok)
    return Status(StatusCode::kUnavailable,
                  fmt::format("the rendezvous store at {} closed the connection or stopped "
                              "answering (rank 0 gone?) during a request for '{}'",
                              address(), key));
  return Status::Ok();
}

Status TcpStoreClient::Set(const std::string& key, const std::vector<uint8_t>& value) {
  if (key.size() > kMaxKey || value.size() > kMaxValue)
    return InvalidArgument(fmt::format("store key '{}' or its value too long", key));
  uint8_t reply = 0;
  return Request(kSet, key, &value, 0, &reply, nullptr);
}

Result<bool> TcpStoreClient::Claim(const std::string& key, const std::vector<uint8_t>& value) {
  if (key.size() > kMaxKey || value.size() > kMaxValue)
    return InvalidArgument(fmt::format("store key '{}' or its value too long", key));
  uint8_t reply = 0;
  ZINF_RETURN_IF_ERROR(Request(kClaim, key, &value, 0, &reply, nullptr));
  return reply == kOk;
}

Result<bool> TcpStoreClient::Has(const std::string& key) {
  if (key.size() > kMaxKey) return InvalidArgument(fmt::format("store key '{}' too long", key));
  uint8_t reply = 0;
  std::vector<uint8_t> out;
  ZINF_RETURN_IF_ERROR(Request(kGet, key, nullptr, 0, &reply, &out));
  return reply == kOk;
}

Result<std::vector<uint8_t>> TcpStoreClient::Get(const std::string& key,
                                                 std::chrono::milliseconds timeout) {
  if (key.size() > kMaxKey) return InvalidArgument(fmt::format("store key '{}' too long", key));
  uint8_t reply = 0;
  std::vector<uint8_t> out;
  const auto ms = uint32_t(std::min<int64_t>(timeout.count(), int64_t{0xffffffff}));
  ZINF_RETURN_IF_ERROR(Request(kGet, key, nullptr, ms, &reply, &out));
  if (reply != kOk)
    return Aborted(fmt::format("the rendezvous store at {} has no '{}' after {} s: a rank did "
                               "not join (fewer ranks running than WORLD_SIZE?)",
                               address(), key, double(timeout.count()) / 1000.0));
  return out;
}

}  // namespace zinf::comm
