// The NCCL transport's own code (src/comm/nccl_transport.cc, nccl_setup.cc) over the fake CUDA
// and NCCL of tests/comm/fake_nccl/, ranks as threads joined through the TCP store and Gloo as
// `zinf launch` ranks are: what nccl_transport_gpu_test checks on GPUs, checked on every machine
// and under the sanitizers. The fake records every breach of CUDA's and NCCL's rules it can see
// (work queued on a stream while NCCL starts a call, pageable copies): no test here may make one,
// and the last test shows the record is not blind.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "src/comm/gloo_transport.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/p2p_communicator.h"
#include "tests/comm/comm_test_util.h"
#include "tests/comm/rank_fault_cases.h"
#include "tests/comm/fake_nccl/cuda_runtime.h"
#include "tests/comm/fake_nccl/fake_nccl_control.h"
#include "tests/comm/fake_nccl/nccl.h"

namespace zinf::comm {
namespace {

using std::chrono::milliseconds;
using testing::Env;
using testing::FreePort;
using testing::OnThreads;

class FakeNcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_nccl::SetDeviceCount(8);
    fake_nccl::ClearBreaches();
  }
  void TearDown() override { EXPECT_EQ(fake_nccl::Breaches(), std::vector<std::string>{}); }
};

Result<std::unique_ptr<Transport>> Join(int rank, int world, uint16_t port, int gpu,
                                        milliseconds timeout,
                                        size_t staging_cap = kNcclStagingCap) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Transport> rdv,
                        ConnectGloo(Env(rank, world, port), timeout));
  return ConnectNccl(std::move(rdv), {}, gpu, timeout, staging_cap);
}

CommOptions Options(milliseconds timeout) {
  CommOptions o;
  o.timeout = timeout;
  o.piece_bytes = 1000;
  return o;
}

Result<std::unique_ptr<Communicator>> JoinComm(int rank, int world, uint16_t port,
                                               const CommOptions& o,
                                               size_t staging_cap = kNcclStagingCap) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                        Join(rank, world, port, rank, o.timeout, staging_cap));
  return P2PCommunicator::Create(std::move(t), o);
}

class FakeNcclWorldTest : public FakeNcclTest, public ::testing::WithParamInterface<int> {};

TEST_P(FakeNcclWorldTest, CollectivesMatchGlooAndOneRankBitForBit) {
  const int w = GetParam();
  const uint16_t port = FreePort();
  testing::CheckCollectivesBitForBit(
      w, [&](int r) { return JoinComm(r, w, port, Options(milliseconds(30000))); },
      "nccl 2.28.0 GPU ");
}

INSTANTIATE_TEST_SUITE_P(Worlds, FakeNcclWorldTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST_F(FakeNcclTest, TwoRanksOnOneGpuAreRefusedNamingIt) {
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    auto t = Join(r, 2, port, /*gpu=*/0, milliseconds(30000));
    got[size_t(r)] = t.ok() ? Status::Ok() : t.status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[size_t(r)].code(), StatusCode::kFailedPrecondition) << got[size_t(r)].ToString();
    EXPECT_NE(got[size_t(r)].message().find(
                  "NCCL cannot start: rank 1: it uses the GPU at PCI 0000:01:00.0 as rank 0 does"),
              std::string::npos)
        << got[size_t(r)].ToString();
  }
}

TEST_F(FakeNcclTest, NcclCommBlockingIsRefusedOnEveryRank) {
  ::setenv("NCCL_COMM_BLOCKING", "1", 1);
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    auto t = Join(r, 2, port, r, milliseconds(30000));
    got[size_t(r)] = t.ok() ? Status::Ok() : t.status();
  });
  ::unsetenv("NCCL_COMM_BLOCKING");
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(got[size_t(r)].message().find("NCCL cannot start: rank 0: NCCL_COMM_BLOCKING=1 is "
                                            "set"),
              std::string::npos)
        << got[size_t(r)].ToString();
  }
}

testing::JoinTwo OverTheFake(uint16_t port) {
  return [port](int r, milliseconds timeout) { return JoinComm(r, 2, port, Options(timeout)); };
}

