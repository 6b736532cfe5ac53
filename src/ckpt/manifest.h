// src/ckpt/manifest.h — the checkpoint format: a directory, its manifest, and what may be read.
//
// A checkpoint is a directory `<root>/step-<step, 10 digits>/` holding `manifest.json` and data
// files. The manifest (JSON, format "zinf-checkpoint", version 1) records the model, the
// training configuration that matters for a resume, the step, the data position, the loss
// scaler's state, the world size and partition rule, the files the shards live in, and for
// every shard: role, unit, dtype, shape, file, offset, length and xxHash64 (16 hex digits).
//
// Across ranks (world size N > 1) a checkpoint is a directory of parts: each rank r writes a
// whole manifest of its own (its shards, its files, "world": {size, partition, rank: r}) in
// `<step dir>/rank<r>/`, and the checkpoint is committed when the step directory's manifest
// exists: it names the world size, the partition rule and every part with the xxHash64 of its
// manifest.json, and holds no shards. Partition rules: "none" (world 1), "replicated" (every
// rank holds all of the optimizer state: ZeRO stage 0), "unit-chunks" (ZeRO-1/2: each unit's
// flat vector of N elements split into `world` chunks of ceil(N / world) elements, rank r
// holding [r x per, min(N, (r+1) x per)): UnitChunk). HYBRID_SHARD (sharded within a node,
// replicated across nodes) records "chunks": C, the ranks of a node: each unit is cut into C
// chunks and part r holds chunk r mod C (the parts of the other nodes repeat node 0's: the same
// state, kept in each rank's own files). Absent, C is the world size. A shard's file is either a data file of the checkpoint (a plain name inside
// its directory) or one of the run's swap files, listed with kind "swap": NVMe-homed optimizer
// state is not copied, the manifest points into the extents the run left in its swap file.
//
// Contract:
// - Commit(dir, manifest) writes manifest.json atomically (src/base/atomic_file.h: a unique
//   temporary, fsync, rename, directory fsync). The caller has written and fsynced the data
//   first: a directory holds a committed checkpoint exactly when its manifest.json exists.
// - Read(dir) parses and checks a manifest: every field's type, the format and version, and
//   that every shard names a listed file, lies inside it (offset + length <= the file's bytes)
//   and has the size its dtype and shape say. A listed data file must be a plain name (no '/',
//   no ".."); a swap file must be absolute, named like zinf's swap files ("zinf.swap" or
//   "zinf.swap.<i>"), and, when `allowed_swap_files` is given (a resume: the run's own), one of
//   them. Anything else is refused (InvalidArgument or DataLoss) naming the file and the field:
//   a manifest never makes zinf read a file that is neither in the checkpoint nor the run's.
// - Committed(root) lists the committed checkpoints under root by step; Resolve(path) takes a
//   checkpoint directory, or a root and picks its latest committed checkpoint (directories with
//   no manifest, or only a temporary one, are not checkpoints).
// - Verify(manifest) reads every shard and compares its xxHash64: DataLoss naming the first bad
//   shard, its file and offset; a file shorter than a shard needs is DataLoss too.
//
// - ReadPart(global, r) reads rank r's part of a checkpoint across ranks and checks it against
//   the global manifest (its hash, step, world size, partition and rank). Verify of a global
//   manifest verifies every part.
//
// Thread-safety: values and pure functions; files are only read, except by Commit.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zinf/status.h"

