// The avx512 variant: AVX-512 F/BW/VL/DQ, bf16 rounding with integer ops (any AVX-512 CPU).
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c (kernels/CMakeLists.txt).
#define ZINF_NATIVE_BF16 0
#define ZINF_KERNELS_TABLE_NAME "avx512"
#define ZINF_KERNELS_ACCESSOR Avx512Kernels
#include "kernels/cpu/kernels_avx512.inc"
