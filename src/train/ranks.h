// src/train/ranks.h — a training run across ranks (`zinf launch --nproc N -- zinf train ...`):
// joining them, checking they agree, each rank's swap directories, its share of the batch.
//
// Contract.
// - JoinRanks reads the launcher's environment (src/comm/world.h). A world of one needs no
//   communicator (null). Otherwise it connects (zinf.comm.timeout_seconds bounds every wait).
//   Stage 0 replicates the state and all-reduces the gradients; stages 1, 2 and 3 partition the
//   optimizer state, the gradients and the 16-bit weights (executor.h).
//   HYBRID_SHARD over several nodes (LOCAL_WORLD_SIZE below WORLD_SIZE, dividing it, at least 2)
//   also joins two groups: shard_comm, this node's ranks (ZeRO-3 among them), and replica_comm,
//   the ranks of this local rank on every node (the gradient chunks all-reduced across them, so
//   each node holds one copy of the state); on one node it is FULL_SHARD. Checkpoints across
//   ranks: checkpoint.h. Each rank's GPU is LOCAL_RANK's (shared round-robin when a node has
//   fewer GPUs than ranks); zinf.comm.backend "nccl" carries the collectives over NCCL instead of
//   Gloo, one GPU a rank (RankLink).
// - CheckRanksAgree: every rank hashes what must be equal (the config as JSON, the steps, the
//   data sources, the model's shape, the world size) and all fail, naming the ranks that differ,
//   when one differs — before anything heavy is built.
// - PerRankPaths: each NVMe directory (offload paths, zinf.swap_dir, zinf.stripe_paths) gets a
//   `rank<R>` subdirectory, as DeepSpeed's swap files do: ranks never share a swap file.
// - Batches: a step's global batch is micro-batch × accumulation × world sequences, read in the
//   order one rank would read them (the same sampler on every rank); rank r takes the step's
//   micro-batches [r × accumulation, (r+1) × accumulation) — so one rank with accumulation ×
//   world micro-batches sees the same data in the same order. MeanLoss gathers the ranks'
//   micro-batch losses and averages them in that global order (the same double on every rank).
//
// Thread-safety: the training thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "src/base/cuda_probe.h"
#include "src/comm/communicator.h"
#include "src/comm/world.h"
#include "src/config/config.h"
#include "zinf/status.h"

namespace zinf::train {

struct Ranks {
  comm::WorldEnv env;
  std::unique_ptr<comm::Communicator> comm;  // null for a world of one
  // HYBRID_SHARD across nodes (else null): this node's ranks, and this local rank's on every
  // node. Declared after comm: closed before it.
  std::unique_ptr<comm::Communicator> shard_comm, replica_comm;
  // This rank's GPU (LOCAL_RANK's; RankLink), for the training device and NCCL.
  int cuda_ordinal = 0;
  int rank() const { return env.rank; }
  int world() const { return env.world; }
  bool lead() const { return env.rank == 0; }
  // The ranks the state is partitioned over, and this rank among them.
  int shard_world() const { return shard_comm ? shard_comm->world() : env.world; }
  int shard_rank() const { return shard_comm ? shard_comm->rank() : env.rank; }
  // The communicator the executor partitions over.
  comm::Communicator* partition_comm() const { return shard_comm ? shard_comm.get() : comm.get(); }
};

Result<Ranks> JoinRanks(const Config& c);

// This rank's GPU (comm::GpuOfRank) into *cuda_ordinal, and the link zinf.comm.backend asks for:
// "nccl" is refused, naming the rank, when no GPU answers or the node's ranks outnumber its GPUs.
Result<comm::Link> RankLink(const comm::WorldEnv& env, const Config& c, const CudaProbe& probe,
                            int* cuda_ordinal);

struct AgreementInputs {
  uint64_t steps = 0;
  std::string data, val_data, init;
  uint64_t synthetic_bytes = 0;
};
Status CheckRanksAgree(const Ranks& ranks, const Config& c, const AgreementInputs& in);

Config PerRankPaths(Config c, int rank);
// Creates the rank's directories PerRankPaths named (their parents exist: the shared ones).
Status MakeRankDirs(const Config& rank_config);

// The mean of every rank's micro-batch losses in global order ((0 + l_0 / n) + l_1 / n ...,
// n = accumulation × world), the same on every rank. `mine`: this rank's, in order.
Result<double> MeanLoss(const Ranks& ranks, std::span<const double> mine);

// Whether any rank asks to stop (a stop request reaches the ranks at different moments: they
// agree each step, so that all stop after the same one).
Result<bool> AnyRank(const Ranks& ranks, bool mine);

}  // namespace zinf::train