namespace zinf::ckpt {

inline constexpr char kFormat[] = "zinf-checkpoint";
inline constexpr int kFormatVersion = 1;
inline constexpr char kManifestName[] = "manifest.json";

struct FileEntry {
  std::string name;  // kind "data": a name in the checkpoint directory; "swap": an absolute path
  std::string kind;  // "data" or "swap"
  uint64_t bytes = 0;
  // A swap space striped over several files (zinf.stripe_paths): every member's absolute path
  // in stripe order (name is the first), and the stripe unit. Stripe unit k of the logical
  // bytes lives in member k % n at (k / n) * stripe_bytes (io/swap_file.h); shard offsets are
  // logical. Empty / 0 for one file.
  std::vector<std::string> members;
  uint64_t stripe_bytes = 0;
};

// Where `length` bytes of a shard lie on disk: one piece per file range.
struct FilePiece {
  std::string path;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct ShardEntry {
  std::string role;   // "master", "exp_avg", "exp_avg_sq", "param16", ...
  uint32_t unit = 0;
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<uint64_t> shape;
  std::string file;   // a FileEntry's name
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t xxh64 = 0;
};

inline constexpr char kPartitionNone[] = "none";
inline constexpr char kPartitionReplicated[] = "replicated";
inline constexpr char kPartitionUnitChunks[] = "unit-chunks";

// Rank `rank`'s chunk of a unit of `n` elements under "unit-chunks": [lo, lo + len); every
// chunk spans `per` elements of the vector padded to world x per.
struct UnitChunk {
  uint64_t lo = 0, len = 0, per = 0;
};
UnitChunk ChunkOfUnit(uint64_t n, uint32_t world, uint32_t rank);

// A part of a checkpoint across ranks, as the global manifest lists it.
struct RankPart {
  uint32_t rank = 0;
  std::string dir;        // "rank<r>", inside the checkpoint's directory
  uint64_t manifest_xxh64 = 0;  // of the part's manifest.json
};
std::string RankPartDirName(uint32_t rank);  // "rank3"

struct Manifest {
  uint64_t step = 0;               // optimizer steps run (applied and skipped); the next is step+1
  nlohmann::json model;            // zinf.model as the config writes it
  nlohmann::json training;         // what a resume must match or take over
  nlohmann::json data;             // the samplers' positions and the data's fingerprints
  nlohmann::json state;            // loss scaler, applied steps, clip coefficient, ...
  uint32_t world_size = 1;
  std::string partition = kPartitionNone;
  // "unit-chunks": the number of chunks a unit is cut into (HYBRID_SHARD: the ranks of a node,
  // dividing world_size); 0 (not recorded): world_size.
  uint32_t chunks = 0;
  // A part (world_size > 1): its rank. A global manifest across ranks (world_size > 1, no
  // rank): its parts, one per rank in rank order, and no files or shards.
  std::optional<uint32_t> rank;
  std::vector<RankPart> parts;
  std::vector<FileEntry> files;
  std::vector<ShardEntry> shards;

  std::string dir;  // where it was read from (set by Read)

  nlohmann::json ToJson() const;
  // The path a shard's bytes are read from (checked by Read); for a striped swap space, its
  // first member (use Locate to read).
  std::string PathOf(const ShardEntry& shard) const;
  // The file ranges holding bytes [pos, pos + length) of a shard, in order.
  std::vector<FilePiece> Locate(const ShardEntry& shard, uint64_t pos, uint64_t length) const;
  // "<path>" or "the swap space striped over <a>, <b>" (for messages).
  std::string Describe(const ShardEntry& shard) const;
  const FileEntry* FindFile(const std::string& name) const;
  // A global manifest of a checkpoint across ranks (its state lies in its parts).
  bool HasParts() const { return world_size > 1 && !rank.has_value(); }
  uint32_t Chunks() const { return chunks == 0 ? world_size : chunks; }
  // A part's chunk of a unit of n elements: its own under "unit-chunks", else the whole unit.
  UnitChunk PartChunk(uint64_t n) const;
};

// Bytes per element of a dtype name (F32 4, BF16/F16 2); 0 for an unknown one.
uint64_t DtypeBytes(const std::string& dtype);

std::string CheckpointDirName(uint64_t step);  // "step-0000000012"
// The step a directory name like CheckpointDirName's stands for; nullopt for any other name.
std::optional<uint64_t> StepOfDirName(const std::string& name);

Status Commit(const std::string& dir, const Manifest& manifest);
Result<Manifest> Read(const std::string& dir,
                      const std::optional<std::vector<std::string>>& allowed_swap_files = {});

// Rank r's part of a checkpoint across ranks (`global`: HasParts()), checked against it;
// allowed_swap_files as Read's.
Result<Manifest> ReadPart(const Manifest& global, uint32_t rank,
                          const std::optional<std::vector<std::string>>& allowed_swap_files = {});
// The manifests holding a checkpoint's state: {m} itself when it has no parts, else its parts
// of ranks 0 .. n-1 (n: `ranks`, at most the world size; unset: every rank), each checked as
// ReadPart does.
Result<std::vector<Manifest>> ReadParts(const Manifest& m,
                                        std::optional<uint32_t> ranks = std::nullopt);

struct CommittedCheckpoint {
  uint64_t step = 0;
  std::string dir;
};
// Sorted by step; a directory whose manifest does not parse is left out (and logged).
std::vector<CommittedCheckpoint> Committed(const std::string& root);
// `path` itself when it holds a manifest, else the latest committed checkpoint under it.
Result<std::string> Resolve(const std::string& path);

// Reads every shard and checks its hash (of every part, for a global manifest); `progress`
// (optional) is told each shard verified.
Status Verify(const Manifest& manifest,
              const std::function<void(const ShardEntry&)>& progress = nullptr);
// The xxHash64 of `length` bytes of `path` from `offset` (read in pieces).
Result<uint64_t> HashFileRange(const std::string& path, uint64_t offset, uint64_t length);
// Reads bytes [pos, pos + n) of a shard into dst (through Locate), every read checked.
Status ReadShard(const Manifest& manifest, const ShardEntry& shard, uint64_t pos, void* dst,
                 uint64_t n);

}  // namespace zinf::ckpt
