#include "kernels/cpu/cpu_features.h"

#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define ZINF_X86 1
#endif

namespace zinf::kernels {
namespace {

#ifdef ZINF_X86
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv with ecx = 0; encoded as bytes so no -mxsave is needed on this file.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

CpuFeatures Probe() {
  CpuFeatures f;
#ifdef ZINF_X86
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool avx = (ecx >> 28) & 1;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = ReadXcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;  // plus opmask, ZMM_Hi256, Hi16_ZMM
  if (!os_ymm) return f;
  f.fma = (ecx >> 12) & 1;
  f.f16c = (ecx >> 29) & 1;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) return f;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const unsigned max_subleaf = eax;
  f.avx2 = (ebx >> 5) & 1;
  if (os_zmm) {
    f.avx512f = (ebx >> 16) & 1;
    f.avx512dq = (ebx >> 17) & 1;
    f.avx512bw = (ebx >> 30) & 1;
    f.avx512vl = (ebx >> 31) & 1;
    if (max_subleaf >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      f.avx512_bf16 = (eax >> 5) & 1;
    }
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& DetectCpuFeatures() {
  static const CpuFeatures features = Probe();
  return features;
}

std::string DescribeCpuFeatures(const CpuFeatures& cpu) {
  std::string out;
  auto add = [&out](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += ' ';
    out += name;
  };
  add(cpu.avx2, "avx2");
  add(cpu.fma, "fma");
  add(cpu.f16c, "f16c");
  add(cpu.avx512f, "avx512f");
  add(cpu.avx512bw, "avx512bw");
  add(cpu.avx512vl, "avx512vl");
  add(cpu.avx512dq, "avx512dq");
  add(cpu.avx512_bf16, "avx512_bf16");
  return out.empty() ? std::string("none") : out;
}

}  // namespace zinf::kernels
