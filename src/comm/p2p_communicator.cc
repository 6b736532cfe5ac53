#include "src/comm/p2p_communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>

#include <fmt/format.h>

#include "src/comm/reduce.h"
#include "src/comm/work_state.h"

namespace zinf::comm {
namespace {

// What every rank must agree on for one operation (check_sequence).
struct Desc {
  uint64_t seq = 0;
  uint64_t count = 0;
  int32_t root = 0;
  uint8_t kind = 0, send_type = 0, recv_type = 0, pad = 0;
  bool operator==(const Desc&) const = default;
};

std::string DescribeOp(const Desc& d) {
  const auto kind = static_cast<OpKind>(d.kind);
  const auto st = static_cast<DType>(d.send_type), rt = static_cast<DType>(d.recv_type);
  switch (kind) {
    case OpKind::kBarrier:
      return fmt::format("#{} barrier", d.seq);
    case OpKind::kBroadcast:
      return fmt::format("#{} broadcast of {} bytes from rank {}", d.seq, d.count, d.root);
    case OpKind::kAllGather:
      return fmt::format("#{} all_gather of {} {}", d.seq, d.count, DTypeName(st));
    default:
      return fmt::format("#{} {} of {} {} into {}", d.seq, OpKindName(kind), d.count,
                         DTypeName(st), DTypeName(rt));
  }
}

}  // namespace

std::unique_ptr<Communicator> P2PCommunicator::Create(std::unique_ptr<Transport> transport,
                                                      const CommOptions& options) {
  return std::unique_ptr<Communicator>(new P2PCommunicator(std::move(transport), options));
}

P2PCommunicator::P2PCommunicator(std::unique_ptr<Transport> t, const CommOptions& o)
    : transport_(std::move(t)), options_(o) {
  rank_ = transport_->rank();
  world_ = transport_->world();
  if (options_.piece_bytes < 64) options_.piece_bytes = 64;
  waiter_runs_ = options_.waiter_runs;
  worker_ = std::thread([this] { Run(); });
}

P2PCommunicator::~P2PCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

Work P2PCommunicator::Issue(Op op) {
  op.state = std::make_shared<Work::State>();
  if (waiter_runs_.load(std::memory_order_relaxed)) op.state->runner = this;
  Work w(op.state);
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
  }
  cv_.notify_all();
  return w;
}

Work P2PCommunicator::AllGather(const void* send, void* recv, size_t count, DType type) {
  if (count > 0 && (send == nullptr || recv == nullptr))
    return Work::Finished(InvalidArgument("all_gather: null buffer"));
  return Issue({.kind = OpKind::kAllGather, .send = send, .recv = recv, .count = count,
                .send_type = type, .recv_type = type});
}

Work P2PCommunicator::ReduceScatter(const void* send, DType send_type, void* recv,
                                    DType recv_type, size_t count) {
  if (!ReducePair(send_type, recv_type))
    return Work::Finished(InvalidArgument(fmt::format(
        "reduce_scatter: cannot sum {} into {} (supported: f32/bf16/f16 into f32, f64, i32, "
        "i64)", DTypeName(send_type), DTypeName(recv_type))));
  if (count > 0 && (send == nullptr || recv == nullptr))
    return Work::Finished(InvalidArgument("reduce_scatter: null buffer"));
  // In place only as the contract says: recv exactly this rank's chunk of send, equal types.
  const auto* s0 = static_cast<const uint8_t*>(send);
  const auto* r0 = static_cast<const uint8_t*>(recv);
  const size_t in_b = DTypeBytes(send_type), out_b = DTypeBytes(recv_type);
  const bool overlap = count > 0 && r0 < s0 + size_t(world_) * count * in_b &&
                       s0 < r0 + count * out_b;
  if (overlap && !(send_type == recv_type && r0 == s0 + size_t(rank_) * count * in_b))
    return Work::Finished(InvalidArgument(
        "reduce_scatter: the receive buffer overlaps the send buffer other than as this rank's "
        "own chunk with equal types"));
  return Issue({.kind = OpKind::kReduceScatter, .send = send, .recv = recv, .count = count,
                .send_type = send_type, .recv_type = recv_type});
}