TEST_F(FakeNcclTest, ASilentRankFailsTheOtherAtTheTimeout) {
  const testing::FaultRun run =
      testing::WithASilentRank(OverTheFake(FreePort()), milliseconds(4000));
  EXPECT_EQ(run.got.code(), StatusCode::kAborted) << run.got.ToString();
  // On GPUs the first transfer toward a silent peer may stay "starting" instead (NCCL connects
  // lazily); the fake starts it at once.
  EXPECT_NE(run.got.message().find("rank 0: no answer from rank 1 within 4 s while "),
            std::string::npos)
      << run.got.ToString();
  EXPECT_GE(run.waited, 3.9);
  EXPECT_LT(run.waited, 15.0);
}

TEST_F(FakeNcclTest, ARankGoneIsNamedLongBeforeTheTimeout) {
  const testing::FaultRun run =
      testing::WithARankGone(OverTheFake(FreePort()), milliseconds(60000));
  EXPECT_EQ(run.got.code(), StatusCode::kUnavailable) << run.got.ToString();
  EXPECT_NE(run.got.message().find("rank 0: rank 1 exited or died (its store connection closed)"),
            std::string::npos)
      << run.got.ToString();
  EXPECT_LT(run.waited, 10.0);
}

// Each transfer carries its step's tag and size: NCCL matches transfers by order, so a receive
// of another size, or of another step, would otherwise hand over the wrong bytes.
struct RawRun {
  std::vector<Status> got = std::vector<Status>(2);
};

// Rank 0 sends `sends` (tag, bytes) in order, rank 1 receives `recvs` in order; each rank then
// waits for its steps in order. Neither leaves before both are done (a rank gone is another
// test).
RawRun Exchanges(const std::vector<std::pair<uint64_t, size_t>>& sends,
                 const std::vector<std::pair<uint64_t, size_t>>& recvs, milliseconds timeout) {
  RawRun run;
  const uint16_t port = FreePort();
  std::atomic<int> done{0};
  OnThreads(2, [&](int r) {
    struct Leave {
      std::atomic<int>* done;
      ~Leave() {
        ++*done;
        while (*done < 2) std::this_thread::sleep_for(milliseconds(5));
      }
    };
    auto t = Join(r, 2, port, r, timeout);
    Leave leave{&done};  // destroyed before t
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::vector<std::vector<char>> bufs;
    const auto& mine = r == 0 ? sends : recvs;
    for (const auto& [tag, bytes] : mine) {
      bufs.emplace_back(bytes, char(tag));
      const SendOp s{1, bufs.back().data(), bytes};
      const RecvOp v{0, bufs.back().data(), bytes};
      Status posted = r == 0 ? (*t)->Post(tag, {&s, 1}, {}) : (*t)->Post(tag, {}, {&v, 1});
      if (!posted.ok()) {
        run.got[size_t(r)] = posted;
        return;
      }
    }
    for (const auto& step : mine) {
      Status s = (*t)->Wait(step.first, timeout);
      if (!s.ok()) {
        run.got[size_t(r)] = s;
        (*t)->Cancel();
        return;
      }
    }
  });
  return run;
}

TEST_F(FakeNcclTest, AReceiveOfAnotherSizeIsNamed) {
  RawRun run = Exchanges({{5, 200}}, {{5, 100}}, milliseconds(30000));
  EXPECT_TRUE(run.got[0].ok()) << run.got[0].ToString();
  EXPECT_EQ(run.got[1].code(), StatusCode::kInternal) << run.got[1].ToString();
  EXPECT_NE(run.got[1].message().find("rank 1: rank 0 sent step 5 (200 bytes) where this rank "
                                      "expected step 5 (100 bytes)"),
            std::string::npos)
      << run.got[1].ToString();
}

TEST_F(FakeNcclTest, ALargerReceiveThanTheSendEndsAtTheTimeout) {
  RawRun run = Exchanges({{5, 100}}, {{5, 200}}, milliseconds(2000));
  EXPECT_EQ(run.got[1].code(), StatusCode::kAborted) << run.got[1].ToString();
  EXPECT_NE(run.got[1].message().find("no answer from rank 0 within 2 s"), std::string::npos)
      << run.got[1].ToString();
}

