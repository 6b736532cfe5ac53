#include "src/ckpt/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include "src/base/atomic_file.h"
#include "src/base/hash.h"
#include "src/base/json_strict.h"
#include "src/base/log.h"

namespace zinf::ckpt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uint64_t kHashChunk = 8ull << 20;

// Field access with messages naming the manifest and the field.
class Fields {
 public:
  Fields(const std::string& where, const json& j) : where_(where), j_(j) {}

  template <typename T>
  Status Get(const char* key, T* out, const char* expected) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key, expected);
    try {
      if constexpr (std::is_same_v<T, std::string>) {
        if (!it->is_string()) return Bad(key, *it, expected);
      } else if constexpr (std::is_integral_v<T>) {
        if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
          return Bad(key, *it, expected);
        }
      }
      *out = it->get<T>();
    } catch (const json::exception&) {
      return Bad(key, *it, expected);
    }
    return Status::Ok();
  }
  Status Object(const char* key, json* out) const {
    auto it = j_.find(key);
    if (it == j_.end()) return Missing(key, "an object");
    if (!it->is_object()) return Bad(key, *it, "an object");
    *out = *it;
    return Status::Ok();
  }

 private:
  Status Missing(const char* key, const char* expected) const {
    return InvalidArgument(fmt::format("{}: \"{}\" is missing; expected {}", where_, key,
                                       expected));
  }
  Status Bad(const char* key, const json& v, const char* expected) const {
    std::string shown = v.dump();
    if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
    return InvalidArgument(fmt::format("{}: \"{}\" is {}; expected {}", where_, key, shown,
                                       expected));
  }
  std::string where_;
  const json& j_;
};

bool IsSwapName(const std::string& path) {
  static const std::regex kName("zinf\\.swap(\\.[0-9]+)?");
  return std::regex_match(fs::path(path).filename().string(), kName);
}

bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name != kManifestName;
}

}  // namespace

uint64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

std::string CheckpointDirName(uint64_t step) { return fmt::format("step-{:010}", step); }

UnitChunk Manifest::PartChunk(uint64_t n) const {
  if (partition != kPartitionUnitChunks || !rank) return {0, n, n};
  return ChunkOfUnit(n, Chunks(), *rank % Chunks());
}

std::string RankPartDirName(uint32_t rank) { return fmt::format("rank{}", rank); }

UnitChunk ChunkOfUnit(uint64_t n, uint32_t world, uint32_t rank) {
  const uint64_t w = world == 0 ? 1 : world;
  const uint64_t per = (n + w - 1) / w;
  const uint64_t lo = std::min(n, uint64_t{rank} * per);
  return {lo, std::min(per, n - lo), per};
}

std::optional<uint64_t> StepOfDirName(const std::string& name) {
  static const std::regex kDir("step-([0-9]{10})");
  std::smatch m;
  if (!std::regex_match(name, m, kDir)) return std::nullopt;
  return std::stoull(m[1].str());
}

json Manifest::ToJson() const {
  json files_j = json::array();
  for (const FileEntry& f : files) {
    json e = {{"name", f.name}, {"kind", f.kind}, {"bytes", f.bytes}};
    if (!f.members.empty()) {
      e["members"] = f.members;
      e["stripe_bytes"] = f.stripe_bytes;
    }
    files_j.push_back(std::move(e));
  }
  json shards_j = json::array();
  for (const ShardEntry& s : shards) {
    shards_j.push_back({{"role", s.role},
                        {"unit", s.unit},
                        {"dtype", s.dtype},
                        {"shape", s.shape},
                        {"file", s.file},
                        {"offset", s.offset},
                        {"length", s.length},
                        {"xxh64", Xxh64Hex(s.xxh64)}});
  }
  json world = {{"size", world_size}, {"partition", partition}};
  if (chunks != 0 && chunks != world_size) world["chunks"] = chunks;
  if (rank) world["rank"] = *rank;
  json out = {{"format", kFormat},
              {"format_version", kFormatVersion},
              {"step", step},
              {"model", model},
              {"training", training},
              {"data", data},
              {"state", state},
              {"world", world},
              {"files", files_j},
              {"shards", shards_j}};
  if (!parts.empty()) {
    json parts_j = json::array();
    for (const RankPart& p : parts) {
      parts_j.push_back({{"rank", p.rank}, {"dir", p.dir},
                         {"manifest_xxh64", Xxh64Hex(p.manifest_xxh64)}});
    }
    out["parts"] = parts_j;
  }
  return out;
}

