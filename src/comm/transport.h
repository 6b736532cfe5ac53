// src/comm/transport.h — point-to-point messages between ranks: what a Communicator's
// collectives are built on (p2p_communicator.h), so each algorithm is written once and runs the
// same over threads (local_transport.h) and over Gloo's TCP pairs (gloo_transport.h).
//
// Contract: Exchange posts every send and receive of one step of a collective and returns when
// all of them completed. `tag` is the same on every rank for the same step and unique among the
// steps in flight; a receive from peer p matches p's send to this rank with the same tag, and its
// byte count must equal the send's (a mismatch is an error, never a silent truncation). A peer
// that closed its side fails the exchange with Unavailable naming the peer; one silent past
// `timeout` fails it with Aborted ("no answer from rank p within ..."). After a failure the
// transport may be unusable; the communicator does not use it again.
//
// Thread-safety: one Exchange at a time per transport (the communicator's thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "zinf/status.h"

namespace zinf::comm {

struct SendOp {
  int peer = 0;
  const void* data = nullptr;
  size_t bytes = 0;
};

struct RecvOp {
  int peer = 0;
  void* data = nullptr;
  size_t bytes = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual std::string Describe() const = 0;
  virtual Status Exchange(uint64_t tag, std::span<const SendOp> sends,
                          std::span<const RecvOp> recvs, std::chrono::milliseconds timeout) = 0;
};

}  // namespace zinf::comm
