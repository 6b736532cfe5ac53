// NCCL's transport where no GPU answers (this machine, CI): every rank fails at once with a
// message naming the rank whose GPU does not answer and CUDA's words, never waiting for its
// timeout; a build without NCCL names what it lacks. Where GPUs answer, the gpu-labelled
// nccl_transport_gpu_test covers the transport itself.
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "src/base/cuda_probe.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/world.h"
#include "tests/comm/comm_test_util.h"

namespace zinf::comm {
namespace {

using testing::Env;
using testing::FreePort;
using testing::OnThreads;

TEST(NcclTransportTest, WithoutAGpuEveryRankFailsNamingTheRankAndCuda) {
  if (ProbeCuda().device_count > 0) GTEST_SKIP() << "GPUs answer here: nccl_transport_gpu_test";
  const uint16_t port = FreePort();
  CommOptions o;
  o.timeout = std::chrono::seconds(30);
  std::vector<Status> got(2);
  const auto t0 = std::chrono::steady_clock::now();
  OnThreads(2, [&](int r) {
    auto c = Connect(Env(r, 2, port), o, {.backend = CommBackend::kNccl, .cuda_ordinal = r});
    got[size_t(r)] = c.ok() ? Status::Ok() : c.status();
  });
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 15.0) << "a rank waited for its timeout instead of being told";
  for (int r = 0; r < 2; ++r) {
    const Status& s = got[size_t(r)];
    ASSERT_FALSE(s.ok()) << "rank " << r;
    if (NcclBuilt()) {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
      // Rank 0 names the first rank that cannot start: itself, GPU 0.
      EXPECT_NE(s.message().find(fmt::format("rank {}: NCCL cannot start: rank 0: GPU 0 does "
                                             "not answer: ",
                                             r)),
                std::string::npos)
          << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
      EXPECT_NE(s.message().find("this build of zinf has no NCCL transport"), std::string::npos)
          << s.ToString();
    }
  }
}

TEST(NcclTransportTest, TheVersionIsNcclsWhenBuilt) {
  if (!NcclBuilt()) {
    EXPECT_EQ(NcclVersion(), "");
    return;
  }
  EXPECT_TRUE(std::regex_match(NcclVersion(), std::regex(R"(2\.\d+\.\d+)"))) << NcclVersion();
}

TEST(NcclTransportTest, ARendezvousIsRequired) {
  auto t = ConnectNccl(nullptr, {}, 0, std::chrono::seconds(1));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(),
            NcclBuilt() ? StatusCode::kInvalidArgument : StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace zinf::comm
