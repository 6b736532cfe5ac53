// kernels/cpu/variant.h — which SIMD implementation of the CPU kernels runs.
//
// Contract: kAuto means "the best one this CPU supports", unless the environment variable
// ZINF_ADAM_VARIANT names a variant (auto, scalar, avx2, avx512, avx512_bf16), which then
// applies to every kernel of this module called with kAuto. An explicit variant in the
// options wins over the environment. Asking for a variant the CPU lacks, explicitly or via the
// environment, is an error naming the variant and the features found; it never falls back.
//
//   scalar       portable C++ (baseline x86-64), the reference
//   avx2         AVX2 + FMA + F16C; bf16 conversions with integer ops
//   avx512       AVX-512 F/BW/VL/DQ (+FMA, F16C); bf16 conversions with integer ops
//   avx512_bf16  avx512 plus AVX512_BF16 conversion instructions (vcvtne2ps2bf16)
//
// Thread-safety: pure functions; ResolveVariant reads the environment (getenv).
#pragma once

#include <cstdint>
#include <string_view>

#include "kernels/cpu/cpu_features.h"
#include "zinf/status.h"

namespace zinf::kernels {

enum class KernelVariant : uint8_t { kAuto, kScalar, kAvx2, kAvx512, kAvx512Bf16 };

inline constexpr const char* kVariantEnvVar = "ZINF_ADAM_VARIANT";

std::string_view VariantName(KernelVariant variant);
// "auto", "scalar", "avx2", "avx512", "avx512_bf16"; anything else is InvalidArgument.
Result<KernelVariant> ParseVariant(std::string_view text);

// Whether `cpu` can run `variant` (kAuto: always).
bool VariantSupported(KernelVariant variant, const CpuFeatures& cpu);
// The fastest variant `cpu` supports.
KernelVariant BestVariant(const CpuFeatures& cpu);

// Turns a requested variant into the concrete one to run on `cpu`. `env_value` is the value of
// ZINF_ADAM_VARIANT (null or empty when unset) and is consulted only for kAuto.
Result<KernelVariant> ResolveVariant(KernelVariant requested, const CpuFeatures& cpu,
                                     const char* env_value);
// Same, for this machine and this process's environment.
Result<KernelVariant> ResolveVariant(KernelVariant requested);

}  // namespace zinf::kernels
