#include "src/train/weights_io.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/cast.h"
#include "src/train/safetensors.h"

namespace zinf::train {
namespace {

// One model size in a file's metadata: its key there, its zinf.model name and range.
struct SizeKey {
  const char* metadata_key;
  const char* model_key;
  uint32_t lo, hi;  // zinf.model's range (config_schema.cc)
  std::optional<uint32_t> RecordedModel::*recorded;
  int GptDims::*dim;
};
constexpr SizeKey kSizeKeys[] = {
    {"n_layer", "layers", 1, 4096, &RecordedModel::layers, &GptDims::L},
    {"n_embd", "width", 1, 65536, &RecordedModel::width, &GptDims::C},
    {"n_head", "heads", 1, 1024, &RecordedModel::heads, &GptDims::NH},
    {"block_size", "seq_len", 1, 1u << 20, &RecordedModel::seq_len, &GptDims::seq},
    {"vocab_size", "vocab", 2, 1u << 24, &RecordedModel::vocab, &GptDims::V},
};

Result<RecordedModel> RecordedIn(const SafetensorsFile& file) {
  RecordedModel m;
  for (const SizeKey& k : kSizeKeys) {
    auto it = file.metadata().find(k.metadata_key);
    if (it == file.metadata().end()) continue;
    const std::string& text = it->second;
    uint64_t v = 0;
    bool ok = !text.empty() && text.size() <= 10;
    for (char ch : text) {
      ok = ok && ch >= '0' && ch <= '9';
      if (ok) v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    if (!ok || v < k.lo || v > k.hi) {
      return InvalidArgument(fmt::format(
          "{}: metadata {} is \"{}\"; expected an integer from {} to {} (zinf.model.{})",
          file.path(), k.metadata_key, text, k.lo, k.hi, k.model_key));
    }
    m.*k.recorded = static_cast<uint32_t>(v);
  }
  return m;
}

std::string ModelText(const GptDims& d) {
  return fmt::format("{} layers, width {}, {} heads, seq_len {}, vocab {}", d.L, d.C, d.NH, d.seq,
                     d.V);
}

}  // namespace

namespace {

// --init and --save speak nanoGPT's names and metadata: GPT-2's.
Result<GptDims> GptOf(const LayerExecutor& executor, const char* what) {
  if (!executor.model().is_gpt()) {
    return Unimplemented(fmt::format(
        "{} takes nanoGPT-named GPT-2 weights; zinf.model.arch \"llama\" has none yet "
        "(Hugging Face checkpoints come with issue 39's loader)", what));
  }
  return executor.model().gpt();
}

}  // namespace

Status SaveWeights(LayerExecutor& executor, const std::string& path, bool write) {
  ZINF_ASSIGN_OR_RETURN(const GptDims d, GptOf(executor, "--save"));
  std::vector<std::vector<float>> units(d.units());
  std::vector<TensorToWrite> tensors;
  for (uint32_t u = 0; u < d.units(); ++u) {
    units[u].resize(d.UnitParams(u));
    ZINF_RETURN_IF_ERROR(executor.GetUnitWeights(u, units[u].data()));
    for (const TensorInfo& t : UnitTensors(d, u)) {
      std::vector<uint64_t> shape(t.shape.begin(), t.shape.end());
      tensors.push_back({t.name, Dtype::kF32, shape, units[u].data() + t.offset});
    }
  }
  if (!write) return Status::Ok();
  return WriteSafetensors(path, tensors, WeightsMetadata(d));
}

SafetensorsMetadata WeightsMetadata(const GptDims& d) {
  SafetensorsMetadata meta = {{"format", "pt"}, {"written_by", "zinf " ZINF_VERSION}};
  for (const SizeKey& k : kSizeKeys) meta[k.metadata_key] = std::to_string(d.*k.dim);
  return meta;
}

Result<RecordedModel> ReadRecordedModel(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  return RecordedIn(file);
}

Status LoadWeights(LayerExecutor& executor, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(const GptDims d, GptOf(executor, "--init"));
  ZINF_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  ZINF_ASSIGN_OR_RETURN(RecordedModel recorded, RecordedIn(file));
  for (const SizeKey& k : kSizeKeys) {
    const std::optional<uint32_t>& r = recorded.*k.recorded;
    if (r && static_cast<int64_t>(*r) != d.*k.dim) {
      return InvalidArgument(fmt::format(
          "{}: metadata {} {} disagrees with the model's zinf.model.{} {} ({}); expected the "
          "weights of the same model",
          path, k.metadata_key, *r, k.model_key, d.*k.dim, ModelText(d)));
    }
  }
  // Said with a shape error: where the model's sizes came from when the file has none.
  const std::string hint =
      recorded.empty() ? "; the file records no model sizes (metadata n_layer, n_embd, n_head, "
                         "block_size, vocab_size), so they are zinf.model's: give the file's "
                         "(zinf train: --layers --width --heads --seq-len --vocab)"
                       : "";
  std::set<std::string> known;
  std::vector<float> unit(d.MaxUnitParams());
  std::vector<uint8_t> raw;
  for (uint32_t u = 0; u < d.units(); ++u) {
    for (const TensorInfo& t : UnitTensors(d, u)) {
      known.insert(t.name);
      const SafetensorsTensor* st = file.Find(t.name);
      if (st == nullptr) {
        return InvalidArgument(fmt::format("{}: tensor {} is missing (the model of {} needs "
                                           "it){}", path, t.name, ModelText(d), hint));
      }
      std::vector<uint64_t> want(t.shape.begin(), t.shape.end());
      if (st->shape != want) {
        return InvalidArgument(fmt::format("{}: tensor {} has shape [{}], expected [{}] for the "
                                           "model of {}{}", path, t.name,
                                           fmt::join(st->shape, ", "), fmt::join(want, ", "),
                                           ModelText(d), hint));
      }
      float* dst = unit.data() + t.offset;
      if (st->dtype == Dtype::kF32) {
        ZINF_RETURN_IF_ERROR(file.Read(t.name, dst, 4 * t.elems));
      } else if (st->dtype == Dtype::kBF16 || st->dtype == Dtype::kF16) {
        raw.resize(2 * t.elems);
        ZINF_RETURN_IF_ERROR(file.Read(t.name, raw.data(), raw.size()));
        ZINF_RETURN_IF_ERROR(kernels::CastToF32(
            raw.data(), st->dtype == Dtype::kBF16 ? kernels::DType::kBf16 : kernels::DType::kF16,
            dst, t.elems));
      } else {
        return InvalidArgument(fmt::format("{}: tensor {} is {}, expected F32, BF16 or F16",
                                           path, t.name, DtypeName(st->dtype)));
      }
    }
    ZINF_RETURN_IF_ERROR(executor.SetUnitWeights(u, unit.data()));
  }
  for (const SafetensorsTensor& st : file.tensors()) {
    if (known.count(st.name) != 0) continue;
    if (st.name == "lm_head.weight" &&
        st.shape == std::vector<uint64_t>{static_cast<uint64_t>(d.V), static_cast<uint64_t>(d.C)}) {
      continue;  // tied to transformer.wte.weight
    }
    return InvalidArgument(fmt::format("{}: tensor {} is not part of the model (GPT-2 names, "
                                       "{}){}", path, st.name, ModelText(d), hint));
  }
  return Status::Ok();
}

}  // namespace zinf::train
