// Elementwise CUDA ops: GELU, residual, add, fill, scale, and the 16-bit conversions
// (kernels/cuda/layer_ops.h). Grid-stride loops over size_t indices.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_util.cuh"
#include "kernels/cuda/layer_ops.h"

namespace zinf::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)

#define ZINF_GRID_STRIDE(i, n)                                                        \
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<size_t>(gridDim.x) * blockDim.x)

__global__ void GeluForwardKernel(float* out, const float* inp, size_t n) {
  ZINF_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(kGeluScale * (x + cube)));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, size_t n) {
  ZINF_GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    const float tanh_arg = kGeluScale * (x + cube);
    const float tanh_out = tanhf(tanh_arg);
    const float cosh_out = coshf(tanh_arg);
    const float sech_out = 1.0f / (cosh_out * cosh_out);
    const float local_grad = 0.5f * (1.0f + tanh_out) +
                             x * 0.5f * sech_out * kGeluScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

__global__ void ResidualKernel(float* out, const float* a, const float* b, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = a[i] + b[i]; }
}

__global__ void AddInPlaceKernel(float* dst, const float* src, size_t n) {
  ZINF_GRID_STRIDE(i, n) { dst[i] += src[i]; }
}

__global__ void FillKernel(float* out, float value, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = value; }
}

__global__ void ScaleKernel(float* x, float s, size_t n) {
  ZINF_GRID_STRIDE(i, n) { x[i] *= s; }
}

// The conversions of kernels/cpu/half_convert.h, integer arithmetic only.
__device__ __forceinline__ uint16_t DevFloatToBf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}

__device__ __forceinline__ uint16_t DevFloatToF16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);
  const uint32_t exponent = a >> 23;
  const uint32_t mantissa = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - exponent;
  uint32_t units = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (units & 1u))) ++units;
  return static_cast<uint16_t>(sign | units);
}

__device__ __forceinline__ float DevF16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    return __uint_as_float(sign | 0x7f800000u | (mantissa << 13) |
                           (mantissa != 0 ? 0x400000u : 0u));
  }
  if (exponent != 0) return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return __uint_as_float(sign);
  uint32_t e = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return __uint_as_float(sign | (e << 23) | ((mantissa & 0x3ffu) << 13));
}

__global__ void Bf16ToFloatKernel(float* out, const uint16_t* in, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = __uint_as_float(static_cast<uint32_t>(in[i]) << 16); }
}

__global__ void Fp16ToFloatKernel(float* out, const uint16_t* in, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = DevF16ToFloat(in[i]); }
}

__global__ void FloatToBf16Kernel(uint16_t* out, const float* in, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = DevFloatToBf16(in[i]); }
}

__global__ void FloatToFp16Kernel(uint16_t* out, const float* in, size_t n) {
  ZINF_GRID_STRIDE(i, n) { out[i] = DevFloatToF16(in[i]); }
}

}  // namespace

#define ZINF_LAUNCH_ELEMENTWISE(op, kernel, n, stream, ...)                             \
  do {                                                                                  \
    if ((n) == 0) return Status::Ok();                                                  \
    kernel<<<GridFor((n), kThreads), kThreads, 0, AsStream(stream)>>>(__VA_ARGS__, (n)); \
    return LaunchStatus(op);                                                            \
  } while (0)

Status GeluForward(float* out, const float* inp, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("GeluForward", GeluForwardKernel, n, stream, out, inp);
}

Status GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("GeluBackward", GeluBackwardKernel, n, stream, dinp, inp, dout);
}

Status ResidualForward(float* out, const float* a, const float* b, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("ResidualForward", ResidualKernel, n, stream, out, a, b);
}

Status AddInPlace(float* dst, const float* src, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("AddInPlace", AddInPlaceKernel, n, stream, dst, src);
}

Status Fill(float* out, float value, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("Fill", FillKernel, n, stream, out, value);
}

Status Scale(float* x, float s, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("Scale", ScaleKernel, n, stream, x, s);
}

Status Bf16ToFloat(float* out, const uint16_t* in, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("Bf16ToFloat", Bf16ToFloatKernel, n, stream, out, in);
}

Status Fp16ToFloat(float* out, const uint16_t* in, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("Fp16ToFloat", Fp16ToFloatKernel, n, stream, out, in);
}

Status FloatToBf16(uint16_t* out, const float* in, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("FloatToBf16", FloatToBf16Kernel, n, stream, out, in);
}

Status FloatToFp16(uint16_t* out, const float* in, size_t n, void* stream) {
  ZINF_LAUNCH_ELEMENTWISE("FloatToFp16", FloatToFp16Kernel, n, stream, out, in);
}

}  // namespace zinf::kernels::cuda
