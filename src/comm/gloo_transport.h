// src/comm/gloo_transport.h — the Transport over Gloo's TCP pairs (CPU ranks; what PyTorch
// uses on CPUs), and the raw Gloo collectives bench-comm compares zinf's against.
//
// Contract: ConnectGloo does the rendezvous world.h describes and returns a transport whose
// Post starts Gloo unbound-buffer sends and receives (slot = tag) and whose Wait waits for each
// with the time left; Gloo's exceptions become Status (a timeout: Aborted naming the peer; a closed or
// broken connection: Unavailable naming the peer and Gloo's message). The transport keeps rank
// 0's store server alive for its lifetime. ConnectGloo sets SIGPIPE to ignored when it is at its
// default (Gloo writes to sockets with write(2): a dead peer must be an error naming it, not a
// silent exit 141 of this process).
// GlooRaw runs Gloo's own allreduce (ring), allgather and, for the reduce-scatter,
// ReduceScatterHalvingDoubling, on the same context: the transport's baseline.
//
// Thread-safety: one thread uses the transport (the communicator's); GlooRaw only while no
// communicator operation runs on the same transport.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "src/comm/transport.h"
#include "src/comm/world.h"

namespace zinf::comm {

Result<std::unique_ptr<Transport>> ConnectGloo(const WorldEnv& env,
                                               std::chrono::milliseconds timeout);
// A group of the world's ranks (`members`, in the group's rank order; this rank among them),
// joined after ConnectGloo through the same store under the group's `name` (every member gives
// the same name and members). Its rank() and world() are the group's; its messages name the
// world's ranks, and a member that dies is noticed as in the world's transport.
Result<std::unique_ptr<Transport>> ConnectGlooGroup(const WorldEnv& env,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& name,
                                                    std::span<const int> members);

// Gloo's own collectives on fp32 (bench-comm's baseline). `transport` must come from ConnectGloo.
// Exceptions become Status.
struct GlooRaw {
  static Status AllReduce(Transport& transport, float* buf, size_t count);
  static Status AllGather(Transport& transport, const float* send, float* recv, size_t count);
  // Halving-doubling reduce-scatter in place over buf (world*count_per_rank values); Gloo's
  // algorithm object (its buffers registered with every pair) is built once here, and each call
  // of the returned function runs it once.
  static Result<std::function<Status()>> PrepareReduceScatter(Transport& transport, float* buf,
                                                              size_t count_per_rank);
};

}  // namespace zinf::comm
