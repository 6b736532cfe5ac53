// The avx512_bf16 variant: the avx512 variant with vcvtne2ps2bf16 for fp32 -> bf16.
// Compiled with the avx512 flags plus -mavx512bf16 (kernels/CMakeLists.txt).
#define ZINF_NATIVE_BF16 1
#define ZINF_KERNELS_TABLE_NAME "avx512_bf16"
#define ZINF_KERNELS_ACCESSOR Avx512Bf16Kernels
#include "kernels/cpu/kernels_avx512.inc"
