#include "src/train/checkpoint_export.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/cast.h"
#include "src/base/atomic_file.h"
#include "src/base/units.h"
#include "src/train/open_files.h"
#include "src/train/checkpoint.h"
#include "src/train/gpt.h"
#include "src/train/weights_io.h"

namespace zinf::train {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

Result<GptDims> DimsOf(const ckpt::Manifest& m) {
  ZINF_ASSIGN_OR_RETURN(Config c, ConfigOf(m, Config{}));
  if (c.zinf.model.is_llama()) {
    return Unimplemented(fmt::format(
        "{}: a checkpoint of zinf.model.arch \"llama\" cannot be exported yet (the Hugging Face "
        "export comes with issue 39's loader)", m.dir));
  }
  return GptDims::FromConfig(c.zinf.model);
}


}  // namespace

Result<std::string> Describe(const ckpt::Manifest& m) {
  if (IsTorchCheckpoint(m)) return DescribeTorch(m);
  ZINF_ASSIGN_OR_RETURN(GptDims d, DimsOf(m));
  std::string out;
  auto line = [&](std::string s) { out += s + "\n"; };
  line(fmt::format("checkpoint {}", m.dir));
  line(fmt::format("  step {} (of {} asked for)", m.step, m.training.value("steps", uint64_t{0})));
  line(fmt::format("  model: {} parameters ({} layers, width {}, {} heads, seq {}, vocab {})",
                   d.TotalParams(), d.L, d.C, d.NH, d.seq, d.V));
  const std::string place = m.training.value("optimizer_state", std::string("?"));
  const auto in_memory =
      m.training.value("optimizer_state_in_memory", std::vector<std::string>());
  line(fmt::format("  precision {}, optimizer state {}; world size {}, partition {}",
                   m.training.value("param16", std::string("?")),
                   place == "mixed" ? fmt::format("in memory for {}, on NVMe for the rest",
                                                  fmt::join(in_memory, ", "))
                                    : "in " + place,
                   m.world_size,
                   m.Chunks() != m.world_size
                       ? fmt::format("{} in {} chunks (each node's ranks hold one copy)",
                                     m.partition, m.Chunks())
                       : m.partition));
  if (m.data.contains("train") && m.data["train"].is_object()) {
    const auto& t = m.data["train"];
    line(fmt::format("  data: {} ({}, {} tokens), next batch {}",
                     t.value("path", std::string("?")), t.value("format", std::string("?")),
                     t.value("tokens", uint64_t{0}), t.value("position", uint64_t{0})));
  }
  if (m.state.contains("loss_scaler") && m.state["loss_scaler"].is_object()) {
    line(fmt::format("  optimizer steps applied {}, skipped {}; loss scale {:g}",
                     m.state.value("applied_steps", uint64_t{0}),
                     m.state.value("skipped_steps", uint64_t{0}),
                     m.state["loss_scaler"].value("scale", 1.0)));
  }
  // The manifests holding the state: the checkpoint's own, or every rank's part.
  ZINF_ASSIGN_OR_RETURN(const std::vector<ckpt::Manifest> holders, ckpt::ReadParts(m));
  // Bytes per role and tier.
  std::map<std::string, std::map<std::string, uint64_t>> bytes;  // role -> tier -> bytes
  uint64_t total = 0, count = 0;
  for (const ckpt::Manifest& h : holders) {
    for (const ckpt::ShardEntry& s : h.shards) {
      const ckpt::FileEntry* f = h.FindFile(s.file);
      const std::string tier =
          f != nullptr && f->kind == "swap" ? "nvme (swap file)" : "checkpoint dir";
      bytes[s.role][tier] += s.length;
      total += s.length;
      ++count;
    }
  }
  line(fmt::format("  {} shards{}, {} ({} bytes):", count,
                   m.HasParts() ? fmt::format(" in {} parts", holders.size()) : "",
                   FormatBytesHuman(total), total));
  for (const auto& [role, tiers] : bytes) {
    for (const auto& [tier, n] : tiers) {
      line(fmt::format("    {:<11} {:>12} in {}", role, FormatBytesHuman(n), tier));
    }
  }
  for (const ckpt::Manifest& h : holders) {
    const std::string who = h.rank ? fmt::format("rank {}: ", *h.rank) : "";
    for (const ckpt::FileEntry& f : h.files) {
      if (f.members.empty()) {
        line(fmt::format("  {}file {} ({}, {} bytes)", who, f.name, f.kind, f.bytes));
      } else {
        line(fmt::format("  {}{} striped over {} files, {} bytes a unit ({} bytes):", who,
                         f.kind, f.members.size(), f.stripe_bytes, f.bytes));
        for (const std::string& member : f.members) line("    " + member);
      }
    }
  }
  return out;
}

