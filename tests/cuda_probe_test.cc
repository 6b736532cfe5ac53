// The CUDA probe must answer on every machine: zero devices and a reason where no GPU answers.
#include "src/base/cuda_probe.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(CudaProbeTest, AnswersWithoutCrashing) {
  CudaProbe p = ProbeCuda();
  EXPECT_GE(p.device_count, 0);
  EXPECT_FALSE(p.detail.empty());
#ifdef ZINF_HAVE_CUDA
  EXPECT_TRUE(p.built_with_cuda);
  EXPECT_GT(p.runtime_version, 0);
#else
  EXPECT_FALSE(p.built_with_cuda);
#endif
}

TEST(CudaProbeTest, GpuReportsAtLeastOneDevice) {
  CudaProbe p = ProbeCuda();
  if (p.device_count == 0) GTEST_SKIP() << "no GPU answers: " << p.detail;
  EXPECT_NE(p.detail.find("sm_"), std::string::npos);
}

}  // namespace
}  // namespace zinf