TEST_F(FakeNcclTest, StepsPostedInAnotherOrderAreNamed) {
  RawRun run = Exchanges({{1, 100}, {2, 100}}, {{2, 100}, {1, 100}}, milliseconds(30000));
  EXPECT_EQ(run.got[1].code(), StatusCode::kInternal) << run.got[1].ToString();
  EXPECT_NE(run.got[1].message().find("rank 1: rank 0 sent step 1 (100 bytes) where this rank "
                                      "expected step 2 (100 bytes)"),
            std::string::npos)
      << run.got[1].ToString();
}

// Whether a rank's output overlaps its input changes how Gloo's schedule posts its steps; over
// NCCL the communicator keeps one schedule on every rank, so one rank in place and one not
// still sum right.
TEST_F(FakeNcclTest, OneRankInPlaceAndOneNotSumRight) {
  const uint16_t port = FreePort();
  const size_t n = 6001;
  std::vector<std::vector<float>> in(2), out(2, std::vector<float>(n));
  for (int r = 0; r < 2; ++r)
    for (size_t i = 0; i < n; ++i) in[size_t(r)].push_back(float((i * 13 + size_t(r) * 7) % 101));
  const std::vector<float> in0 = in[0], in1 = in[1];
  OnThreads(2, [&](int r) {
    auto c = JoinComm(r, 2, port, Options(milliseconds(30000)));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    float* dst = r == 0 ? in[0].data() : out[1].data();  // rank 0 in place
    ASSERT_TRUE((*c)->AllReduce(in[size_t(r)].data(), DType::kF32, dst, DType::kF32, n)
                    .Wait()
                    .ok());
  });
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(in[0][i], in0[i] + in1[i]) << i;
    ASSERT_EQ(out[1][i], in0[i] + in1[i]) << i;
  }
}

TEST_F(FakeNcclTest, ARankWhoseGpuDoesNotAnswerIsNamedByEveryRank) {
  fake_nccl::SetDeviceCount(1);
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    auto t = Join(r, 2, port, r, milliseconds(30000));
    got[size_t(r)] = t.ok() ? Status::Ok() : t.status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(got[size_t(r)].message().find("NCCL cannot start: rank 1: GPU 1 does not answer: "
                                            "invalid device ordinal (cudaErrorInvalidDevice)"),
              std::string::npos)
        << got[size_t(r)].ToString();
  }
}

// A reduce-scatter posting 15 pieces ahead: the staging stops growing at its cap (the oldest
// steps complete first), and the sums are still exact.
TEST_F(FakeNcclTest, StagingStopsGrowingAtItsCap) {
  const size_t count = size_t{1} << 20;  // floats per rank: 4 MiB, in pieces of 256 KiB
  auto run = [&](size_t cap, uint64_t* peak) {
    const uint16_t port = FreePort();
    fake_nccl::ResetPinnedPeak();
    const uint64_t before = fake_nccl::PinnedBytes();
    std::vector<std::vector<float>> in(2), out(2, std::vector<float>(count));
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < 2 * count; ++i) in[size_t(r)].push_back(float((i * 7 + size_t(r)) % 1000));
    OnThreads(2, [&](int r) {
      CommOptions o = Options(milliseconds(30000));
      o.piece_bytes = 256 << 10;
      o.pipeline_depth = 16;  // 15 steps ahead
      auto c = JoinComm(r, 2, port, o, cap);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_TRUE((*c)->ReduceScatter(in[size_t(r)].data(), DType::kF32, out[size_t(r)].data(),
                                      DType::kF32, count)
                      .Wait()
                      .ok());
    });
    for (int r = 0; r < 2; ++r)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(out[size_t(r)][i], in[0][size_t(r) * count + i] + in[1][size_t(r) * count + i]);
    *peak = fake_nccl::PinnedPeakBytes() - before;
  };
  uint64_t capped = 0, uncapped = 0;
  run(size_t{2} << 20, &capped);
  run(kNcclStagingCap, &uncapped);
  EXPECT_LE(capped, uint64_t{2} * (2u << 20)) << "two ranks, 2 MiB each";
  EXPECT_GT(uncapped, uint64_t{2} * (8u << 20)) << "without the cap every piece held its block";
}