Work P2PCommunicator::AllReduce(const void* send, DType send_type, void* recv, DType recv_type,
                                size_t count) {
  if (!ReducePair(send_type, recv_type))
    return Work::Finished(InvalidArgument(fmt::format(
        "all_reduce: cannot sum {} into {} (supported: f32/bf16/f16 into f32, f64, i32, i64)",
        DTypeName(send_type), DTypeName(recv_type))));
  if (count > 0 && (send == nullptr || recv == nullptr))
    return Work::Finished(InvalidArgument("all_reduce: null buffer"));
  const auto* s0 = static_cast<const uint8_t*>(send);
  const auto* r0 = static_cast<const uint8_t*>(recv);
  const bool overlap = count > 0 && r0 < s0 + count * DTypeBytes(send_type) &&
                       s0 < r0 + count * DTypeBytes(recv_type);
  if (overlap && !(send == recv && send_type == recv_type))
    return Work::Finished(InvalidArgument("all_reduce: in place needs the same buffer and equal "
                                          "send and receive types"));
  return Issue({.kind = OpKind::kAllReduce, .send = send, .recv = recv, .count = count,
                .send_type = send_type, .recv_type = recv_type});
}

Work P2PCommunicator::Broadcast(void* buf, size_t bytes, int root) {
  if (root < 0 || root >= world_)
    return Work::Finished(InvalidArgument(
        fmt::format("broadcast: root {} is not a rank of a world of {}", root, world_)));
  if (bytes > 0 && buf == nullptr) return Work::Finished(InvalidArgument("broadcast: null buffer"));
  return Issue({.kind = OpKind::kBroadcast, .send = buf, .recv = buf, .count = bytes,
                .root = root});
}

Work P2PCommunicator::Barrier() { return Issue({.kind = OpKind::kBarrier}); }

CommStats P2PCommunicator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void P2PCommunicator::Run() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !running_ && (stopping_ || !queue_.empty()); });
      if (queue_.empty()) return;  // stopping, everything issued is done
      op = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
    }
    RunOne(op, false);
  }
}

void P2PCommunicator::RunUpTo(const Work::State* target) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (running_) return;  // the worker (or another waiter) runs; the target's Finish wakes us
    const auto it = std::find_if(queue_.begin(), queue_.end(),
                                 [&](const Op& o) { return o.state.get() == target; });
    if (it == queue_.end()) return;  // done already
    const bool last = it == queue_.begin();
    Op op = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    RunOne(op, true);
    if (last) return;  // touches nothing of the communicator after its target's Finish
    lock.lock();
  }
}

void P2PCommunicator::RunOne(Op& op, bool by_waiter) {
  Status broken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    broken = broken_;
  }
  ++op_seq_;
  Status s;
  double secs = 0;
  if (!broken.ok()) {
    s = Aborted(fmt::format("{} #{}: the communicator failed earlier: {}", OpKindName(op.kind),
                            op_seq_, broken.message()));
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    // On a waiter's thread an exception must not unwind past running_ (every later operation
    // would wait for it): it fails the operation instead, as any failure does.
    try {
      s = Execute(op);
    } catch (const std::exception& e) {
      s = Internal(fmt::format("{} #{}: {}", OpKindName(op.kind), op_seq_, e.what()));
    }
    if (!s.ok()) transport_->Cancel();  // nothing lands in the caller's buffers after this
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken.ok()) {
      const auto k = static_cast<size_t>(op.kind);
      stats_.ops[k] += 1;
      stats_.seconds[k] += secs;
      stats_.ran_by_waiter += by_waiter ? 1 : 0;
      if (!s.ok() && broken_.ok()) broken_ = s;
    }
    running_ = false;
  }
  cv_.notify_all();  // the worker may run the next
  op.state->Finish(std::move(s));
}

Status P2PCommunicator::Post(const OpKind* kind, uint64_t tag, std::span<const SendOp> sends,
                             std::span<const RecvOp> recvs) {
  if (kind != nullptr) {
    uint64_t out = 0, in = 0;
    for (const SendOp& o : sends) out += o.bytes;
    for (const RecvOp& o : recvs) in += o.bytes;
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent[size_t(*kind)] += out;
    stats_.bytes_received[size_t(*kind)] += in;
  }
  return transport_->Post(tag, sends, recvs);
}

Status P2PCommunicator::Exchange(const OpKind* kind, std::span<const SendOp> sends,
                                 std::span<const RecvOp> recvs) {
  const uint64_t tag = tag_++;
  ZINF_RETURN_IF_ERROR(Post(kind, tag, sends, recvs));
  return transport_->Wait(tag, options_.timeout);
}

Status P2PCommunicator::CheckSequence(const Op& op) {
  const Desc mine{.seq = op_seq_, .count = op.count, .root = op.root,
                  .kind = uint8_t(op.kind), .send_type = uint8_t(op.send_type),
                  .recv_type = uint8_t(op.recv_type)};
  std::vector<Desc> theirs(static_cast<size_t>(world_));
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (int p = 0; p < world_; ++p) {
    if (p == rank_) continue;
    sends.push_back({p, &mine, sizeof(Desc)});
    recvs.push_back({p, &theirs[size_t(p)], sizeof(Desc)});
  }
  ZINF_RETURN_IF_ERROR(Exchange(nullptr, sends, recvs));
  for (int p = 0; p < world_; ++p) {
    if (p == rank_ || theirs[size_t(p)] == mine) continue;
    return FailedPrecondition(fmt::format(
        "collective sequence differs: rank {} issued {}, rank {} issued {}; every rank must "
        "issue the same collectives in the same order", rank_, DescribeOp(mine), p,
        DescribeOp(theirs[size_t(p)])));
  }
  return Status::Ok();
}