Result<ExportStats> Export(const ckpt::Manifest& m, const ExportOptions& o) {
  if (o.dtype != Dtype::kF32 && o.dtype != Dtype::kBF16) {
    return InvalidArgument(fmt::format("export: dtype {}; expected F32 or BF16", DtypeName(o.dtype)));
  }
  if (IsTorchCheckpoint(m)) return ExportTorch(m, o);
  ZINF_ASSIGN_OR_RETURN(GptDims d, DimsOf(m));
  // The manifests holding the state: the checkpoint's own, or across ranks its parts (all of
  // them for "unit-chunks"; rank 0's for "replicated", every rank holding the same).
  ZINF_ASSIGN_OR_RETURN(
      std::vector<ckpt::Manifest> read,
      ckpt::ReadParts(m, m.partition == ckpt::kPartitionUnitChunks ? m.Chunks() : 1));
  auto parts = std::make_shared<std::vector<ckpt::Manifest>>(std::move(read));
  std::vector<std::vector<StateShardSet>> shards_of;  // [part][unit][role]
  for (const ckpt::Manifest& part : *parts) {
    ZINF_ASSIGN_OR_RETURN(auto by_unit, StateShardsByUnit(part, d));
    shards_of.push_back(std::move(by_unit));
  }
  ExportStats stats;
  if (o.verify) {
    const auto t0 = std::chrono::steady_clock::now();
    ZINF_RETURN_IF_ERROR(ckpt::Verify(m));
    stats.verify_seconds = Since(t0);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto files = std::make_shared<OpenFiles>();
  auto staging = std::make_shared<std::vector<float>>();
  std::vector<TensorToWrite> tensors;
  for (uint32_t u = 0; u < d.units(); ++u) {
    for (const TensorInfo& t : UnitTensors(d, u)) {
      const std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      for (int r = 0; r < (o.optimizer_state ? 3 : 1); ++r) {
        // The unit's role as one vector of its stored type (F32; BF16 moments with
        // zinf.optimizer_state_dtype bf16, exported as they are): each part's shard from its
        // chunk's first byte.
        const uint64_t es = ckpt::DtypeBytes(shards_of[0][u][r]->dtype);
        const Dtype stored = es == 2 ? Dtype::kBF16 : Dtype::kF32;
        struct Segment {
          const ckpt::Manifest* m;
          const ckpt::ShardEntry* s;
          uint64_t start;  // in the unit's bytes
        };
        std::vector<Segment> segments;
        for (size_t p = 0; p < parts->size(); ++p) {
          const ckpt::Manifest& part = (*parts)[p];
          const uint64_t lo = part.PartChunk(d.UnitParams(u)).lo;
          if (ckpt::DtypeBytes(shards_of[p][u][r]->dtype) != es) {
            return InvalidArgument(fmt::format(
                "export: unit {} {}: the parts of the checkpoint disagree on its dtype ({} and {})",
                u, offload::kStateRoleNames[r], shards_of[0][u][r]->dtype,
                shards_of[p][u][r]->dtype));
          }
          segments.push_back({&part, shards_of[p][u][r], es * lo});
        }
        const uint64_t base = es * t.offset;  // the tensor's first element in the unit
        const Dtype dtype = r == 0 ? o.dtype : stored;
        TensorToWrite w{.name = r == 0 ? t.name : t.name + "." + offload::kStateRoleNames[r],
                        .dtype = dtype,
                        .shape = shape};
        // Bytes [pos, pos + n) of the unit's role into dst, through the segments' files
        // (striped or not).
        auto read = [parts, files, segments](uint64_t pos, void* dst, uint64_t n) -> Status {
          auto* out = static_cast<unsigned char*>(dst);
          for (const Segment& seg : segments) {
            const uint64_t end = seg.start + seg.s->length;
            if (n == 0) break;
            if (pos >= end || pos < seg.start) continue;
            const uint64_t take = std::min(n, end - pos);
            for (const ckpt::FilePiece& p : seg.m->Locate(*seg.s, pos - seg.start, take)) {
              ZINF_ASSIGN_OR_RETURN(int fd, files->Get(p.path));
              ZINF_RETURN_IF_ERROR(PreadAll(fd, out, p.length, p.offset, p.path));
              out += p.length;
            }
            pos += take;
            n -= take;
          }
          if (n != 0) return Internal(fmt::format("export: {} bytes past the unit's state", n));
          return Status::Ok();
        };
        w.fill = [read, staging, base, dtype, stored](void* dst, uint64_t offset,
                                                      uint64_t bytes) -> Status {
          if (dtype == stored) return read(base + offset, dst, bytes);
          // The master weights (F32) exported as BF16.
          const uint64_t n = bytes / 2;  // BF16 elements
          staging->resize(static_cast<size_t>(n));
          ZINF_RETURN_IF_ERROR(read(base + 2 * offset, staging->data(), 4 * n));
          return kernels::CastFromF32(staging->data(), dst, kernels::DType::kBf16, n);
        };
        tensors.push_back(std::move(w));
      }
    }
  }
  SafetensorsMetadata meta = WeightsMetadata(d);
  ZINF_RETURN_IF_ERROR(WriteSafetensors(o.out, tensors, meta));
  stats.write_seconds = Since(t0);
  stats.tensors = tensors.size();
  std::error_code ec;
  stats.bytes = std::filesystem::file_size(o.out, ec);
  return stats;
}

}  // namespace zinf::train
