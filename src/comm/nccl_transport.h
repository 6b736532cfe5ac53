// src/comm/nccl_transport.h — the Transport over NCCL's point-to-point sends and receives: GPU
// ranks, one GPU each, on one node or several (NVLink, PCIe, InfiniBand: whatever NCCL finds).
// An optional build part: compiled when the build has CUDA and finds nccl.h and libnccl
// (ZINF_NCCL, CMakeLists.txt); otherwise ConnectNccl answers Unimplemented naming the option.
//
// Contract.
// - ConnectNccl takes a connected transport of the same ranks (Gloo's, world.h's rendezvous:
//   RANK claimed once, WORLD_SIZE checked) and keeps it: the ranks tell rank 0 over it whether
//   their GPU answers and which one it is (machine and PCI bus id), rank 0 creates NCCL's unique
//   id and hands it back over it, and it later tells a dead peer from a slow one
//   (Transport::PeerGone). A rank whose GPU does not answer, two ranks on one GPU (NCCL refuses
//   it), or NCCL_COMM_BLOCKING set (it would defeat the timeouts) fail every rank with a message
//   naming the rank and the cause. The communicator is NCCL's non-blocking kind: its set-up and
//   every launch are polled against `timeout`, never waited for blindly.
// - The communicator's contract is unchanged (communicator.h): its buffers are host memory and
//   its sums are the host's, in rank order, so the results are bit for bit those of Gloo and of
//   one rank. Post copies a step's sends into pinned staging, then (in stream order, on the
//   transport's own stream) to device memory (stream-ordered allocation), runs the step's
//   ncclSend/ncclRecv in one group, copies the receives back to pinned staging and records an
//   event. Wait polls the event and NCCL's asynchronous error, then copies the receives into the
//   caller's buffers. Pinned staging grows to at most `staging_cap` (256 MiB) while steps are in
//   flight; a step that needs more first completes the oldest ones (their receives land in the
//   callers' buffers then, before their Wait: the Transport contract allows it).
// - NCCL matches a send with the receive posted in the same position, not by tag: the transport
//   says so (Transport::MatchesInPostOrder) and the communicator then posts its steps in the same
//   order on every rank. Each transfer carries its step's tag and byte count in a 16-byte
//   header, and the receiver checks both: a transfer of another step or size fails (Internal,
//   naming the peer, both steps and both sizes), or ends in the timeout when NCCL waits for
//   bytes that never come; never silently wrong data. CommOptions::check_sequence names a
//   mismatched collective before it happens.
// - Failures: a peer silent past the timeout fails the step with Aborted naming the step's
//   peers; a peer whose process ended (its store connection closed, asked every second after the
//   first, and whenever NCCL reports an error) with Unavailable naming it; an unreachable store
//   with Unavailable naming rank 0; an NCCL or CUDA error with its text. Each aborts the NCCL
//   communicator (ncclCommAbort: its kernels end) and breaks the transport: every later call
//   fails with the first error.
// - After an abort the staging memory is not freed (a copy queued behind the aborted kernels may
//   still write it): the transport is dead and its process is about to report the failure.
//   Freeing pinned memory and aborting synchronize the whole GPU: the teardown of one
//   communicator can wait for another on the same GPU (HYBRID_SHARD's groups) whose kernel waits
//   for a silent peer, until that one's timeout.
//
// Thread-safety: as transport.h: one thread at a time. Each call makes the transport's GPU
// current on the calling thread and gives the thread its own device back when it returns (the
// communicator runs operations on its own thread or on a waiter's).
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "src/comm/transport.h"

// Tests compile this transport a second time against a fake CUDA and NCCL on the host
// (tests/comm/fake_nccl/), with ZINF_NCCL_FAKE defined: that build's names live in an inline
// namespace of their own, so both builds link into one test program.
#ifdef ZINF_NCCL_FAKE
#define ZINF_NCCL_BUILD_BEGIN inline namespace nccl_fake {
#define ZINF_NCCL_BUILD_END }
#else
#define ZINF_NCCL_BUILD_BEGIN
#define ZINF_NCCL_BUILD_END
#endif

namespace zinf::comm {
ZINF_NCCL_BUILD_BEGIN

// The most pinned staging a transport grows to while steps are in flight (ConnectNccl).
inline constexpr size_t kNcclStagingCap = size_t{256} << 20;

// Whether this build has the NCCL transport, and NCCL's version ("2.28.9"; "" without it).
bool NcclBuilt();
std::string NcclVersion();

// `rendezvous`: the same ranks connected (Gloo). `members`: the world ranks of a group, in the
// group's rank order (empty: the world; only messages use it). `cuda_ordinal`: this rank's GPU.
// `staging_cap`: see the contract (tests make it small).
Result<std::unique_ptr<Transport>> ConnectNccl(std::unique_ptr<Transport> rendezvous,
                                               std::span<const int> members, int cuda_ordinal,
                                               std::chrono::milliseconds timeout,
                                               size_t staging_cap = kNcclStagingCap);

// NCCL's own collectives on fp32 host vectors (bench-comm's baseline over NCCL): each copies its
// input to the GPU (through the transport's pinned staging), runs NCCL's algorithm there, copies
// the output back and waits, on the transport's communicator and stream — the least a
// host-buffer collective over NCCL costs. `transport` must come from ConnectNccl; no step of it
// may be in flight. Errors and timeouts break the transport as its own steps do.
struct NcclRaw {
  static Status AllReduce(Transport& transport, float* buf, size_t count);
  static Status AllGather(Transport& transport, const float* send, float* recv, size_t count);
  // send: world*count values; recv: this rank's `count` of their sum.
  static Status ReduceScatter(Transport& transport, const float* send, float* recv,
                              size_t count);
};

ZINF_NCCL_BUILD_END
}  // namespace zinf::comm