const FileEntry* Manifest::FindFile(const std::string& name) const {
  for (const FileEntry& f : files) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

std::string Manifest::PathOf(const ShardEntry& shard) const {
  const FileEntry* f = FindFile(shard.file);
  if (f != nullptr && f->kind == "swap") return f->name;
  return (fs::path(dir) / shard.file).string();
}

std::vector<FilePiece> Manifest::Locate(const ShardEntry& shard, uint64_t pos,
                                        uint64_t length) const {
  const FileEntry* f = FindFile(shard.file);
  if (f == nullptr || f->members.empty()) return {{PathOf(shard), shard.offset + pos, length}};
  std::vector<FilePiece> out;
  const uint64_t unit_bytes = f->stripe_bytes, n = f->members.size();
  for (uint64_t logical = shard.offset + pos, left = length; left > 0;) {
    const uint64_t unit = logical / unit_bytes, within = logical % unit_bytes;
    const uint64_t len = std::min(left, unit_bytes - within);
    const std::string& path = f->members[unit % n];
    const uint64_t phys = (unit / n) * unit_bytes + within;
    if (!out.empty() && out.back().path == path && out.back().offset + out.back().length == phys) {
      out.back().length += len;
    } else {
      out.push_back({path, phys, len});
    }
    logical += len;
    left -= len;
  }
  return out;
}

std::string Manifest::Describe(const ShardEntry& shard) const {
  const FileEntry* f = FindFile(shard.file);
  if (f == nullptr || f->members.empty()) return PathOf(shard);
  return fmt::format("the swap space striped over {} ({} bytes a stripe unit)",
                     fmt::join(f->members, ", "), f->stripe_bytes);
}

Status Commit(const std::string& dir, const Manifest& manifest) {
  return WriteFileAtomically((fs::path(dir) / kManifestName).string(),
                             manifest.ToJson().dump(1) + "\n");
}

namespace {

// The manifest's "world" object: the world size, the partition rule, chunks and rank.
Status ReadWorld(const std::string& path, Fields& f, Manifest& m) {
  json world;
  ZINF_RETURN_IF_ERROR(f.Object("world", &world));
  Fields fw(path + ": world", world);
  ZINF_RETURN_IF_ERROR(fw.Get("size", &m.world_size, "an integer >= 1"));
  ZINF_RETURN_IF_ERROR(fw.Get("partition", &m.partition, "a partition rule"));
  if (m.world_size == 0) return InvalidArgument(path + ": world.size 0; expected >= 1");
  if (m.world_size == 1 ? m.partition != kPartitionNone
                        : m.partition != kPartitionReplicated &&
                              m.partition != kPartitionUnitChunks) {
    return InvalidArgument(fmt::format(
        "{}: world size {} with partition \"{}\"; expected \"{}\" for one rank, \"{}\" or "
        "\"{}\" across ranks", path, m.world_size, m.partition, kPartitionNone,
        kPartitionReplicated, kPartitionUnitChunks));
  }
  if (world.contains("chunks")) {
    ZINF_RETURN_IF_ERROR(fw.Get("chunks", &m.chunks, "the chunks of a unit"));
    if (m.partition != kPartitionUnitChunks || m.chunks == 0 ||
        m.world_size % m.chunks != 0) {
      return InvalidArgument(fmt::format(
          "{}: world.chunks {} with partition \"{}\" in a world of {}; expected chunks only "
          "with \"{}\", a divisor of the world size", path, m.chunks, m.partition, m.world_size,
          kPartitionUnitChunks));
    }
  }
  if (world.contains("rank")) {
    uint32_t rank = 0;
    ZINF_RETURN_IF_ERROR(fw.Get("rank", &rank, "a rank below the world size"));
    if (m.world_size == 1 || rank >= m.world_size) {
      return InvalidArgument(fmt::format("{}: world.rank {} in a world of {}", path, rank,
                                         m.world_size));
    }
    m.rank = rank;
  }
  return Status::Ok();
}

// "parts": one entry per rank in a checkpoint across ranks, none otherwise.
Status ReadParts(const std::string& path, const json& j, Manifest& m) {
  if (!m.HasParts()) {
    if (j.contains("parts")) {
      return InvalidArgument(path + ": \"parts\" in a manifest of one rank's state");
    }
    return Status::Ok();
  }
  auto parts = j.find("parts");
  if (parts == j.end() || !parts->is_array() || parts->size() != m.world_size) {
    return InvalidArgument(fmt::format(
        "{}: a checkpoint across {} ranks lists its parts in \"parts\", one per rank", path,
        m.world_size));
  }
  for (size_t i = 0; i < parts->size(); ++i) {
    Fields fp(fmt::format("{}: parts[{}]", path, i), (*parts)[i]);
    RankPart p;
    std::string hash;
    ZINF_RETURN_IF_ERROR(fp.Get("rank", &p.rank, "the part's rank"));
    ZINF_RETURN_IF_ERROR(fp.Get("dir", &p.dir, "rank<r>"));
    ZINF_RETURN_IF_ERROR(fp.Get("manifest_xxh64", &hash, "16 hex digits"));
    auto h = ParseXxh64Hex(hash);
    if (p.rank != i || p.dir != RankPartDirName(p.rank) || !h) {
      return InvalidArgument(fmt::format(
          "{}: parts[{}] is rank {} in \"{}\" with hash \"{}\"; expected rank {} in \"{}\" "
          "with 16 hex digits", path, i, p.rank, p.dir, hash, i, RankPartDirName(i)));
    }
    p.manifest_xxh64 = *h;
    m.parts.push_back(p);
  }
  return Status::Ok();
}

// A swap file entry's members: absolute zinf swap files, among the run's own when given.
Status CheckSwapMembers(const std::string& path, size_t i, const FileEntry& e,
                        const std::optional<std::vector<std::string>>& allowed_swap_files) {
  for (const std::string& member : e.members.empty() ? std::vector<std::string>{e.name}
                                                     : e.members) {
    if (!fs::path(member).is_absolute() || !IsSwapName(member)) {
      return InvalidArgument(fmt::format(
          "{}: files[{}] \"{}\" is not a zinf swap file (an absolute path named zinf.swap "
          "or zinf.swap.<i>): refused", path, i, member));
    }
    if (allowed_swap_files &&
        std::find(allowed_swap_files->begin(), allowed_swap_files->end(), member) ==
            allowed_swap_files->end()) {
      return InvalidArgument(fmt::format(
          "{}: files[{}] \"{}\" is not one of this run's swap files: refused (the run's "
          "are {})", path, i, member, fmt::join(*allowed_swap_files, ", ")));
    }
  }
  return Status::Ok();
}

// "files": the checkpoint's data files (plain names inside it) and the swap files it names.
Status ReadFiles(const std::string& path, const json& j, Manifest& m,
                 const std::optional<std::vector<std::string>>& allowed_swap_files) {
  auto files = j.find("files");
  if (files == j.end() || !files->is_array()) {
    return InvalidArgument(path + ": \"files\" is missing or not an array");
  }
  for (size_t i = 0; i < files->size(); ++i) {
    Fields ff(fmt::format("{}: files[{}]", path, i), (*files)[i]);
    FileEntry e;
    ZINF_RETURN_IF_ERROR(ff.Get("name", &e.name, "a file name"));
    ZINF_RETURN_IF_ERROR(ff.Get("kind", &e.kind, "\"data\" or \"swap\""));
    ZINF_RETURN_IF_ERROR(ff.Get("bytes", &e.bytes, "an integer >= 0"));
    if (e.kind == "data") {
      if (!IsPlainName(e.name)) {
        return InvalidArgument(fmt::format(
            "{}: files[{}] \"{}\" is not a plain file name inside the checkpoint directory "
            "(a path escape): refused", path, i, e.name));
      }
    } else if (e.kind == "swap") {
      if ((*files)[i].contains("members")) {
        ZINF_RETURN_IF_ERROR(ff.Get("members", &e.members, "the striped swap files' paths"));
        ZINF_RETURN_IF_ERROR(ff.Get("stripe_bytes", &e.stripe_bytes, "the stripe unit in bytes"));
        if (e.members.size() < 2 || e.members[0] != e.name || e.stripe_bytes == 0) {
          return InvalidArgument(fmt::format(
              "{}: files[{}] \"{}\": a striped swap space needs two or more members, the first "
              "being its name, and stripe_bytes > 0", path, i, e.name));
        }
      }
      ZINF_RETURN_IF_ERROR(CheckSwapMembers(path, i, e, allowed_swap_files));
    } else {
      return InvalidArgument(fmt::format("{}: files[{}] kind \"{}\"; expected \"data\" or "
                                         "\"swap\"", path, i, e.kind));
    }
    if (m.FindFile(e.name) != nullptr) {
      return InvalidArgument(fmt::format("{}: files[{}] \"{}\" is listed twice", path, i, e.name));
    }
    m.files.push_back(e);
  }
  return Status::Ok();
}

// One "shards" entry: its role, type, shape and hash, inside a listed file.
Result<ShardEntry> ReadShard(const std::string& where, const json& entry, const Manifest& m) {
  Fields fs_(where, entry);
  ShardEntry s;
  std::string hash;
  ZINF_RETURN_IF_ERROR(fs_.Get("role", &s.role, "a role name"));
  ZINF_RETURN_IF_ERROR(fs_.Get("unit", &s.unit, "a unit index"));
  ZINF_RETURN_IF_ERROR(fs_.Get("dtype", &s.dtype, "F32, BF16 or F16"));
  ZINF_RETURN_IF_ERROR(fs_.Get("shape", &s.shape, "an array of sizes"));
  ZINF_RETURN_IF_ERROR(fs_.Get("file", &s.file, "a listed file's name"));
  ZINF_RETURN_IF_ERROR(fs_.Get("offset", &s.offset, "a byte offset"));
  ZINF_RETURN_IF_ERROR(fs_.Get("length", &s.length, "a byte length"));
  ZINF_RETURN_IF_ERROR(fs_.Get("xxh64", &hash, "16 hex digits"));
  auto h = ParseXxh64Hex(hash);
  if (!h) return InvalidArgument(fmt::format("{}: xxh64 \"{}\"; expected 16 hex digits", where, hash));
  s.xxh64 = *h;
  const uint64_t elem = DtypeBytes(s.dtype);
  if (elem == 0) {
    return InvalidArgument(fmt::format("{}: dtype \"{}\"; expected F32, BF16 or F16", where,
                                       s.dtype));
  }
  uint64_t count = 1;
  for (uint64_t d : s.shape) count *= d;
  if (count * elem != s.length) {
    return InvalidArgument(fmt::format("{}: length {} bytes, but {} {} values make {}", where,
                                       s.length, count, s.dtype, count * elem));
  }
  const FileEntry* file = m.FindFile(s.file);
  if (file == nullptr) {
    return InvalidArgument(fmt::format(
        "{}: file \"{}\" is neither a data file of this checkpoint nor one of its listed swap "
        "files (a path escape): refused", where, s.file));
  }
  if (s.offset > file->bytes || s.length > file->bytes - s.offset) {
    return InvalidArgument(fmt::format("{}: bytes [{}, {}) lie outside {} ({} bytes)", where,
                                       s.offset, s.offset + s.length, s.file, file->bytes));
  }
  return s;
}

}  // namespace

Result<Manifest> Read(const std::string& dir,
                      const std::optional<std::vector<std::string>>& allowed_swap_files) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  json j;
  try {
    j = ParseJsonRefusingDuplicates(text);
  } catch (const DuplicateJsonKey& d) {
    return DataLoss(fmt::format("{}: the key {} is repeated", path, d.Dotted()));
  } catch (const json::parse_error& e) {
    return DataLoss(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object()) return DataLoss(path + ": expected a JSON object");
  Manifest m;
  m.dir = dir;
  Fields f(path, j);
  std::string format;
  int version = 0;
  ZINF_RETURN_IF_ERROR(f.Get("format", &format, "\"zinf-checkpoint\""));
  if (format != kFormat) {
    return InvalidArgument(fmt::format("{}: format \"{}\"; expected \"{}\"", path, format, kFormat));
  }
  ZINF_RETURN_IF_ERROR(f.Get("format_version", &version, "1"));
  if (version != kFormatVersion) {
    return InvalidArgument(fmt::format("{}: format_version {}; this zinf reads version {}", path,
                                       version, kFormatVersion));
  }
  ZINF_RETURN_IF_ERROR(f.Get("step", &m.step, "an integer >= 0"));
  ZINF_RETURN_IF_ERROR(f.Object("model", &m.model));
  ZINF_RETURN_IF_ERROR(f.Object("training", &m.training));
  ZINF_RETURN_IF_ERROR(f.Object("data", &m.data));
  ZINF_RETURN_IF_ERROR(f.Object("state", &m.state));
  ZINF_RETURN_IF_ERROR(ReadWorld(path, f, m));
  ZINF_RETURN_IF_ERROR(ReadParts(path, j, m));
  ZINF_RETURN_IF_ERROR(ReadFiles(path, j, m, allowed_swap_files));
  auto shards = j.find("shards");
  if (shards == j.end() || !shards->is_array()) {
    return InvalidArgument(path + ": \"shards\" is missing or not an array");
  }
  for (size_t i = 0; i < shards->size(); ++i) {
    ZINF_ASSIGN_OR_RETURN(ShardEntry s,
                          ReadShard(fmt::format("{}: shards[{}]", path, i), (*shards)[i], m));
    m.shards.push_back(std::move(s));
  }
  if (m.HasParts() && (!m.files.empty() || !m.shards.empty())) {
    return InvalidArgument(path + ": a checkpoint across ranks keeps its files and shards in "
                                  "its parts, not in the global manifest");
  }
  return m;
}

Result<Manifest> ReadPart(const Manifest& global, uint32_t rank,
                          const std::optional<std::vector<std::string>>& allowed_swap_files) {
  if (!global.HasParts() || rank >= global.parts.size()) {
    return InvalidArgument(fmt::format("checkpoint {}: no part of rank {} (world size {})",
                                       global.dir, rank, global.world_size));
  }
  const RankPart& p = global.parts[rank];
  const std::string dir = (fs::path(global.dir) / p.dir).string();
  const std::string path = (fs::path(dir) / kManifestName).string();
  ZINF_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path));
  const uint64_t h = Xxh64(text.data(), text.size());
  if (h != p.manifest_xxh64) {
    return DataLoss(fmt::format("{}: xxHash64 {}, the checkpoint's manifest records {}: the part "
                                "is not the one committed", path, Xxh64Hex(h),
                                Xxh64Hex(p.manifest_xxh64)));
  }
  ZINF_ASSIGN_OR_RETURN(Manifest m, Read(dir, allowed_swap_files));
  if (m.step != global.step || m.world_size != global.world_size ||
      m.partition != global.partition || m.Chunks() != global.Chunks() || m.rank != rank) {
    return DataLoss(fmt::format(
        "{}: step {}, world size {}, partition {} in {} chunks, rank {}; the checkpoint's "
        "manifest says step {}, world size {}, partition {} in {} chunks, rank {}", path, m.step,
        m.world_size, m.partition, m.Chunks(), m.rank ? std::to_string(*m.rank) : "none",
        global.step, global.world_size, global.partition, global.Chunks(), rank));
  }
  return m;
}

