// src/train/checkpoint_repartition.cc — a resume on another world size or partition rule: the
// checkpoint's optimizer state re-cut into this run's shares (checkpoint.h).
#include <fmt/format.h>

#include "src/base/hash.h"
#include "src/train/checkpoint.h"
#include "src/train/executor.h"

namespace zinf::train {

bool NeedsRepartition(const ckpt::Manifest& global, uint32_t world, const std::string& partition) {
  return global.world_size != world || global.partition != partition;
}

Result<std::vector<ckpt::Manifest>> StatePartsForRepartition(const ckpt::Manifest& global) {
  if (global.rank) {
    return FailedPrecondition(fmt::format(
        "cannot resume from {}: it is rank {}'s part of a checkpoint across {} ranks; resume "
        "from the checkpoint's directory", global.dir, *global.rank, global.world_size));
  }
  // "replicated": every rank holds the same state, rank 0's part stands for all.
  return ckpt::ReadParts(global, global.partition == ckpt::kPartitionUnitChunks
                                     ? std::optional<uint32_t>(global.world_size)
                                     : std::optional<uint32_t>(1));
}

Status RestoreRepartitioned(LayerExecutor& ex, const std::vector<ckpt::Manifest>& parts,
                            uint64_t step, uint32_t rank, uint32_t world,
                            const std::string& partition) {
  const GptDims& d = ex.dims();
  if (parts.empty()) return InvalidArgument("re-partitioning: no part holds the state");
  std::vector<std::vector<StateShardSet>> shards_of;  // [part][unit][role]
  for (const ckpt::Manifest& part : parts) {
    ZINF_ASSIGN_OR_RETURN(auto by_unit, StateShardsByUnit(part, d));
    shards_of.push_back(std::move(by_unit));
  }
  std::vector<uint8_t> whole[offload::kStateRoles];
  for (uint32_t u = 0; u < d.units(); ++u) {
    const uint64_t n = d.UnitParams(u);
    const ckpt::UnitChunk mine = partition == ckpt::kPartitionUnitChunks
                                     ? ckpt::ChunkOfUnit(n, world, rank)
                                     : ckpt::UnitChunk{0, n, n};
    UnitState st;
    st.unit = u;
    st.n = mine.len;
    for (int r = 0; r < offload::kStateRoles; ++r) {
      const std::string& dtype = shards_of[0][u][r]->dtype;
      const uint64_t es = ckpt::DtypeBytes(dtype);
      whole[r].assign(es * n, 0);
      // Each part's shard at its chunk's first byte; together they tile the unit.
      uint64_t covered = 0;
      for (size_t p = 0; p < parts.size(); ++p) {
        const ckpt::Manifest& part = parts[p];
        const ckpt::ShardEntry& s = *shards_of[p][u][r];
        if (s.dtype != dtype) {
          return InvalidArgument(fmt::format(
              "re-partitioning {}: unit {} ({}) {}: the parts disagree on its dtype ({} and {})",
              part.dir, u, d.UnitName(u), offload::kStateRoleNames[r], dtype, s.dtype));
        }
        const uint64_t lo = part.partition == ckpt::kPartitionUnitChunks && part.rank
                                ? ckpt::ChunkOfUnit(n, part.world_size, *part.rank).lo
                                : 0;
        if (es * lo + s.length > whole[r].size()) {
          return InvalidArgument(fmt::format(
              "re-partitioning {}: unit {} ({}) {}: {} bytes at element {} run past the unit's "
              "{} elements", part.dir, u, d.UnitName(u), offload::kStateRoleNames[r], s.length,
              lo, n));
        }
        uint8_t* dst = whole[r].data() + es * lo;
        ZINF_RETURN_IF_ERROR(ckpt::ReadShard(part, s, 0, dst, s.length));
        const uint64_t got = Xxh64(dst, s.length);
        if (got != s.xxh64) {
          return DataLoss(fmt::format(
              "{}: optimizer state of unit {} ({}), {}: xxHash64 {} where the checkpoint "
              "recorded {}: the data is corrupt; nothing was trained on it", part.dir, u,
              d.UnitName(u), offload::kStateRoleNames[r], Xxh64Hex(got), Xxh64Hex(s.xxh64)));
        }
        covered += s.length;
      }
      if (covered != whole[r].size()) {
        return DataLoss(fmt::format(
            "re-partitioning {}: unit {} ({}) {}: the parts hold {} of its {} bytes",
            parts[0].dir, u, d.UnitName(u), offload::kStateRoleNames[r], covered,
            whole[r].size()));
      }
      st.arrays[r] = whole[r].data() + es * mine.lo;
      // The sources' hashes were checked above; this one is of the share taken from them.
      st.hashes[r] = Xxh64(st.arrays[r], es * mine.len);
      st.sources[r] = fmt::format("{} (re-partitioned)", parts[0].dir);
      if (r == offload::kExpAvgState) {
        st.moment_type = es == 2 ? kernels::DType::kBf16 : kernels::DType::kF32;
      }
    }
    ZINF_RETURN_IF_ERROR(
        ex.RestoreUnit(st, step).WithContext("resume (re-partitioned) from " + parts[0].dir));
  }
  return Status::Ok();
}

}  // namespace zinf::train
