// kernels/cpu/cpu_features.h — what the CPU and the OS let the SIMD kernels use.
//
// Contract: DetectCpuFeatures reads cpuid once (cached) and checks XCR0, so a feature counts
// only when the OS also saves the registers it needs (AVX: YMM state; AVX-512: opmask and ZMM
// state). It never fails: a CPU without cpuid (non-x86) reports no features.
//
// Thread-safety: DetectCpuFeatures may be called from any thread.
#pragma once

#include <string>

namespace zinf::kernels {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;  // vcvtne2ps2bf16 and friends
};

const CpuFeatures& DetectCpuFeatures();

// "avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16" (those present).
std::string DescribeCpuFeatures(const CpuFeatures& cpu);

}  // namespace zinf::kernels
