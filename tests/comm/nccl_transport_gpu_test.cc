// NCCL's transport on GPUs (label gpu; skipped without NCCL or with fewer than 2 GPUs: NCCL
// refuses two ranks on one GPU). Ranks are threads of this process, one GPU each, joined through
// the TCP store and Gloo as `zinf launch` ranks are. The collectives give the same bits as over
// Gloo and as one rank; a silent rank fails the other within the timeout; a rank gone is named
// before it; two ranks on one GPU are refused naming it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "src/base/cuda_probe.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/world.h"
#include "tests/comm/comm_test_util.h"

namespace zinf::comm {
namespace {

using std::chrono::seconds;
using testing::Env;
using testing::FreePort;
using testing::OnThreads;
using Clock = std::chrono::steady_clock;

int Gpus() { return NcclBuilt() ? ProbeCuda().device_count : 0; }

CommOptions Options(seconds timeout) {
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

TEST(NcclGpuTest, ASilentRankFailsTheOtherWithinTheTimeout) {
  if (Gpus() < 2) GTEST_SKIP() << "needs NCCL and 2 GPUs";
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  double waited = 0;
  std::atomic<bool> rank0_done{false};
  OnThreads(2, [&](int r) {
    // Rank 0 says it is done however it leaves (a failed ASSERT returns early).
    struct Done {
      std::atomic<bool>* flag;
      bool mine;
      ~Done() {
        if (mine) *flag = true;
      }
    } done{&rank0_done, r == 0};
    auto c = Connect(Env(r, 2, port), Options(seconds(5)), OnGpu(r));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (r == 1) {  // issues nothing until rank 0 has given up
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    std::vector<float> v(1000, 1.0f);
    const auto t0 = Clock::now();
    got[0] = (*c)->AllReduce(v.data(), DType::kF32, v.data(), DType::kF32, v.size()).Wait();
    waited = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  ASSERT_FALSE(got[0].ok());
  EXPECT_EQ(got[0].code(), StatusCode::kAborted) << got[0].ToString();
  // While "starting a transfer" (NCCL connects to a peer lazily) or "moving a step's data".
  EXPECT_NE(got[0].message().find("no answer from rank 1 within 5 s while "), std::string::npos)
      << got[0].ToString();
  EXPECT_LT(waited, 15.0);
}

TEST(NcclGpuTest, ARankGoneIsNamedBeforeTheTimeout) {
  if (Gpus() < 2) GTEST_SKIP() << "needs NCCL and 2 GPUs";
  const uint16_t port = FreePort();
  Status got;
  double waited = 0;
  OnThreads(2, [&](int r) {
    auto c = Connect(Env(r, 2, port), Options(seconds(60)), OnGpu(r));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (r == 1) {  // leaves: its store connection closes as a dead process's would
      c->reset();
      return;
    }
    std::vector<float> v(1000, 1.0f);
    const auto t0 = Clock::now();
    got = (*c)->AllReduce(v.data(), DType::kF32, v.data(), DType::kF32, v.size()).Wait();
    waited = std::chrono::duration<double>(Clock::now() - t0).count();
  });
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), StatusCode::kUnavailable) << got.ToString();
  EXPECT_NE(got.message().find("rank 1 exited or died"), std::string::npos) << got.ToString();
  EXPECT_LT(waited, 10.0);
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