Status P2PCommunicator::Execute(const Op& op) {
  if (options_.check_sequence && world_ > 1) ZINF_RETURN_IF_ERROR(CheckSequence(op));
  const size_t w = size_t(world_), r = size_t(rank_);
  std::vector<Region> regions(w);
  switch (op.kind) {
    case OpKind::kAllGather: {
      const size_t esz = DTypeBytes(op.send_type);
      auto* out = static_cast<uint8_t*>(op.recv);
      uint8_t* own = out + r * op.count * esz;
      if (op.count > 0 && own != op.send) std::memmove(own, op.send, op.count * esz);
      for (size_t p = 0; p < w; ++p) regions[p] = {p * op.count, op.count};
      return GatherRegions(op.kind, out, op.send_type, regions);
    }
    case OpKind::kReduceScatter: {
      for (size_t p = 0; p < w; ++p) regions[p] = {p * op.count, op.count};
      return ReduceRegions(op.kind, static_cast<const uint8_t*>(op.send), op.send_type, regions,
                           static_cast<uint8_t*>(op.recv), op.recv_type, nullptr);
    }
    case OpKind::kAllReduce: {
      const size_t per = (op.count + w - 1) / w;
      for (size_t p = 0; p < w; ++p) {
        const size_t off = std::min(p * per, op.count);
        regions[p] = {off, std::min(per, op.count - off)};
      }
      auto* out = static_cast<uint8_t*>(op.recv);
      return ReduceRegions(op.kind, static_cast<const uint8_t*>(op.send), op.send_type, regions,
                           out + regions[r].offset * DTypeBytes(op.recv_type), op.recv_type,
                           out);
    }
    case OpKind::kBroadcast: {
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      if (op.count == 0 || world_ == 1) return Status::Ok();
      if (rank_ == op.root) {
        for (int p = 0; p < world_; ++p)
          if (p != rank_) sends.push_back({p, op.send, op.count});
      } else {
        recvs.push_back({op.root, op.recv, op.count});
      }
      return Exchange(&op.kind, sends, recvs);
    }
    case OpKind::kBarrier: {
      if (world_ == 1) return Status::Ok();
      const uint8_t token = 1;
      std::vector<uint8_t> in(w);
      std::vector<SendOp> sends;
      std::vector<RecvOp> recvs;
      for (int p = 0; p < world_; ++p) {
        if (p == rank_) continue;
        sends.push_back({p, &token, 1});
        recvs.push_back({p, &in[size_t(p)], 1});
      }
      return Exchange(&op.kind, sends, recvs);
    }
  }
  return Internal("unknown collective");
}

