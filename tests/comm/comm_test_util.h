// tests/comm/comm_test_util.h — running one function per rank on threads, for the collectives'
// tests over the local transport, Gloo and NCCL; the collectives' bit-for-bit check every
// transport passes.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "src/comm/communicator.h"
#include "src/comm/local_transport.h"
#include "src/comm/p2p_communicator.h"
#include "src/comm/tcp_store.h"
#include "src/comm/world.h"

namespace zinf::comm::testing {

// A port free a moment ago on 127.0.0.1 (for a store rank 0 serves).
inline uint16_t FreePort() {
  auto s = TcpStoreServer::Start("127.0.0.1", 0);
  return s.ok() ? (*s)->port() : 0;
}

// Rank `rank` of `world` on one node, its store on 127.0.0.1:port.
inline WorldEnv Env(int rank, int world, uint16_t port) {
  WorldEnv e;
  e.rank = e.local_rank = rank;
  e.world = e.local_world = world;
  e.master_port = port;
  e.run_id = "test";
  return e;
}

// Runs fn(rank) on `world` threads and joins them.
inline void OnThreads(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r) ts.emplace_back([&fn, r] { fn(r); });
  for (auto& t : ts) t.join();
}

// A world of local communicators (threads as ranks).
struct LocalWorld {
  explicit LocalWorld(int world, CommOptions o = {}) : group(world) {
    for (int r = 0; r < world; ++r) comms.push_back(P2PCommunicator::Create(group.Join(r), o));
  }
  LocalGroup group;
  std::vector<std::unique_ptr<Communicator>> comms;
};

// Every collective over `w` ranks, each rank's communicator from connect(rank): fp32 and
// bf16-into-fp32 reductions equal, bit for bit, the rank-ordered sums one rank would make, the
// all-gather the same on every rank, the reduce-scatter's bytes (w - 1) × count × 4. Each
// communicator's Describe() contains `describes`.
inline void CheckCollectivesBitForBit(
    int w, const std::function<Result<std::unique_ptr<Communicator>>(int rank)>& connect,
    std::string_view describes) {
  const size_t count = 3001;  // per rank, odd
  std::vector<std::vector<float>> in(static_cast<size_t>(w)), rs(static_cast<size_t>(w)), ar(static_cast<size_t>(w)), ag(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    in[size_t(r)].resize(count * static_cast<size_t>(w));
    for (size_t i = 0; i < in[size_t(r)].size(); ++i)
      in[size_t(r)][i] = std::ldexp(float(i % 97) - 48.5f, int((i + size_t(r)) % 17) - 8);
    rs[size_t(r)].resize(count);
    ar[size_t(r)].resize(count * static_cast<size_t>(w));
    ag[size_t(r)].resize(count * static_cast<size_t>(w) * static_cast<size_t>(w));
  }
  // bf16 into fp32 (what the gradients' reduce-scatter sums): the first peer's pieces land in
  // the back of each piece's place in the output while later pieces are still arriving.
  std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(w));
  std::vector<std::vector<float>> rs16(static_cast<size_t>(w)), ar16(static_cast<size_t>(w));
  for (int r = 0; r < w; ++r) {
    for (float v : in[size_t(r)]) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      in16[size_t(r)].push_back(uint16_t(bits >> 16));
    }
    rs16[size_t(r)].resize(count);
    ar16[size_t(r)].resize(count * static_cast<size_t>(w));
  }
  auto widen = [](uint16_t h) {
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  };
  std::vector<CommStats> stats(static_cast<size_t>(w));
  OnThreads(w, [&](int r) {
    auto c = connect(r);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto& comm = **c;
    EXPECT_NE(comm.Describe().find(describes), std::string::npos) << comm.Describe();
    ASSERT_TRUE(comm.ReduceScatter(in[size_t(r)].data(), DType::kF32, rs[size_t(r)].data(),
                                   DType::kF32, count).Wait().ok());
    ASSERT_TRUE(comm.AllReduce(in[size_t(r)].data(), DType::kF32, ar[size_t(r)].data(),
                               DType::kF32, count * static_cast<size_t>(w)).Wait().ok());
    ASSERT_TRUE(comm.AllGather(in[size_t(r)].data(), ag[size_t(r)].data(), count * static_cast<size_t>(w),
                               DType::kF32).Wait().ok());
    ASSERT_TRUE(comm.Barrier().Wait().ok());
    stats[size_t(r)] = comm.stats();
    ASSERT_TRUE(comm.ReduceScatter(in16[size_t(r)].data(), DType::kBf16, rs16[size_t(r)].data(),
                                   DType::kF32, count).Wait().ok());
    ASSERT_TRUE(comm.AllReduce(in16[size_t(r)].data(), DType::kBf16, ar16[size_t(r)].data(),
                               DType::kF32, count * static_cast<size_t>(w)).Wait().ok());
  });
  for (int r = 0; r < w; ++r) {
    for (size_t i = 0; i < count; ++i) {
      float s = 0;
      for (int p = 0; p < w; ++p) s = s + in[size_t(p)][size_t(r) * count + i];
      ASSERT_EQ(std::memcmp(&rs[size_t(r)][i], &s, 4), 0);
    }
    for (size_t i = 0; i < count * static_cast<size_t>(w); ++i) {
      float s = 0;
      for (int p = 0; p < w; ++p) s = s + in[size_t(p)][i];
      ASSERT_EQ(std::memcmp(&ar[size_t(r)][i], &s, 4), 0);
    }
    for (size_t i = 0; i < count; ++i) {
      float s = 0;
      for (int p = 0; p < w; ++p) s = s + widen(in16[size_t(p)][size_t(r) * count + i]);
      ASSERT_EQ(std::memcmp(&rs16[size_t(r)][i], &s, 4), 0) << "bf16 reduce-scatter, rank " << r;
    }
    for (size_t i = 0; i < count * static_cast<size_t>(w); ++i) {
      float s = 0;
      for (int p = 0; p < w; ++p) s = s + widen(in16[size_t(p)][i]);
      ASSERT_EQ(std::memcmp(&ar16[size_t(r)][i], &s, 4), 0) << "bf16 all-reduce, rank " << r;
    }
    EXPECT_EQ(ag[size_t(r)], ag[0]);
    EXPECT_EQ(stats[size_t(r)].bytes_sent[size_t(OpKind::kReduceScatter)],
              uint64_t(w - 1) * count * 4);
  }
}

}  // namespace zinf::comm::testing
