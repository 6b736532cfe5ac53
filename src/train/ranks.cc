#include "src/train/ranks.h"

#include <filesystem>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/cuda_probe.h"
#include "src/base/hash.h"
#include "src/base/log.h"

namespace zinf::train {
namespace {

std::string RankDir(const std::string& dir, int rank) {
  if (dir.empty()) return dir;
  return (std::filesystem::path(dir) / fmt::format("rank{}", rank)).string();
}

}  // namespace

Result<comm::Link> RankLink(const comm::WorldEnv& env, const Config& c, const CudaProbe& probe,
                            int* cuda_ordinal) {
  const comm::RankGpu gpu = comm::GpuOfRank(env, probe.device_count);
  *cuda_ordinal = gpu.ordinal;
  if (c.zinf.comm.backend != "nccl") {
    if (gpu.shared) {
      Log().info("train: rank {} shares GPU {} with other ranks (LOCAL_RANK {}, {} GPUs)",
                 env.rank, gpu.ordinal, env.local_rank, probe.device_count);
    }
    return comm::Link{};
  }
  if (probe.device_count == 0) {
    return FailedPrecondition(fmt::format(
        "{}: zinf.comm.backend \"nccl\" needs a GPU a rank, and no GPU answers on rank {} ({}); "
        "use \"gloo\"",
        c.source, env.rank, probe.built_with_cuda ? probe.detail : "a build without CUDA"));
  }
  if (gpu.shared) {
    return FailedPrecondition(fmt::format(
        "{}: zinf.comm.backend \"nccl\" needs a GPU a rank: rank {} is LOCAL_RANK {} but this "
        "node has {} GPU(s) (NCCL refuses two ranks on one GPU); use \"gloo\", or at most {} "
        "ranks a node",
        c.source, env.rank, env.local_rank, probe.device_count, probe.device_count));
  }
  return comm::Link{.backend = comm::CommBackend::kNccl, .cuda_ordinal = gpu.ordinal};
}

Result<Ranks> JoinRanks(const Config& c) {
  Ranks r;
  ZINF_ASSIGN_OR_RETURN(r.env, comm::ReadWorldEnv());
  if (r.env.world == 1) return r;
  const bool hybrid =
      c.zinf.sharding_strategy == "HYBRID_SHARD" && r.env.local_world != r.env.world;
  if (hybrid && (r.env.local_world < 2 || r.env.world % r.env.local_world != 0)) {
    return InvalidArgument(fmt::format(
        "{}: zinf.sharding_strategy HYBRID_SHARD shards within a node and replicates across "
        "nodes: it needs at least 2 ranks on each node and the same number on every node "
        "(WORLD_SIZE {} a multiple of LOCAL_WORLD_SIZE {}); with one rank a node use NO_SHARD "
        "(nothing to shard within a node) or FULL_SHARD across all ranks",
        c.source, r.env.world, r.env.local_world));
  }
  comm::CommOptions o;
  o.timeout = std::chrono::seconds(c.zinf.comm.timeout_seconds);
  o.check_sequence = c.zinf.comm.check_sequence;
  ZINF_ASSIGN_OR_RETURN(comm::Link link, RankLink(r.env, c, ProbeCuda(), &r.cuda_ordinal));
  ZINF_ASSIGN_OR_RETURN(r.comm, comm::Connect(r.env, o, link));
  if (hybrid) {
    // Every rank joins the node's group, then the replicas' (the same order everywhere).
    const std::vector<int> node = comm::NodeGroup(r.env), replicas = comm::ReplicaGroup(r.env);
    const int lw = r.env.local_world;
    ZINF_ASSIGN_OR_RETURN(
        r.shard_comm,
        comm::ConnectGroup(r.env, o, fmt::format("node{}", r.env.rank / lw), node, link));
    ZINF_ASSIGN_OR_RETURN(
        r.replica_comm,
        comm::ConnectGroup(r.env, o, fmt::format("local{}", r.env.rank % lw), replicas, link));
  }
  return r;
}

Status CheckRanksAgree(const Ranks& ranks, const Config& c, const AgreementInputs& in) {
  if (ranks.comm == nullptr) return Status::Ok();
  const std::string what = fmt::format("{}\n{}\n{}\n{}\n{}\n{}\n{}", c.ToJson().dump(), in.steps,
                                       in.data, in.val_data, in.init, in.synthetic_bytes,
                                       ranks.world());
  return ranks.comm->CheckAgreement(
      Xxh64(what.data(), what.size()),
      "the training job (the config with its flags, --steps, the data, --init, WORLD_SIZE)");
}

Config PerRankPaths(Config c, int rank) {
  c.zero.offload_param.nvme_path = RankDir(c.zero.offload_param.nvme_path, rank);
  c.zero.offload_optimizer.nvme_path = RankDir(c.zero.offload_optimizer.nvme_path, rank);
  c.zinf.swap_dir = RankDir(c.zinf.swap_dir, rank);
  for (auto& p : c.zinf.stripe_paths) p = RankDir(p, rank);
  return c;
}

Status MakeRankDirs(const Config& c) {
  std::vector<std::string> dirs = c.zinf.stripe_paths;
  for (const std::string* d : {&c.zero.offload_param.nvme_path,
                               &c.zero.offload_optimizer.nvme_path, &c.zinf.swap_dir})
    dirs.push_back(*d);
  for (const std::string& d : dirs) {
    if (d.empty()) continue;
    std::error_code ec;
    std::filesystem::create_directories(d, ec);
    if (ec) return InvalidArgument(fmt::format("this rank's swap directory {}: {}", d, ec.message()));
  }
  return Status::Ok();
}

Result<double> MeanLoss(const Ranks& ranks, std::span<const double> mine) {
  const size_t per = mine.size();
  std::vector<double> all(per * size_t(ranks.world()));
  if (ranks.comm == nullptr) {
    all.assign(mine.begin(), mine.end());
  } else {
    ZINF_RETURN_IF_ERROR(
        ranks.comm->AllGather(mine.data(), all.data(), per, comm::DType::kF64).Wait());
  }
  double loss = 0;
  for (double l : all) loss += l / static_cast<double>(all.size());
  return loss;
}

Result<bool> AnyRank(const Ranks& ranks, bool mine) {
  if (ranks.comm == nullptr) return mine;
  int32_t in = mine ? 1 : 0, out = 0;
  ZINF_RETURN_IF_ERROR(
      ranks.comm->AllReduce(&in, comm::DType::kI32, &out, comm::DType::kI32, 1).Wait());
  return out > 0;
}

}  // namespace zinf::train
