// src/comm/transport.h — point-to-point messages between ranks: what a Communicator's
// collectives are built on (p2p_communicator.h), so each algorithm is written once and runs the
// same over threads (local_transport.h) and over Gloo's TCP pairs (gloo_transport.h).
//
// Contract: Post starts every send and receive of one step of a collective and returns at once;
// Wait(tag) returns when all of that step's transfers completed (the buffers stay untouched by the
// caller until then). Several steps may be in flight (a pipeline), each with its own tag; `tag`
// is the same on every rank for the same step. A receive from peer p matches p's send to this rank
// with the same tag, and its byte count must equal the send's (a mismatch is an error, never a
// silent truncation). A peer that closed its side fails the step with Unavailable naming the
// peer; one silent past `timeout` fails it with Aborted ("no answer from rank p within ...").
// After a failure the caller calls Cancel (every step still posted is dropped: no transfer lands
// in the caller's buffers after it returns) and does not use the transport again.
//
// Thread-safety: one thread at a time uses a transport (the communicator hands it from its
// thread to a waiter and back under its mutex, which orders the accesses).
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
  virtual Status Post(uint64_t tag, std::span<const SendOp> sends,
                      std::span<const RecvOp> recvs) = 0;
  virtual Status Wait(uint64_t tag, std::chrono::milliseconds timeout) = 0;
  virtual void Cancel() = 0;
  // Whether a transfer matches the peer's transfer posted in the same position rather than the
  // one with its tag (NCCL's sends and receives): the caller must then post its steps in the
  // same order on every rank, not only with the same tags.
  virtual bool MatchesInPostOrder() const { return false; }
  // Whether `peer`'s process is known to have ended (its connection to the rendezvous store
  // closed); false when this transport cannot tell (threads; Gloo's file store); an error when
  // the store cannot be reached. Used by a transport built on this one for its rendezvous
  // (nccl_transport.h) to name a dead peer before its timeout. Not while a Wait of this
  // transport runs.
  virtual Result<bool> PeerGone(int /*peer*/) { return false; }
  // Post and Wait.
  Status Exchange(uint64_t tag, std::span<const SendOp> sends, std::span<const RecvOp> recvs,
                  std::chrono::milliseconds timeout) {
    Status s = Post(tag, sends, recvs);
    return s.ok() ? Wait(tag, timeout) : s;
  }
};

}  // namespace zinf::comm