Status P2PCommunicator::ReduceRegions(OpKind kind, const uint8_t* send, DType send_type,
                                      std::span<const Region> regions, uint8_t* out,
                                      DType recv_type, uint8_t* gather) {
  const size_t w = size_t(world_), r = size_t(rank_);
  const size_t in_b = DTypeBytes(send_type), out_b = DTypeBytes(recv_type);
  size_t longest = 0;
  for (const Region& g : regions) longest = std::max(longest, g.length);
  if (longest == 0) return Status::Ok();
  const size_t piece = std::max<size_t>(1, options_.piece_bytes / in_b);
  const size_t pieces = (longest + piece - 1) / piece;
  const size_t mine_len = regions[r].length;
  // One peer's pieces land straight in this rank's output, each at the back of its piece's place
  // there (the sum reads it before its stores reach it: reduce.h), when the output overlaps no
  // input; the other peers' land in staging slots. With no peer staged (two ranks), every
  // piece's transfers are posted at once: a receive is posted long before its data comes, so
  // the sender never waits for the receiver's "ready" (worth 10-20% at 256 MiB on loopback).
  // Over a transport matching in post order (NCCL) every peer is staged (below).
  size_t send_end = 0;  // bytes of `send` the regions cover
  for (const Region& g : regions) send_end = std::max(send_end, (g.offset + g.length) * in_b);
  const auto o0 = reinterpret_cast<uintptr_t>(out), s0 = reinterpret_cast<uintptr_t>(send);
  const bool out_apart = mine_len == 0 || o0 + mine_len * out_b <= s0 || o0 >= s0 + send_end;
  // Whether the output is apart can differ by rank (one rank in place, or with an empty
  // region): a transport matching in post order (NCCL) stages every peer instead, so that the
  // schedule below, and so the order of the posts, is the same on every rank.
  const bool rank_free = transport_->MatchesInPostOrder();
  const size_t direct =
      w > 1 && out_apart && out_b >= in_b && !rank_free ? (r + 1) % w : w;  // w: none
  const size_t staged_peers = w - 1 - (direct < w ? 1 : 0);
  const size_t stride = std::min(piece, longest) * in_b;  // one rank's piece in a slot
  const size_t slot = w * stride;                          // one piece of every rank
  // Pieces posted ahead of the one being summed (staging slots: ahead + 1).
  const size_t ahead = staged_peers == 0 ? pieces
                                         : std::max<size_t>(2, options_.pipeline_depth) - 1;
  const size_t depth = ahead + 1;
  if (staged_peers > 0 && staging_.size() < depth * slot) staging_.resize(depth * slot);
  // Tags: piece k's reduction exchange base + 2k, its gather base + 2k + 1.
  const uint64_t base = tag_;
  tag_ += 2 * pieces;
  auto len_at = [&](size_t len, size_t at) { return at < len ? std::min(piece, len - at) : 0; };
  // Where peer p's piece starting at element `at` (n elements) lands.
  auto landing = [&](size_t p, size_t k, size_t at, size_t n) -> uint8_t* {
    if (p == direct) return out + at * out_b + n * (out_b - in_b);
    return staging_.data() + (k % depth) * slot + p * stride;
  };
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  // Own pieces are read where they are, also in place (the sum stores each block after reading
  // every source of it: reduce.h).
  // Posts piece k's reduction exchange (its staging slot k % depth is free: piece k - depth was
  // summed before this is called).
  auto post_reduce = [&](size_t k) -> Status {
    const size_t at = k * piece;
    sends.clear();
    recvs.clear();
    for (size_t p = 0; p < w; ++p) {
      if (p == r) continue;
      if (const size_t n = len_at(regions[p].length, at))
        sends.push_back({int(p), send + (regions[p].offset + at) * in_b, n * in_b});
      if (const size_t n = len_at(mine_len, at))
        recvs.push_back({int(p), landing(p, k, at, n), n * in_b});
    }
    return Post(&kind, base + 2 * k, sends, recvs);
  };
  // The next piece's transfers run while this one is summed, and (all-reduce) each summed piece
  // is sent on at once.
  std::vector<const void*> srcs(w);
  for (size_t k = 0; k < ahead && k < pieces; ++k) ZINF_RETURN_IF_ERROR(post_reduce(k));
  for (size_t k = 0; k < pieces; ++k) {
    if (k + ahead < pieces) ZINF_RETURN_IF_ERROR(post_reduce(k + ahead));
    ZINF_RETURN_IF_ERROR(transport_->Wait(base + 2 * k, options_.timeout));
    const size_t at = k * piece;
    const size_t n = len_at(mine_len, at);
    if (n > 0) {
      for (size_t p = 0; p < w; ++p)
        srcs[p] = p == r ? send + (regions[r].offset + at) * in_b : landing(p, k, at, n);
      SumInOrder(send_type, srcs.data(), w, recv_type, out + at * out_b, n);
    }
    if (gather == nullptr) continue;
    sends.clear();
    recvs.clear();
    for (size_t p = 0; p < w; ++p) {
      if (p == r) continue;
      if (n > 0) sends.push_back({int(p), out + at * out_b, n * out_b});
      if (const size_t m = len_at(regions[p].length, at))
        recvs.push_back({int(p), gather + (regions[p].offset + at) * out_b, m * out_b});
    }
    ZINF_RETURN_IF_ERROR(Post(&kind, base + 2 * k + 1, sends, recvs));
  }
  if (gather != nullptr)
    for (size_t k = 0; k < pieces; ++k)
      ZINF_RETURN_IF_ERROR(transport_->Wait(base + 2 * k + 1, options_.timeout));
  return Status::Ok();
}

Status P2PCommunicator::GatherRegions(OpKind kind, uint8_t* buf, DType type,
                                      std::span<const Region> regions) {
  const size_t w = size_t(world_), r = size_t(rank_), b = DTypeBytes(type);
  std::vector<SendOp> sends;
  std::vector<RecvOp> recvs;
  for (size_t p = 0; p < w; ++p) {
    if (p == r) continue;
    if (regions[r].length > 0)
      sends.push_back({int(p), buf + regions[r].offset * b, regions[r].length * b});
    if (regions[p].length > 0)
      recvs.push_back({int(p), buf + regions[p].offset * b, regions[p].length * b});
  }
  if (sends.empty() && recvs.empty()) return Status::Ok();
  return Exchange(&kind, sends, recvs);
}

}  // namespace zinf::comm
