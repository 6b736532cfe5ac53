#include "src/train/weights_io.h"

#include <set>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/cast.h"
#include "src/train/safetensors.h"

namespace zinf::train {

Status SaveWeights(LayerExecutor& executor, const std::string& path) {
  const GptDims& d = executor.dims();
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
  SafetensorsMetadata meta = {{"format", "pt"},
                              {"n_layer", std::to_string(d.L)},
                              {"n_embd", std::to_string(d.C)},
                              {"n_head", std::to_string(d.NH)},
                              {"vocab_size", std::to_string(d.V)},
                              {"block_size", std::to_string(d.seq)},
                              {"written_by", "zinf " ZINF_VERSION}};
  return WriteSafetensors(path, tensors, meta);
}

Status LoadWeights(LayerExecutor& executor, const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  const GptDims& d = executor.dims();
  std::set<std::string> known;
  std::vector<float> unit(d.MaxUnitParams());
  std::vector<uint8_t> raw;
  for (uint32_t u = 0; u < d.units(); ++u) {
    for (const TensorInfo& t : UnitTensors(d, u)) {
      known.insert(t.name);
      const SafetensorsTensor* st = file.Find(t.name);
      if (st == nullptr) {
        return InvalidArgument(fmt::format("{}: tensor {} is missing (the model of {} layers, "
                                           "width {} needs it)", path, t.name, d.L, d.C));
      }
      std::vector<uint64_t> want(t.shape.begin(), t.shape.end());
      if (st->shape != want) {
        return InvalidArgument(fmt::format("{}: tensor {} has shape [{}], expected [{}]", path,
                                           t.name, fmt::join(st->shape, ", "),
                                           fmt::join(want, ", ")));
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
                                       "{} layers)", path, st.name, d.L));
  }
  return Status::Ok();
}

}  // namespace zinf::train
