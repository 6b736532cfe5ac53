// src/comm/world.h — which rank this process is, and joining the other ranks.
//
// Contract.
// - ReadWorldEnv reads torchrun's contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//   MASTER_ADDR (default 127.0.0.1), MASTER_PORT (default 29500); plus ZINF_RUN_ID (a job's
//   name in the store, so a stale store of another job is never joined) and ZINF_STORE_DIR (a
//   directory for Gloo's file store instead of the TCP store: one node, shared filesystem). With
//   neither RANK nor WORLD_SIZE set the process is a world of one. A value that is not a number,
//   a rank outside the world, one of RANK/WORLD_SIZE without the other: InvalidArgument naming
//   the variable and its value.
// - Connect joins the world: a world of one needs no peer (a local communicator); otherwise
//   Gloo over TCP. Rank 0 serves the rendezvous store on MASTER_ADDR:MASTER_PORT (tcp_store.h);
//   every rank claims its rank there (a rank claimed twice is refused), checks WORLD_SIZE against
//   rank 0's (a mismatch names both), and Gloo's full mesh of pairs is connected through it. Each
//   step is bounded by CommOptions::timeout. With Link::backend kNccl, NCCL's communicator is then
//   set up over that mesh (nccl_transport.h) and carries the data. The TCP address the pairs listen on is
//   ZINF_SOCKET_HOST when set, 127.0.0.1 when MASTER_ADDR is a loopback address, else this
//   host's name.
//
// Thread-safety: call from one thread; the communicator is thread-safe as communicator.h says.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/comm/communicator.h"

namespace zinf::comm {

struct WorldEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;
  std::string run_id;     // ZINF_RUN_ID, may be empty
  std::string store_dir;  // ZINF_STORE_DIR: Gloo's file store instead of the TCP store
  std::string socket_host;  // ZINF_SOCKET_HOST
  // "rank 1 of 2 (local 1 of 2), store 127.0.0.1:29500"
  std::string Describe() const;
};

using GetEnvFn = std::function<const char*(const char*)>;
Result<WorldEnv> ReadWorldEnv(const GetEnvFn& getenv_fn);
Result<WorldEnv> ReadWorldEnv();  // from the process's environment

// Which transport carries the collectives' data: Gloo's TCP pairs (any ranks), or NCCL's sends
// and receives (one GPU a rank, `cuda_ordinal`; nccl_transport.h). Both join through the same
// rendezvous (NCCL's on top of Gloo's), and the collectives' results are the same bits.
enum class CommBackend : uint8_t { kGloo, kNccl };
const char* CommBackendName(CommBackend b);  // "gloo", "nccl"
struct Link {
  CommBackend backend = CommBackend::kGloo;
  int cuda_ordinal = 0;
};

// This rank's GPU by torchrun's rule: LOCAL_RANK's. With more local ranks than GPUs
// (device_count > 0) the ranks share them round-robin and `shared` says so (Gloo allows it;
// NCCL refuses two ranks on one GPU). No GPU: ordinal 0, not shared.
struct RankGpu {
  int ordinal = 0;
  bool shared = false;
};
RankGpu GpuOfRank(const WorldEnv& env, int device_count);

Result<std::unique_ptr<Communicator>> Connect(const WorldEnv& env, const CommOptions& options,
                                              const Link& link = {});

// A communicator over a group of the world's ranks (`members`: world ranks in the group's rank
// order, this rank among them), after Connect; every member calls it with the same name and
// members, in the same order as the other groups it joins. A group of one needs no peer.
Result<std::unique_ptr<Communicator>> ConnectGroup(const WorldEnv& env, const CommOptions& options,
                                                   const std::string& name,
                                                   std::span<const int> members,
                                                   const Link& link = {});

// HYBRID_SHARD's groups: the ranks of this node (torchrun numbers ranks node by node:
// node = rank / local_world), and the ranks of this local rank on every node.
std::vector<int> NodeGroup(const WorldEnv& env);
std::vector<int> ReplicaGroup(const WorldEnv& env);

}  // namespace zinf::comm
