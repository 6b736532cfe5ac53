// src/comm/p2p_communicator.h — the Communicator's collectives, written once over a Transport's
// point-to-point exchanges.
//
// Contract: implements communicator.h. Algorithms (direct, every rank talks to every rank; what
// one node's handful of ranks wants — each moves the same bytes per rank as a ring):
// - all-gather: each rank sends its chunk to every other rank, one exchange;
// - reduce-scatter: in pieces of CommOptions::piece_bytes of input per peer: each rank sends
//   peer p the piece of p's chunk and receives every peer's piece of its own chunk, then sums the
//   world pieces in rank order (reduce.h) — (world-1)/world of the input on the wire per rank.
//   Pipelined: later pieces' transfers run while the current piece is summed. One peer's
//   pieces land straight in the output (at the back of each piece's place, read before the sum
//   stores there) unless the output overlaps the input; the others' go through pipeline_depth
//   staging slots, pipeline_depth-1 pieces ahead. With two ranks and the output apart from the
//   input there is no staging, and every piece's receive is posted at the start. Over a
//   transport that matches transfers in post order (NCCL), every peer is staged, so the steps
//   are posted in the same order on every rank whatever each rank's buffers;
// - all-reduce: the same over `world` near-equal regions of the vector, each summed piece sent
//   to every rank as soon as it is summed (the all-gather half, pipelined with the reduction);
// - broadcast: the root sends to every rank; barrier: a one-byte message to every rank.
// Every exchange has its own tag (a counter, equal on every rank while they agree). With
// check_sequence, each operation is preceded by an exchange of its description.
//
// Thread-safety: as communicator.h. One worker thread per communicator runs the operations, or a
// waiter runs its own (WorkRunner): `running_` lets one thread at a time use the transport, in
// issue order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "src/comm/communicator.h"
#include "src/comm/transport.h"
#include "src/comm/work_state.h"

namespace zinf::comm {

class P2PCommunicator final : public Communicator, private WorkRunner {
 public:
  static std::unique_ptr<Communicator> Create(std::unique_ptr<Transport> transport,
                                              const CommOptions& options);
  ~P2PCommunicator() override;  // finishes what was issued

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string Describe() const override { return transport_->Describe(); }

  Work AllGather(const void* send, void* recv, size_t count, DType type) override;
  Work ReduceScatter(const void* send, DType send_type, void* recv, DType recv_type,
                     size_t count) override;
  Work AllReduce(const void* send, DType send_type, void* recv, DType recv_type,
                 size_t count) override;
  Work Broadcast(void* buf, size_t bytes, int root) override;
  Work Barrier() override;
  CommStats stats() const override;
  // CommOptions::waiter_runs, changed for the operations issued after (bench-comm's A/B).
  void set_waiter_runs(bool on) { waiter_runs_.store(on, std::memory_order_relaxed); }

 private:
  struct Op {
    OpKind kind = OpKind::kBarrier;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;  // elements (bytes for a broadcast)
    DType send_type = DType::kU8, recv_type = DType::kU8;
    int root = 0;
    std::shared_ptr<Work::State> state;
  };
  // Elements [offset, offset + length) of the full vector: rank p's region.
  struct Region {
    size_t offset = 0, length = 0;
  };

  P2PCommunicator(std::unique_ptr<Transport> t, const CommOptions& o);
  Work Issue(Op op);
  void Run();
  void RunUpTo(const Work::State* target) override;
  // Runs `op` (mu_ not held, running_ set by the caller): its stats and its Work's Finish.
  void RunOne(Op& op, bool by_waiter);
  Status Execute(const Op& op);
  Status CheckSequence(const Op& op);
  // Posts one step, its bytes counted under `kind` (not when kind is null: the sequence check).
  Status Post(const OpKind* kind, uint64_t tag, std::span<const SendOp> sends,
              std::span<const RecvOp> recvs);
  // Post and wait, with the next tag.
  Status Exchange(const OpKind* kind, std::span<const SendOp> sends,
                  std::span<const RecvOp> recvs);
  // Rank-ordered sum of region r of every rank's `send` (elements of send_type, region p at
  // regions[p].offset in send) into `out` (regions[rank].length elements of recv_type), in
  // pieces, the next piece's transfers under the current one's sum. With `gather` (all-reduce:
  // the whole receive buffer, `out` its own region) each summed piece goes to every rank and
  // theirs land in `gather`.
  Status ReduceRegions(OpKind kind, const uint8_t* send, DType send_type,
                       std::span<const Region> regions, uint8_t* out, DType recv_type,
                       uint8_t* gather);
  // Every rank's region of `buf` (elements of `type`; own region already in place) to all.
  Status GatherRegions(OpKind kind, uint8_t* buf, DType type, std::span<const Region> regions);

  std::unique_ptr<Transport> transport_;
  CommOptions options_;
  int rank_ = 0, world_ = 1;
  uint64_t tag_ = 0;      // the worker's exchange counter
  uint64_t op_seq_ = 0;   // the worker's operation counter (for messages)
  std::vector<uint8_t> staging_;  // the worker's reduction pieces

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;  // GUARDED_BY(mu_)
  bool stopping_ = false;  // GUARDED_BY(mu_)
  std::atomic<bool> waiter_runs_{true};
  bool running_ = false;   // GUARDED_BY(mu_): a thread runs an operation (owns the transport)
  Status broken_;          // GUARDED_BY(mu_): the first failure
  CommStats stats_;        // GUARDED_BY(mu_)
  std::thread worker_;
};

}  // namespace zinf::comm