std::vector<CommittedCheckpoint> Committed(const std::string& root) {
  std::vector<CommittedCheckpoint> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !StepOfDirName(name)) continue;
    if (!fs::exists(e.path() / kManifestName)) continue;  // not committed
    auto manifest = Read(e.path().string());
    if (!manifest.ok()) {
      Log().warn("checkpoint {} is not usable: {}", e.path().string(),
                 manifest.status().ToString());
      continue;
    }
    out.push_back({manifest->step, e.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CommittedCheckpoint& a, const CommittedCheckpoint& b) { return a.step < b.step; });
  return out;
}

Result<std::string> Resolve(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    return NotFound(fmt::format("checkpoint {}: no such directory", path));
  }
  if (fs::exists(fs::path(path) / kManifestName)) return path;
  // The newest directory holding a manifest: a manifest exists only once committed, so one that
  // does not read is damaged, and an older checkpoint is not taken in its place silently.
  std::string latest;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory() || !StepOfDirName(name)) continue;
    if (!fs::exists(e.path() / kManifestName)) continue;  // not committed
    if (latest.empty() || name > fs::path(latest).filename().string()) latest = e.path().string();
  }
  if (latest.empty()) {
    return NotFound(fmt::format("{} holds no committed checkpoint (no step-*/{})", path,
                                kManifestName));
  }
  if (auto m = Read(latest); !m.ok()) {
    return m.status().WithContext(fmt::format(
        "the latest committed checkpoint under {} does not read (name an older one to resume "
        "from it)",
        path));
  }
  return latest;
}

