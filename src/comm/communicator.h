// src/comm/communicator.h — the Communicator seam: the collectives sharding across ranks needs.
//
// Contract. A Communicator joins `world` ranks (processes, or threads in tests); every rank
// issues the same collectives in the same order, each with the same shape. Operations are
// asynchronous: each call queues the operation and returns a Work to wait on; a communicator runs
// its operations one at a time, in issue order, on its own thread — or on the waiter's: a Wait on
// an operation still queued while none runs runs it there (with any queued before it), which
// saves two thread hand-offs on a call that waits at once. Buffers must stay valid, and
// unwritten by the caller, until the Work is done. The destructor finishes every operation
// issued; no Wait on a Work that is not done may be in progress or start while it runs (the
// waiter may be running operations on the communicator).
// - Reductions sum in RANK ORDER: the result is ((0 + x_0) + x_1) + ... + x_{world-1}, in the
//   receive type's arithmetic (16-bit inputs widened exactly), whatever the transport and the
//   algorithm. So every rank gets the same bits, run after run, and a sum over ranks of one
//   micro-batch each equals, bit for bit, one rank accumulating the same micro-batches in rank
//   order from zero (what the gradient accumulator does). The start from +0 is deliberate: it
//   turns a sum of -0 into +0 exactly as the accumulator's zeroed buffer does.
// - Reduce-scatter moves (world-1)/world of its input per rank — a true reduce-scatter, not an
//   all-reduce: the ZeRO traffic of Ψ per rank for gradients.
// - A failure (a peer that closed its connection, a peer silent for `timeout`, a collective
//   another rank issued differently when check_sequence is on) fails the operation with a message
//   naming the peer rank, and breaks the communicator: every later operation fails at once with
//   the first error. Nothing hangs longer than the timeout.
// Element types: reductions take (send, recv) = (f32, f32), (bf16, f32), (f16, f32), (f64, f64),
// (i32, i32), (i64, i64); gathers and broadcasts move any type (they do not look at values).
//
// Thread-safety: calls may come from any thread; operations are issued in the order the calls
// were made (callers on several threads must order their calls themselves). A Work may be waited
// on from any thread, more than once.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::comm {

enum class DType : uint8_t { kU8, kI32, kI64, kF32, kF64, kBf16, kF16 };
size_t DTypeBytes(DType t);
const char* DTypeName(DType t);

enum class OpKind : uint8_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
inline constexpr int kOpKinds = 5;
const char* OpKindName(OpKind k);  // "all_gather", "reduce_scatter", ...

// Bytes this rank put on the wire and took off it, by operation (the sequence checks and
// agreement checks not counted), and the operations' wall time on the thread that ran them.
struct CommStats {
  std::array<uint64_t, kOpKinds> ops{};
  std::array<uint64_t, kOpKinds> bytes_sent{};
  std::array<uint64_t, kOpKinds> bytes_received{};
  std::array<double, kOpKinds> seconds{};
  // Operations a waiter ran on its own thread (the rest ran on the communicator's).
  uint64_t ran_by_waiter = 0;
  uint64_t total_sent() const;
  uint64_t total_received() const;
};

// One operation in flight.
class Work {
 public:
  Work() = default;
  // Blocks until the operation is done; its status (the same on every call).
  Status Wait() const;
  bool Done() const;
  bool valid() const { return state_ != nullptr; }

  struct State;
  explicit Work(std::shared_ptr<State> s) : state_(std::move(s)) {}
  // An already finished Work (a refused call).
  static Work Finished(Status s);

 private:
  std::shared_ptr<State> state_;
};

struct CommOptions {
  // A peer that does not answer within this fails the operation, naming the peer.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Before each operation, every rank's description of it (kind, counts, types, root) is
  // exchanged and compared: a rank that issued something else fails every rank with both
  // descriptions (the usual cause of hangs and silently wrong sums). Costs one small exchange an
  // operation.
  bool check_sequence = false;
  // Reductions move pieces of at most this many input bytes per peer, `pipeline_depth` pieces
  // in flight (at least 2) for the peers whose pieces are staged: all but one, or all when the
  // output overlaps the input or the transport matches in post order (NCCL;
  // p2p_communicator.h). The staging, depth * world * piece_bytes, is allocated only when some
  // peer is staged (never with two ranks and the output apart, except over NCCL). Every rank
  // must use the same piece_bytes and pipeline_depth: they set the steps and their tags.
  size_t piece_bytes = size_t{4} << 20;
  unsigned pipeline_depth = 4;
  // A Wait on an operation still queued while none runs runs it on the waiter's thread (see
  // above); off: always the communicator's thread (for comparing the two).
  bool waiter_runs = true;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // "gloo tcp 127.0.0.1", "local threads", ... for messages and summaries.
  virtual std::string Describe() const = 0;

  // recv holds world*count elements: rank p's `count` elements of `send` land at p*count.
  // send may be recv + rank*count (in place).
  virtual Work AllGather(const void* send, void* recv, size_t count, DType type) = 0;
  // send holds world*count elements of send_type; recv gets `count` elements of recv_type: the
  // rank-ordered sum over ranks of their send[rank*count, (rank+1)*count). recv may alias the
  // send's own chunk (in place) when the types are equal.
  virtual Work ReduceScatter(const void* send, DType send_type, void* recv, DType recv_type,
                             size_t count) = 0;
  // Every rank gets the rank-ordered sum of every rank's `count` elements (a reduce-scatter and
  // an all-gather: 2(world-1)/world of the bytes per rank). send == recv allowed when the types
  // are equal.
  virtual Work AllReduce(const void* send, DType send_type, void* recv, DType recv_type,
                         size_t count) = 0;
  virtual Work Broadcast(void* buf, size_t bytes, int root) = 0;
  virtual Work Barrier() = 0;

  virtual CommStats stats() const = 0;

  // Blocking: every rank gives a hash of what must agree (config, model, world); every rank
  // fails (FailedPrecondition) when any differs, naming the ranks whose `what` differs from
  // rank 0's.
  Status CheckAgreement(uint64_t hash, std::string_view what);
};

}  // namespace zinf::comm
