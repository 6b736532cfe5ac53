// kernels/cpu/dtype.h — the element types the CPU kernels read and write.
//
// Contract: kF32 is IEEE binary32; kBf16 is bfloat16 (the upper half of a binary32); kF16 is
// IEEE binary16. 16-bit values travel as raw uint16_t bit patterns in memory.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zinf::kernels {

enum class DType : uint8_t { kF32 = 0, kBf16 = 1, kF16 = 2 };

// Bytes per element: 4, 2, 2.
size_t DTypeSize(DType type);
// "fp32", "bf16", "fp16".
std::string_view DTypeName(DType type);
// Accepts the names above (and "f32", "float32", "bfloat16", "f16", "float16", "half");
// returns false and leaves *out alone for anything else.
bool ParseDType(std::string_view text, DType* out);

}  // namespace zinf::kernels
