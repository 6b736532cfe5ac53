// bench/deepspeed_shim/torch/extension.h — just enough of <torch/extension.h> for DeepSpeed's
// csrc/includes/cpu_adam.h and simd.h to compile without torch (bench/adam_vs_deepspeed.cc
// uses their fp32 Step_AVX only): the 16-bit element types as plain 16-bit structs and an
// incomplete torch::Tensor for the declarations that name it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace c10 {
struct Half {
  uint16_t x;
};
struct BFloat16 {
  uint16_t x;
};
}  // namespace c10

namespace torch {
class Tensor;
}  // namespace torch
