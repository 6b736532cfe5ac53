#include "kernels/cpu/variant.h"

#include <cstdlib>
#include <string>

namespace zinf::kernels {

std::string_view VariantName(KernelVariant variant) {
  switch (variant) {
    case KernelVariant::kAuto:
      return "auto";
    case KernelVariant::kScalar:
      return "scalar";
    case KernelVariant::kAvx2:
      return "avx2";
    case KernelVariant::kAvx512:
      return "avx512";
    case KernelVariant::kAvx512Bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

Result<KernelVariant> ParseVariant(std::string_view text) {
  for (KernelVariant v : {KernelVariant::kAuto, KernelVariant::kScalar, KernelVariant::kAvx2,
                          KernelVariant::kAvx512, KernelVariant::kAvx512Bf16}) {
    if (text == VariantName(v)) return v;
  }
  return InvalidArgument("unknown CPU kernel variant '" + std::string(text) +
                         "': expected auto, scalar, avx2, avx512 or avx512_bf16");
}

bool VariantSupported(KernelVariant variant, const CpuFeatures& cpu) {
  const bool avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
  const bool avx512 = avx2 && cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq;
  switch (variant) {
    case KernelVariant::kAuto:
    case KernelVariant::kScalar:
      return true;
    case KernelVariant::kAvx2:
      return avx2;
    case KernelVariant::kAvx512:
      return avx512;
    case KernelVariant::kAvx512Bf16:
      return avx512 && cpu.avx512_bf16;
  }
  return false;
}

KernelVariant BestVariant(const CpuFeatures& cpu) {
  for (KernelVariant v :
       {KernelVariant::kAvx512Bf16, KernelVariant::kAvx512, KernelVariant::kAvx2}) {
    if (VariantSupported(v, cpu)) return v;
  }
  return KernelVariant::kScalar;
}

Result<KernelVariant> ResolveVariant(KernelVariant requested, const CpuFeatures& cpu,
                                     const char* env_value) {
  std::string source = "requested";
  if (requested == KernelVariant::kAuto && env_value != nullptr && env_value[0] != '\0') {
    Result<KernelVariant> from_env = ParseVariant(env_value);
    if (!from_env.ok()) return from_env.status().WithContext(kVariantEnvVar);
    requested = *from_env;
    source = std::string("forced by ") + kVariantEnvVar;
  }
  if (requested == KernelVariant::kAuto) return BestVariant(cpu);
  if (!VariantSupported(requested, cpu)) {
    return FailedPrecondition(
        "CPU kernel variant '" + std::string(VariantName(requested)) + "' (" + source +
        ") is not supported by this CPU (features: " + DescribeCpuFeatures(cpu) +
        "); the best available is '" + std::string(VariantName(BestVariant(cpu))) + "'");
  }
  return requested;
}

Result<KernelVariant> ResolveVariant(KernelVariant requested) {
  return ResolveVariant(requested, DetectCpuFeatures(), std::getenv(kVariantEnvVar));
}

}  // namespace zinf::kernels
