// tests/comm/rank_fault_cases.h — two faults every transport's tests drive the same way (NCCL's
// over GPUs and over the fake): a rank that joins and then stays silent, and a rank that
// leaves. Each runs two ranks on threads and hands back rank 0's all-reduce status and how long
// it waited; the assertions stay with each test.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "tests/comm/comm_test_util.h"

namespace zinf::comm::testing {

// Joins rank `rank` of 2 with the given timeout.
using JoinTwo = std::function<Result<std::unique_ptr<Communicator>>(
    int rank, std::chrono::milliseconds timeout)>;

struct FaultRun {
  Status got;         // rank 0's all-reduce
  double waited = 0;  // seconds rank 0 waited for it
};

// Rank 0's timed all-reduce of 1000 ones.
inline void TimedAllReduce(Communicator& c, FaultRun* run) {
  std::vector<float> v(1000, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  run->got = c.AllReduce(v.data(), DType::kF32, v.data(), DType::kF32, v.size()).Wait();
  run->waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 1 issues nothing until rank 0's all-reduce has ended.
inline FaultRun WithASilentRank(const JoinTwo& join, std::chrono::milliseconds timeout) {
  FaultRun run;
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
    auto c = join(r, timeout);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (r == 1) {
      while (!rank0_done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    TimedAllReduce(**c, &run);
  });
  return run;
}

// Rank 1 leaves once joined: its store connection closes as a dead process's would.
inline FaultRun WithARankGone(const JoinTwo& join, std::chrono::milliseconds timeout) {
  FaultRun run;
  OnThreads(2, [&](int r) {
    auto c = join(r, timeout);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (r == 1) {
      c->reset();
      return;
    }
    TimedAllReduce(**c, &run);
  });
  return run;
}

}  // namespace zinf::comm::testing