Result<uint64_t> HashFileRange(const std::string& path, uint64_t offset, uint64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  std::string buf(static_cast<size_t>(std::min(length, kHashChunk)), '\0');
  Xxh64Stream h;
  Status s;
  for (uint64_t done = 0; done < length && s.ok();) {
    const uint64_t n = std::min<uint64_t>(kHashChunk, length - done);
    s = PreadAll(fd, buf.data(), n, offset + done, path);
    if (s.ok()) h.Update(buf.data(), n);
    done += n;
  }
  ::close(fd);
  if (!s.ok()) return s;
  return h.Digest();
}

Status ReadShard(const Manifest& m, const ShardEntry& s, uint64_t pos, void* dst, uint64_t n) {
  auto* out = static_cast<unsigned char*>(dst);
  for (const FilePiece& p : m.Locate(s, pos, n)) {
    const int fd = ::open(p.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open " + p.path);
    Status st = PreadAll(fd, out, p.length, p.offset, p.path);
    ::close(fd);
    ZINF_RETURN_IF_ERROR(st);
    out += p.length;
  }
  return Status::Ok();
}

namespace {

// The xxHash64 of a shard's bytes, read piece by piece.
Result<uint64_t> HashShard(const Manifest& m, const ShardEntry& s) {
  const auto pieces = m.Locate(s, 0, s.length);
  if (pieces.size() == 1) return HashFileRange(pieces[0].path, pieces[0].offset, s.length);
  std::string buf(static_cast<size_t>(std::min(s.length, kHashChunk)), '\0');
  Xxh64Stream h;
  for (uint64_t done = 0; done < s.length;) {
    const uint64_t n = std::min<uint64_t>(kHashChunk, s.length - done);
    ZINF_RETURN_IF_ERROR(ReadShard(m, s, done, buf.data(), n));
    h.Update(buf.data(), n);
    done += n;
  }
  return h.Digest();
}

}  // namespace

Result<std::vector<Manifest>> ReadParts(const Manifest& m, std::optional<uint32_t> ranks) {
  std::vector<Manifest> out;
  if (!m.HasParts()) {
    out.push_back(m);
    return out;
  }
  const uint32_t n = std::min<uint32_t>(ranks.value_or(m.world_size), m.world_size);
  for (uint32_t r = 0; r < n; ++r) {
    ZINF_ASSIGN_OR_RETURN(Manifest part, ReadPart(m, r));
    out.push_back(std::move(part));
  }
  return out;
}

Status Verify(const Manifest& m, const std::function<void(const ShardEntry&)>& progress) {
  if (m.HasParts()) {
    ZINF_ASSIGN_OR_RETURN(const std::vector<Manifest> parts, ReadParts(m));
    for (const Manifest& part : parts) ZINF_RETURN_IF_ERROR(Verify(part, progress));
    return Status::Ok();
  }
  for (const ShardEntry& s : m.shards) {
    const std::string where = m.Describe(s);
    auto h = HashShard(m, s);
    if (!h.ok()) {
      return Status(h.status().code() == StatusCode::kDataLoss ? StatusCode::kDataLoss
                                                               : h.status().code(),
                    fmt::format("checkpoint {}: shard {} of unit {} ({} bytes at offset {} of "
                                "{}): {}", m.dir, s.role, s.unit, s.length, s.offset, where,
                                h.status().message()));
    }
    if (*h != s.xxh64) {
      return DataLoss(fmt::format(
          "checkpoint {}: shard {} of unit {} ({} bytes at offset {} of {}) has xxHash64 {}, the "
          "manifest records {}: the data is corrupt",
          m.dir, s.role, s.unit, s.length, s.offset, where, Xxh64Hex(*h), Xxh64Hex(s.xxh64)));
    }
    if (progress) progress(s);
  }
  return Status::Ok();
}

}  // namespace zinf::ckpt
