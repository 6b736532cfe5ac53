// `zinf ckpt inspect | export` for checkpoints of a PyTorch module (zinf.torch's
// save_checkpoint: manifest "model" of kind "torch"; python/zinf/torch/_checkpoint.py writes
// them). The model records every parameter's name, shape, unit and offset in its unit's shard;
// a shard's value is role "master" (fp32, trainable) or "param" (the working dtype, frozen).
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "kernels/cpu/cast.h"
#include "src/base/atomic_file.h"
#include "src/base/units.h"
#include "src/train/open_files.h"
#include "src/train/checkpoint_export.h"

namespace zinf::train {
namespace {

struct TorchParam {
  std::string name;
  std::vector<uint64_t> shape;
  uint32_t unit = 0;
  bool trainable = false;
  uint64_t offset = 0;  // elements, in its unit's shard
  uint64_t numel = 1;
};

Result<std::vector<TorchParam>> ParamsOf(const ckpt::Manifest& m) {
  const auto& params = m.model.find("params");
  if (params == m.model.end() || !params->is_array()) {
    return DataLoss(fmt::format("{}: model.params is missing or not an array", m.dir));
  }
  std::vector<TorchParam> out;
  for (const auto& p : *params) {
    TorchParam t;
    try {
      t.name = p.at("name").get<std::string>();
      t.shape = p.at("shape").get<std::vector<uint64_t>>();
      t.unit = p.at("unit").get<uint32_t>();
      t.trainable = p.at("trainable").get<bool>();
      t.offset = p.at("offset").get<uint64_t>();
    } catch (const nlohmann::json::exception& e) {
      return DataLoss(fmt::format("{}: model.params[{}]: {}", m.dir, out.size(), e.what()));
    }
    for (uint64_t d : t.shape) t.numel *= d;
    out.push_back(std::move(t));
  }
  return out;
}

const ckpt::ShardEntry* Find(const ckpt::Manifest& m, const std::string& role, uint32_t unit) {
  for (const ckpt::ShardEntry& s : m.shards) {
    if (s.role == role && s.unit == unit) return &s;
  }
  return nullptr;
}

kernels::DType KernelType(const std::string& dtype) {
  return dtype == "BF16" ? kernels::DType::kBf16
                         : dtype == "F16" ? kernels::DType::kF16 : kernels::DType::kF32;
}


}  // namespace

bool IsTorchCheckpoint(const ckpt::Manifest& m) { return m.model.value("kind", "") == "torch"; }

Result<std::string> DescribeTorch(const ckpt::Manifest& m) {
  ZINF_ASSIGN_OR_RETURN(std::vector<TorchParam> params, ParamsOf(m));
  uint64_t total = 0, trainable = 0;
  for (const TorchParam& p : params) {
    total += p.numel;
    if (p.trainable) trainable += p.numel;
  }
  std::string out;
  auto line = [&](std::string s) { out += s + "\n"; };
  line(fmt::format("checkpoint {}", m.dir));
  line(fmt::format("  step {} (zinf.torch)", m.step));
  line(fmt::format("  model: a PyTorch {} of {} parameters ({} trainable) in {} tensors, {} "
                   "wrap units; precision {}",
                   m.model.value("module", std::string("module")), total, trainable,
                   params.size(), m.model.contains("units") ? m.model["units"].size() : 0,
                   m.model.value("precision", std::string("?"))));
  if (m.state.contains("steps") && m.state["steps"].is_object()) {
    const auto& s = m.state["steps"];
    line(fmt::format("  optimizer steps {}, skipped {}", s.value("global_steps", uint64_t{0}),
                     s.value("skipped", uint64_t{0})));
  }
  std::map<std::string, uint64_t> bytes;
  uint64_t all = 0;
  for (const ckpt::ShardEntry& s : m.shards) {
    bytes[s.role] += s.length;
    all += s.length;
  }
  line(fmt::format("  {} shards, {} ({} bytes):", m.shards.size(), FormatBytesHuman(all), all));
  for (const auto& [role, n] : bytes) {
    line(fmt::format("    {:<11} {:>12} in checkpoint dir", role, FormatBytesHuman(n)));
  }
  for (const ckpt::FileEntry& f : m.files) {
    line(fmt::format("  file {} ({}, {} bytes)", f.name, f.kind, f.bytes));
  }
  return out;
}

Result<ExportStats> ExportTorch(const ckpt::Manifest& m, const ExportOptions& o) {
  ZINF_ASSIGN_OR_RETURN(std::vector<TorchParam> params, ParamsOf(m));
  ExportStats stats;
  if (o.verify) {
    const auto t0 = std::chrono::steady_clock::now();
    ZINF_RETURN_IF_ERROR(ckpt::Verify(m));
    stats.verify_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto files = std::make_shared<OpenFiles>();
  auto staging = std::make_shared<std::vector<unsigned char>>();
  std::vector<TensorToWrite> tensors;
  for (const TorchParam& p : params) {
    std::vector<std::pair<std::string, std::string>> roles = {
        {p.trainable ? "master" : "param", p.name}};
    if (o.optimizer_state && p.trainable) {
      roles.push_back({"exp_avg", p.name + ".exp_avg"});
      roles.push_back({"exp_avg_sq", p.name + ".exp_avg_sq"});
    }
    for (const auto& [role, name] : roles) {
      const ckpt::ShardEntry* s = Find(m, role, p.unit);
      if (s == nullptr) {
        return DataLoss(fmt::format("{}: no {} shard of unit {} (parameter {})", m.dir, role,
                                    p.unit, p.name));
      }
      const uint64_t es = ckpt::DtypeBytes(s->dtype);
      if ((p.offset + p.numel) * es > s->length) {
        return DataLoss(fmt::format("{}: parameter {} lies past its unit's {} shard", m.dir,
                                    p.name, role));
      }
      const kernels::DType stored = KernelType(s->dtype);
      // The weights in the dtype asked for; the moments as stored (fp32).
      const Dtype dtype = role == "master" || role == "param" ? o.dtype : Dtype::kF32;
      const std::string path = m.PathOf(*s);
      const uint64_t base = s->offset + p.offset * es;
      TensorToWrite w{.name = name, .dtype = dtype, .shape = p.shape};
      w.fill = [files, staging, path, base, es, stored, dtype](void* dst, uint64_t offset,
                                                               uint64_t bytes) -> Status {
        const uint64_t out_es = dtype == Dtype::kBF16 ? 2 : 4;
        const uint64_t n = bytes / out_es;
        ZINF_ASSIGN_OR_RETURN(int fd, files->Get(path));
        const bool same = (dtype == Dtype::kF32 && stored == kernels::DType::kF32) ||
                          (dtype == Dtype::kBF16 && stored == kernels::DType::kBf16);
        if (same) return PreadAll(fd, dst, bytes, base + offset / out_es * es, path);
        staging->resize(static_cast<size_t>(n * es));
        ZINF_RETURN_IF_ERROR(PreadAll(fd, staging->data(), n * es, base + offset / out_es * es,
                                      path));
        if (dtype == Dtype::kF32) {
          return kernels::CastToF32(staging->data(), stored, static_cast<float*>(dst), n);
        }
        // BF16 out of F32 (or F16 through F32).
        std::vector<float> wide(static_cast<size_t>(n));
        if (stored == kernels::DType::kF32) {
          std::copy_n(reinterpret_cast<const float*>(staging->data()), n, wide.data());
        } else {
          ZINF_RETURN_IF_ERROR(kernels::CastToF32(staging->data(), stored, wide.data(), n));
        }
        return kernels::CastFromF32(wide.data(), dst, kernels::DType::kBf16, n);
      };
      tensors.push_back(std::move(w));
    }
  }
  SafetensorsMetadata meta = {{"format", "pt"},
                              {"zinf_module", m.model.value("module", std::string("module"))},
                              {"zinf_step", std::to_string(m.step)}};
  ZINF_RETURN_IF_ERROR(WriteSafetensors(o.out, tensors, meta));
  stats.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.tensors = tensors.size();
  std::error_code ec;
  stats.bytes = std::filesystem::file_size(o.out, ec);
  return stats;
}

}  // namespace zinf::train
