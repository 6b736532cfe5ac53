// NCCL's transport on GPUs (label gpu; skipped without NCCL or with fewer than 2 GPUs: NCCL
// refuses two ranks on one GPU). Ranks are threads of this process, one GPU each, joined through
// the TCP store and Gloo as `zinf launch` ranks are. The collectives give the same bits as over
// Gloo and as one rank; a silent rank fails the other within the timeout; a rank gone is named
// before it; two ranks on one GPU are refused naming it.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "src/base/cuda_probe.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/world.h"
#include "tests/comm/comm_test_util.h"
#include "tests/comm/rank_fault_cases.h"

namespace zinf::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Env;
using testing::FreePort;
using testing::OnThreads;

int Gpus() { return NcclBuilt() ? ProbeCuda().device_count : 0; }

CommOptions Options(milliseconds timeout) {
  CommOptions o;
  o.timeout = timeout;
  o.piece_bytes = 1000;
  return o;
}

Link OnGpu(int ordinal) { return {.backend = CommBackend::kNccl, .cuda_ordinal = ordinal}; }

class NcclGpuWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(NcclGpuWorldTest, CollectivesMatchGlooAndOneRankBitForBit) {
  const int w = GetParam();
  if (Gpus() < w) GTEST_SKIP() << "needs NCCL and " << w << " GPUs; " << Gpus() << " here";
  const uint16_t port = FreePort();
  testing::CheckCollectivesBitForBit(
      w, [&](int r) { return Connect(Env(r, w, port), Options(seconds(60)), OnGpu(r)); },
      "nccl ");
}

INSTANTIATE_TEST_SUITE_P(Worlds, NcclGpuWorldTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

testing::JoinTwo OnGpus(uint16_t port) {
  return [port](int r, milliseconds timeout) {
    return Connect(Env(r, 2, port), Options(timeout), OnGpu(r));
  };
}

TEST(NcclGpuTest, ASilentRankFailsTheOtherWithinTheTimeout) {
  if (Gpus() < 2) GTEST_SKIP() << "needs NCCL and 2 GPUs";
  const testing::FaultRun run = testing::WithASilentRank(OnGpus(FreePort()), seconds(5));
  ASSERT_FALSE(run.got.ok());
  EXPECT_EQ(run.got.code(), StatusCode::kAborted) << run.got.ToString();
  // While "starting a transfer" (NCCL connects to a peer lazily) or "moving a step's data".
  EXPECT_NE(run.got.message().find("no answer from rank 1 within 5 s while "), std::string::npos)
      << run.got.ToString();
  EXPECT_LT(run.waited, 15.0);
}

TEST(NcclGpuTest, ARankGoneIsNamedBeforeTheTimeout) {
  if (Gpus() < 2) GTEST_SKIP() << "needs NCCL and 2 GPUs";
  const testing::FaultRun run = testing::WithARankGone(OnGpus(FreePort()), seconds(60));
  ASSERT_FALSE(run.got.ok());
  EXPECT_EQ(run.got.code(), StatusCode::kUnavailable) << run.got.ToString();
  EXPECT_NE(run.got.message().find("rank 1 exited or died"), std::string::npos)
      << run.got.ToString();
  EXPECT_LT(run.waited, 10.0);
}

TEST(NcclGpuTest, TwoRanksOnOneGpuAreRefusedNamingIt) {
  if (Gpus() < 1) GTEST_SKIP() << "needs NCCL and a GPU";
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    auto c = Connect(Env(r, 2, port), Options(seconds(30)), OnGpu(0));
    got[size_t(r)] = c.ok() ? Status::Ok() : c.status();
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(got[size_t(r)].ok()) << "rank " << r;
    EXPECT_NE(got[size_t(r)].message().find("NCCL cannot start: rank 1: it uses the GPU at PCI"),
              std::string::npos)
        << got[size_t(r)].ToString();
  }
}

}  // namespace
}  // namespace zinf::comm
