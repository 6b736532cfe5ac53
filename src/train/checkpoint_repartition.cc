// src/train/checkpoint_repartition.cc — a resume on another world size or partition rule: the
// checkpoint's optimizer state re-cut into this run's shares (checkpoint.h).
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "src/base/hash.h"
#include "src/train/checkpoint.h"
#include "src/train/executor.h"

namespace zinf::train {
namespace {

// Each old shard is read through a buffer of this many bytes, whatever the unit's size.
constexpr uint64_t kStreamBytes = uint64_t{4} << 20;

}  // namespace

bool NeedsRepartition(const ckpt::Manifest& global, uint32_t world, const std::string& partition,
                      uint32_t chunks) {
  return global.world_size != world || global.partition != partition ||
         (partition == ckpt::kPartitionUnitChunks && global.Chunks() != chunks);
}

Result<std::vector<ckpt::Manifest>> StatePartsForRepartition(const ckpt::Manifest& global) {
  if (global.rank) {
    return FailedPrecondition(fmt::format(
        "cannot resume from {}: it is rank {}'s part of a checkpoint across {} ranks; resume "
        "from the checkpoint's directory", global.dir, *global.rank, global.world_size));
  }
  // "replicated": every rank holds the same state, rank 0's part stands for all; "unit-chunks"
  // in C chunks: parts 0..C-1 (the others repeat them).
  return ckpt::ReadParts(global, global.partition == ckpt::kPartitionUnitChunks
                                     ? std::optional<uint32_t>(global.Chunks())
                                     : std::optional<uint32_t>(1));
}

Status RestoreRepartitioned(LayerExecutor& ex, const std::vector<ckpt::Manifest>& parts,
                            uint64_t step, uint32_t rank, uint32_t world,
                            const std::string& partition) {
  const Model& d = ex.model();
  if (parts.empty()) return InvalidArgument("re-partitioning: no part holds the state");
  std::vector<std::vector<StateShardSet>> shards_of;  // [part][unit][role]
  for (const ckpt::Manifest& part : parts) {
    ZINF_ASSIGN_OR_RETURN(auto by_unit, StateShardsByUnit(part, d));
    shards_of.push_back(std::move(by_unit));
  }
  // This rank's share of a unit's role, and the fixed buffer each old shard streams through.
  std::vector<uint8_t> share[offload::kStateRoles];
  std::vector<uint8_t> buf(kStreamBytes);
  for (uint32_t u = 0; u < d.units(); ++u) {
    const uint64_t n = d.UnitParams(u);
    const ckpt::UnitChunk mine = partition == ckpt::kPartitionUnitChunks
                                     ? ckpt::ChunkOfUnit(n, world, rank)
                                     : ckpt::UnitChunk{0, n, n};
    const uint64_t mine_end = mine.lo + mine.len;
    UnitState st;
    st.unit = u;
    st.n = mine.len;
    for (int r = 0; r < offload::kStateRoles; ++r) {
      const std::string& dtype = shards_of[0][u][r]->dtype;
      const uint64_t es = ckpt::DtypeBytes(dtype);
      share[r].assign(es * mine.len, 0);
      uint64_t covered = 0;  // elements of the share filled
      for (size_t p = 0; p < parts.size(); ++p) {
        const ckpt::Manifest& part = parts[p];
        const ckpt::ShardEntry& s = *shards_of[p][u][r];
        if (s.dtype != dtype) {
          return InvalidArgument(fmt::format(
              "re-partitioning {}: unit {} ({}) {}: the parts disagree on its dtype ({} and {})",
              part.dir, u, d.UnitName(u), offload::kStateRoleNames[r], dtype, s.dtype));
        }
        // The old part's chunk of the unit: [lo, lo + s.length / es).
        const uint64_t lo = part.PartChunk(n).lo;
        const uint64_t hi = lo + s.length / es;
        if (hi > n) {
          return InvalidArgument(fmt::format(
              "re-partitioning {}: unit {} ({}) {}: {} bytes at element {} run past the unit's "
              "{} elements", part.dir, u, d.UnitName(u), offload::kStateRoleNames[r], s.length,
              lo, n));
        }
        const uint64_t from = std::max(lo, mine.lo), to = std::min(hi, mine_end);
        if (from >= to) continue;  // none of it is this rank's (another rank checks it)
        // The whole shard streams through the buffer: hashed, and the overlap copied.
        Xxh64Stream hash;
        for (uint64_t pos = 0; pos < s.length;) {
          const uint64_t k = std::min<uint64_t>(buf.size() / es * es, s.length - pos);
          ZINF_RETURN_IF_ERROR(ckpt::ReadShard(part, s, pos, buf.data(), k));
          hash.Update(buf.data(), k);
          const uint64_t a = std::max(lo + pos / es, from), b = std::min(lo + (pos + k) / es, to);
          if (a < b) {
            std::memcpy(share[r].data() + es * (a - mine.lo), buf.data() + es * (a - lo) - pos,
                        es * (b - a));
          }
          pos += k;
        }
        if (hash.Digest() != s.xxh64) {
          return DataLoss(fmt::format(
              "{}: optimizer state of unit {} ({}), {}: xxHash64 {} where the checkpoint "
              "recorded {}: the data is corrupt; nothing was trained on it", part.dir, u,
              d.UnitName(u), offload::kStateRoleNames[r], Xxh64Hex(hash.Digest()),
              Xxh64Hex(s.xxh64)));
        }
        covered += to - from;
      }
      if (covered != mine.len) {
        return DataLoss(fmt::format(
            "re-partitioning {}: unit {} ({}) {}: the parts hold {} of this rank's {} elements",
            parts[0].dir, u, d.UnitName(u), offload::kStateRoleNames[r], covered, mine.len));
      }
      st.arrays[r] = share[r].data();
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