// The communicator runs steps on its caller's thread: the transport's GPU is current only
// during its calls.
TEST_F(FakeNcclTest, TheCallersGpuIsGivenBack) {
  const uint16_t port = FreePort();
  std::vector<int> after(2, -1);
  std::vector<int> after_close(2, -1);
  OnThreads(2, [&](int r) {
    ASSERT_EQ(cudaSetDevice(5 + r), cudaSuccess);
    {
      // The transport driven on this thread (no communicator thread in between).
      auto t = Join(r, 2, port, r, milliseconds(30000));
      ASSERT_TRUE(t.ok()) << t.status().ToString();
      std::vector<float> v(100, float(r)), w(100);
      const SendOp s{1 - r, v.data(), v.size() * 4};
      const RecvOp g{1 - r, w.data(), w.size() * 4};
      ASSERT_TRUE((*t)->Exchange(7, {&s, 1}, {&g, 1}, milliseconds(30000)).ok());
      EXPECT_EQ(w[0], float(1 - r));
      after[size_t(r)] = fake_nccl::CurrentDevice();
    }
    after_close[size_t(r)] = fake_nccl::CurrentDevice();
  });
  EXPECT_EQ(after, (std::vector<int>{5, 6}));
  EXPECT_EQ(after_close, (std::vector<int>{5, 6}));
}

// NCCL's own collectives (bench-comm's baseline), staged the same way.
TEST_F(FakeNcclTest, NcclsOwnCollectivesAgree) {
  const uint16_t port = FreePort();
  const size_t n = 1000;
  std::vector<std::vector<float>> ar(2), ag(2, std::vector<float>(2 * n)),
      rs(2, std::vector<float>(n));
  OnThreads(2, [&](int r) {
    auto t = Join(r, 2, port, r, milliseconds(30000));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    std::vector<float> mine(2 * n);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = float(i + 1000 * size_t(r));
    ar[size_t(r)] = mine;
    ASSERT_TRUE(NcclRaw::AllReduce(**t, ar[size_t(r)].data(), 2 * n).ok());
    ASSERT_TRUE(NcclRaw::AllGather(**t, mine.data(), ag[size_t(r)].data(), n).ok());
    ASSERT_TRUE(NcclRaw::ReduceScatter(**t, mine.data(), rs[size_t(r)].data(), n).ok());
  });
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < 2 * n; ++i) ASSERT_EQ(ar[size_t(r)][i], float(2 * i + 1000));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(ag[size_t(r)][i], float(i));
      ASSERT_EQ(ag[size_t(r)][n + i], float(i + 1000));
      ASSERT_EQ(rs[size_t(r)][i], float(2 * (size_t(r) * n + i) + 1000));
    }
  }
}

// The fake sees what NCCL and CUDA forbid: work queued on a stream while its communicator is
// still starting a call, and a copy from pageable memory.
TEST(FakeNcclRulesTest, WorkQueuedWhileStartingAndPageableCopiesAreRecorded) {
  fake_nccl::SetDeviceCount(8);
  fake_nccl::ClearBreaches();
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclInProgress);
  ncclResult_t state = ncclInProgress;
  ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  ASSERT_EQ(state, ncclSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, 64, cudaHostAllocDefault), cudaSuccess);
  std::vector<char> dev(64), pageable(64);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclSend(dev.data(), 8, ncclUint8, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclRecv(dev.data() + 8, 8, ncclUint8, 0, comm, stream), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclInProgress);
  EXPECT_EQ(cudaMemcpyAsync(pinned, dev.data(), 8, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(fake_nccl::Breaches().size(), 1u);
  EXPECT_NE(fake_nccl::Breaches()[0].find("queued a copy on a stream whose NCCL communicator is "
                                          "still starting a call"),
            std::string::npos);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclSend(dev.data(), 8, ncclUint8, 0, comm, stream), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);  // NCCL refuses a call while one is starting
  do {
    ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  } while (state == ncclInProgress);
  EXPECT_EQ(cudaMemcpyAsync(pageable.data(), dev.data(), 8, cudaMemcpyDeviceToHost, stream),
            cudaSuccess);
  ASSERT_EQ(fake_nccl::Breaches().size(), 3u);
  EXPECT_NE(fake_nccl::Breaches()[2].find("pageable"), std::string::npos);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(ncclCommAbort(comm), ncclSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(pinned), cudaSuccess);
  fake_nccl::ClearBreaches();
}

}  // namespace
}  // namespace zinf::comm
