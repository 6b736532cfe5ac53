#include "kernels/cpu/dtype.h"

namespace zinf::kernels {

size_t DTypeSize(DType type) { return type == DType::kF32 ? 4 : 2; }

std::string_view DTypeName(DType type) {
  switch (type) {
    case DType::kF32:
      return "fp32";
    case DType::kBf16:
      return "bf16";
    case DType::kF16:
      return "fp16";
  }
  return "unknown";
}

bool ParseDType(std::string_view text, DType* out) {
  if (text == "fp32" || text == "f32" || text == "float32") {
    *out = DType::kF32;
  } else if (text == "bf16" || text == "bfloat16") {
    *out = DType::kBf16;
  } else if (text == "fp16" || text == "f16" || text == "float16" || text == "half") {
    *out = DType::kF16;
  } else {
    return false;
  }
  return true;
}

}  // namespace zinf::kernels
