// src/comm/tcp_store.h — a small key-value store over TCP for the ranks' rendezvous: rank 0
// serves it on MASTER_ADDR:MASTER_PORT, every rank (rank 0 included) is a client. Gloo's
// addresses and, on GPUs, NCCL's unique id travel through it. (PyTorch's TCPStore plays this
// part for torchrun; Gloo itself ships only file, hash and Redis stores.)
//
// Contract:
// - TcpStoreServer::Start binds host:port (port 0: any free port, see port()) and serves until
//   destroyed. A port already in use is refused (AlreadyExists naming the address and port).
// - TcpStoreClient::Connect retries until `timeout` (rank 0 may start after the others) and then
//   fails with Unavailable naming the address. Set stores a value; Get waits up to `timeout` for
//   a key (Aborted naming the key when it never comes); Claim stores a value only if the key is
//   absent and says whether it did (two processes claiming the same rank is caught this way);
//   when the claiming client's connection closes (its process ended or died) the server sets
//   "<key>/closed", so that the others can tell a dead rank from a slow one. Has says whether a
//   key is set, without waiting.
// Keys and values are bytes; a value is at most 64 MiB, a key 4 KiB.
//
// Thread-safety: the server is internally synchronized (a thread per connection); a client is
// used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "zinf/status.h"

namespace zinf::comm {

class TcpStoreServer {
 public:
  static Result<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, uint16_t port);
  ~TcpStoreServer();
  uint16_t port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void Accept();
  void Serve(int fd);

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;  // GUARDED_BY(mu_)
  std::vector<int> clients_;                          // GUARDED_BY(mu_)
  std::vector<std::thread> servers_;                  // GUARDED_BY(mu_)
};

class TcpStoreClient {
 public:
  static Result<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host, uint16_t port,
                                                         std::chrono::milliseconds timeout);
  ~TcpStoreClient();
  Status Set(const std::string& key, const std::vector<uint8_t>& value);
  Result<std::vector<uint8_t>> Get(const std::string& key, std::chrono::milliseconds timeout);
  Result<bool> Claim(const std::string& key, const std::vector<uint8_t>& value);
  Result<bool> Has(const std::string& key);
  std::string address() const;

 private:
  TcpStoreClient() = default;
  Status Request(uint8_t op, const std::string& key, const std::vector<uint8_t>* value,
                 uint32_t timeout_ms, uint8_t* reply, std::vector<uint8_t>* out);
  int fd_ = -1;
  std::string host_;
  uint16_t port_ = 0;
};

}  // namespace zinf::comm
