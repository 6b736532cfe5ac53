// The collectives over threads as ranks (local transport): every type they take, odd sizes,
// empty shards, in place, pieces smaller than the data, rank-ordered sums bit for bit, and the
// failures (a dead rank, a silent one, a rank issuing something else).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernels/cpu/half_convert.h"
#include "src/comm/reduce.h"
#include "tests/comm/comm_test_util.h"

namespace zinf::comm {
namespace {

using testing::LocalWorld;
using testing::OnThreads;

uint16_t ToBf16(float f) {  // truncation: the test only needs representable values
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return uint16_t(b >> 16);
}
float Bf16(uint16_t h) {
  uint32_t b = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Rank r's value i: varied magnitudes so that the order of a sum changes its bits.
float Val(int r, size_t i) {
  std::mt19937 g(uint32_t(r * 7919 + i));
  return std::ldexp(std::uniform_real_distribution<float>(-1, 1)(g), int(g() % 20) - 10);
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, AllGatherAnyTypeOddSizesAndEmpty) {
  const int w = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1001}}) {
    LocalWorld lw(w);
    std::vector<std::vector<uint8_t>> out(static_cast<size_t>(w), std::vector<uint8_t>(count * 2 * static_cast<size_t>(w)));
    OnThreads(w, [&](int r) {
      std::vector<uint16_t> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = uint16_t(r * 1000 + i);
      ASSERT_TRUE(lw.comms[size_t(r)]->AllGather(mine.data(), out[size_t(r)].data(), count,
                                                  DType::kBf16).Wait().ok());
    });
    for (int r = 0; r < w; ++r) {
      const auto* got = reinterpret_cast<const uint16_t*>(out[size_t(r)].data());
      for (int p = 0; p < w; ++p)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[size_t(p) * count + i], p * 1000 + i);
    }
  }
}

TEST_P(CollectivesTest, AllGatherInPlace) {
  const int w = GetParam();
  const size_t count = 33;
  LocalWorld lw(w);
  std::vector<std::vector<float>> buf(static_cast<size_t>(w), std::vector<float>(count * static_cast<size_t>(w), -1));
  OnThreads(w, [&](int r) {
    float* own = buf[size_t(r)].data() + size_t(r) * count;
    for (size_t i = 0; i < count; ++i) own[i] = float(r) + float(i) / 64;
    ASSERT_TRUE(lw.comms[size_t(r)]->AllGather(own, buf[size_t(r)].data(), count, DType::kF32)
                    .Wait().ok());
  });
  for (int r = 0; r < w; ++r)
    for (int p = 0; p < w; ++p)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(buf[size_t(r)][size_t(p) * count + i], float(p) + float(i) / 64);
}

// The reduce-scatter's sum is ((0 + x_0) + x_1) + ..., bit for bit, for every pair of types,
// with pieces smaller than the chunk (several exchanges) and chunks of odd sizes.
TEST_P(CollectivesTest, ReduceScatterIsRankOrderedSum) {
  const int w = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{4099}}) {
    CommOptions o;
    o.piece_bytes = 256;  // 64 fp32 values a piece: many exchanges
    LocalWorld lw(w, o);
    const size_t total = count * static_cast<size_t>(w);
    std::vector<std::vector<float>> in32(static_cast<size_t>(w)), out32(static_cast<size_t>(w));
    std::vector<std::vector<uint16_t>> in16(static_cast<size_t>(w));
    std::vector<std::vector<float>> out16(static_cast<size_t>(w));
    for (int r = 0; r < w; ++r) {
      in32[size_t(r)].resize(total);
      in16[size_t(r)].resize(total);
      for (size_t i = 0; i < total; ++i) {
        in32[size_t(r)][i] = Val(r, i);
        in16[size_t(r)][i] = ToBf16(Val(r, i));
      }
      out32[size_t(r)].assign(count, NAN);
      out16[size_t(r)].assign(count, NAN);
    }
    OnThreads(w, [&](int r) {
      auto& c = *lw.comms[size_t(r)];
      Work a = c.ReduceScatter(in32[size_t(r)].data(), DType::kF32, out32[size_t(r)].data(),
                               DType::kF32, count);
      Work b = c.ReduceScatter(in16[size_t(r)].data(), DType::kBf16, out16[size_t(r)].data(),
                               DType::kF32, count);
      ASSERT_TRUE(a.Wait().ok());
      ASSERT_TRUE(b.Wait().ok());
    });
    for (int r = 0; r < w; ++r) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0, want16 = 0;
        for (int p = 0; p < w; ++p) {
          want = want + in32[size_t(p)][size_t(r) * count + i];
          want16 = want16 + Bf16(in16[size_t(p)][size_t(r) * count + i]);
        }
        ASSERT_EQ(std::memcmp(&out32[size_t(r)][i], &want, 4), 0) << "rank " << r << " i " << i;
        ASSERT_EQ(std::memcmp(&out16[size_t(r)][i], &want16, 4), 0) << "rank " << r << " i " << i;
      }
    }
  }
}

// The output right after or right before the input in one allocation (so the first peer's
// pieces land in it directly, at the back of each fp32 piece's place), bf16 into fp32, in
// pieces many of the sum's 16-element blocks long: the sums are the rank-ordered ones bit for
// bit, and the input is left as it was.
TEST_P(CollectivesTest, ReduceScatterIntoAnOutputNextToItsInput) {
  const int w = GetParam();
  const size_t count = 6001;
  const size_t total = count * static_cast<size_t>(w);
  for (bool out_first : {false, true}) {
    CommOptions o;
    o.piece_bytes = 5000;  // 2500 bf16 values a piece: 3 pieces, the last with a short tail
    LocalWorld lw(w, o);
    // bf16 input (2 * total bytes) and fp32 output (4 * count bytes) in one buffer of floats.
    std::vector<std::vector<float>> mem(static_cast<size_t>(w),
                                        std::vector<float>((total + 1) / 2 + count));
    auto in_of = [&](int r) {
      auto* base = reinterpret_cast<uint16_t*>(mem[size_t(r)].data());
      return out_first ? base + 2 * count : base;
    };
    auto out_of = [&](int r) {
      return out_first ? mem[size_t(r)].data() : mem[size_t(r)].data() + (total + 1) / 2;
    };
    for (int r = 0; r < w; ++r)
      for (size_t i = 0; i < total; ++i) in_of(r)[i] = ToBf16(Val(r, i));
    OnThreads(w, [&](int r) {
      ASSERT_TRUE(lw.comms[size_t(r)]->ReduceScatter(in_of(r), DType::kBf16, out_of(r),
                                                     DType::kF32, count).Wait().ok());
    });
    for (int r = 0; r < w; ++r) {
      for (size_t i = 0; i < total; ++i) ASSERT_EQ(in_of(r)[i], ToBf16(Val(r, i)));
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int p = 0; p < w; ++p) want = want + Bf16(in_of(p)[size_t(r) * count + i]);
        ASSERT_EQ(std::memcmp(&out_of(r)[i], &want, 4), 0)
            << "rank " << r << " i " << i << " output first " << out_first;
      }
    }
  }
}

TEST_P(CollectivesTest, ReduceScatterIntegersDoublesHalvesAndInPlace) {
  const int w = GetParam();
  const size_t count = 17;
  LocalWorld lw(w);
  std::vector<std::vector<int64_t>> i64(static_cast<size_t>(w), std::vector<int64_t>(count * static_cast<size_t>(w)));
  std::vector<std::vector<double>> f64(static_cast<size_t>(w), std::vector<double>(count * static_cast<size_t>(w)));
  std::vector<std::vector<uint16_t>> f16(static_cast<size_t>(w), std::vector<uint16_t>(count * static_cast<size_t>(w)));
  std::vector<std::vector<int32_t>> i32(static_cast<size_t>(w), std::vector<int32_t>(count * static_cast<size_t>(w)));
  std::vector<std::vector<float>> o16(static_cast<size_t>(w), std::vector<float>(count));
  std::vector<std::vector<int64_t>> o64(static_cast<size_t>(w), std::vector<int64_t>(count));
  std::vector<std::vector<double>> od(static_cast<size_t>(w), std::vector<double>(count));
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < count * static_cast<size_t>(w); ++i) {
      i64[size_t(r)][i] = int64_t(r) << 40 | int64_t(i);
      f64[size_t(r)][i] = double(r) * 0.5 + double(i);
      f16[size_t(r)][i] = uint16_t(0x3c00 + r);  // 1.0 + r/1024 in fp16
      i32[size_t(r)][i] = r + int32_t(i);
    }
  OnThreads(w, [&](int r) {
    auto& c = *lw.comms[size_t(r)];
    ASSERT_TRUE(c.ReduceScatter(i64[size_t(r)].data(), DType::kI64, o64[size_t(r)].data(),
                                DType::kI64, count).Wait().ok());
    ASSERT_TRUE(c.ReduceScatter(f64[size_t(r)].data(), DType::kF64, od[size_t(r)].data(),
                                DType::kF64, count).Wait().ok());
    ASSERT_TRUE(c.ReduceScatter(f16[size_t(r)].data(), DType::kF16, o16[size_t(r)].data(),
                                DType::kF32, count).Wait().ok());
    // In place: the result overwrites this rank's own chunk of the input.
    int32_t* own = i32[size_t(r)].data() + size_t(r) * count;
    ASSERT_TRUE(c.ReduceScatter(i32[size_t(r)].data(), DType::kI32, own, DType::kI32, count)
                    .Wait().ok());
  });
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < count; ++i) {
      const size_t j = size_t(r) * count + i;
      int64_t s64 = 0;
      double sd = 0;
      float s16 = 0;
      int32_t s32 = 0;
      for (int p = 0; p < w; ++p) {
        s64 += int64_t(p) << 40 | int64_t(j);
        sd += double(p) * 0.5 + double(j);
        s16 += kernels::F16ToFloat(uint16_t(0x3c00 + p));
        s32 += p + int32_t(j);
      }
      EXPECT_EQ(o64[size_t(r)][i], s64);
      EXPECT_EQ(od[size_t(r)][i], sd);
      EXPECT_EQ(o16[size_t(r)][i], s16);
      EXPECT_EQ(i32[size_t(r)][j], s32);
    }
}

// Counts smaller than the world leave some ranks an empty region; in place and bf16 into f32.
TEST_P(CollectivesTest, AllReduceEveryRankGetsTheSameBits) {
  const int w = GetParam();
  for (size_t count : {size_t{1}, size_t{3}, size_t{1000}}) {
    CommOptions o;
    o.piece_bytes = 128;
    LocalWorld lw(w, o);
    std::vector<std::vector<float>> buf(static_cast<size_t>(w), std::vector<float>(count));
    std::vector<std::vector<uint16_t>> b16(static_cast<size_t>(w), std::vector<uint16_t>(count));
    std::vector<std::vector<float>> o16(static_cast<size_t>(w), std::vector<float>(count));
    for (int r = 0; r < w; ++r)
      for (size_t i = 0; i < count; ++i) {
        buf[size_t(r)][i] = Val(r, i);
        b16[size_t(r)][i] = ToBf16(Val(r, i));
      }
    auto want = buf;
    OnThreads(w, [&](int r) {
      auto& c = *lw.comms[size_t(r)];
      ASSERT_TRUE(c.AllReduce(buf[size_t(r)].data(), DType::kF32, buf[size_t(r)].data(),
                              DType::kF32, count).Wait().ok());
      ASSERT_TRUE(c.AllReduce(b16[size_t(r)].data(), DType::kBf16, o16[size_t(r)].data(),
                              DType::kF32, count).Wait().ok());
    });
    for (size_t i = 0; i < count; ++i) {
      float s = 0, s16 = 0;
      for (int p = 0; p < w; ++p) {
        s = s + want[size_t(p)][i];
        s16 = s16 + Bf16(ToBf16(want[size_t(p)][i]));
      }
      for (int r = 0; r < w; ++r) {
        ASSERT_EQ(std::memcmp(&buf[size_t(r)][i], &s, 4), 0) << "rank " << r << " i " << i;
        ASSERT_EQ(std::memcmp(&o16[size_t(r)][i], &s16, 4), 0) << "rank " << r << " i " << i;
      }
    }
  }
}

TEST_P(CollectivesTest, BroadcastFromEveryRootAndBarrier) {
  const int w = GetParam();
  LocalWorld lw(w);
  for (int root = 0; root < w; ++root) {
    std::vector<std::vector<uint8_t>> buf(static_cast<size_t>(w), std::vector<uint8_t>(999));
    for (size_t i = 0; i < 999; ++i) buf[size_t(root)][i] = uint8_t(i * 7 + size_t(root));
    OnThreads(w, [&](int r) {
      ASSERT_TRUE(lw.comms[size_t(r)]->Broadcast(buf[size_t(r)].data(), 999, root).Wait().ok());
      ASSERT_TRUE(lw.comms[size_t(r)]->Barrier().Wait().ok());
    });
    for (int r = 0; r < w; ++r) EXPECT_EQ(buf[size_t(r)], buf[size_t(root)]);
  }
}

// The wire bytes: a reduce-scatter sends (w-1)/w of its input, an all-reduce twice that.
TEST_P(CollectivesTest, StatsCountTheWireBytes) {
  const int w = GetParam();
  const size_t count = 1024;  // per rank
  LocalWorld lw(w);
  std::vector<std::vector<float>> in(static_cast<size_t>(w), std::vector<float>(count * static_cast<size_t>(w), 1.0f));
  std::vector<std::vector<float>> out(static_cast<size_t>(w), std::vector<float>(count * static_cast<size_t>(w)));
  OnThreads(w, [&](int r) {
    auto& c = *lw.comms[size_t(r)];
    ASSERT_TRUE(c.ReduceScatter(in[size_t(r)].data(), DType::kF32, out[size_t(r)].data(),
                                DType::kF32, count).Wait().ok());
    ASSERT_TRUE(c.AllReduce(in[size_t(r)].data(), DType::kF32, out[size_t(r)].data(),
                            DType::kF32, count * static_cast<size_t>(w)).Wait().ok());
    ASSERT_TRUE(c.AllGather(in[size_t(r)].data(), out[size_t(r)].data(), count, DType::kF32)
                    .Wait().ok());
  });
  for (int r = 0; r < w; ++r) {
    const CommStats s = lw.comms[size_t(r)]->stats();
    const uint64_t chunk = count * 4, peers = uint64_t(w - 1);
    EXPECT_EQ(s.bytes_sent[size_t(OpKind::kReduceScatter)], peers * chunk);
    EXPECT_EQ(s.bytes_received[size_t(OpKind::kReduceScatter)], peers * chunk);
    EXPECT_EQ(s.bytes_sent[size_t(OpKind::kAllReduce)], 2 * peers * chunk);
    EXPECT_EQ(s.bytes_sent[size_t(OpKind::kAllGather)], peers * chunk);
    EXPECT_EQ(s.ops[size_t(OpKind::kAllReduce)], 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

TEST(CommunicatorTest, RefusesTypePairsItCannotSum) {
  LocalWorld lw(1);
  float x = 0;
  uint16_t y = 0;
  Status s = lw.comms[0]->AllReduce(&x, DType::kF32, &y, DType::kBf16, 1).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cannot sum f32 into bf16"), std::string::npos) << s.message();
  s = lw.comms[0]->ReduceScatter(&x, DType::kU8, &x, DType::kU8, 1).Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(lw.comms[0]->Broadcast(&x, 4, 1).Wait().code(), StatusCode::kInvalidArgument);
}

TEST(CommunicatorTest, ADeadRankFailsItsPeersNamingIt) {
  LocalWorld lw(3);
  lw.group.Kill(2);
  std::vector<Status> got(3);
  OnThreads(2, [&](int r) {
    float x[3] = {1, 2, 3}, y[3];
    got[size_t(r)] = lw.comms[size_t(r)]->AllGather(x, y, 1, DType::kF32).Wait();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[size_t(r)].code(), StatusCode::kUnavailable) << got[size_t(r)].ToString();
    EXPECT_NE(got[size_t(r)].message().find("rank 2"), std::string::npos);
  }
  // The communicator is broken: a later operation fails at once with the first error.
  Status later = lw.comms[0]->Barrier().Wait();
  EXPECT_EQ(later.code(), StatusCode::kAborted);
  EXPECT_NE(later.message().find("failed earlier"), std::string::npos) << later.message();
  EXPECT_NE(later.message().find("rank 2"), std::string::npos);
}

TEST(CommunicatorTest, ASilentRankTimesOutNamingIt) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(200);
  LocalWorld lw(2, o);
  // Rank 1 never issues the barrier.
  Status s = lw.comms[0]->Barrier().Wait();
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_NE(s.message().find("no answer from rank 1 within 0.2 s"), std::string::npos)
      << s.message();
}

TEST(CommunicatorTest, SequenceCheckCatchesARankIssuingSomethingElse) {
  CommOptions o;
  o.check_sequence = true;
  o.timeout = std::chrono::seconds(10);
  LocalWorld lw(2, o);
  std::vector<Status> got(2);
  std::vector<float> a(8, 1), b(16);
  std::vector<float> a1(8, 1), b1(16);
  OnThreads(2, [&](int r) {
    auto& c = *lw.comms[size_t(r)];
    ASSERT_TRUE(c.Barrier().Wait().ok());
    // Rank 0 all-reduces 8 values, rank 1 all-gathers 8: without the check, the sums would
    // silently mix the two.
    got[size_t(r)] = r == 0 ? c.AllReduce(a.data(), DType::kF32, b.data(), DType::kF32, 8).Wait()
                            : c.AllGather(a1.data(), b1.data(), 8, DType::kF32).Wait();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(got[size_t(r)].code(), StatusCode::kFailedPrecondition) << got[size_t(r)].ToString();
    EXPECT_NE(got[size_t(r)].message().find("#2 all_reduce of 8 f32 into f32"), std::string::npos)
        << got[size_t(r)].message();
    EXPECT_NE(got[size_t(r)].message().find("#2 all_gather of 8 f32"), std::string::npos);
  }
}

TEST(CommunicatorTest, CheckAgreementNamesTheRanksThatDiffer) {
  LocalWorld lw(3);
  std::vector<Status> got(3);
  OnThreads(3, [&](int r) {
    got[size_t(r)] = lw.comms[size_t(r)]->CheckAgreement(r == 2 ? 0xbad : 0x600d, "the config");
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(got[size_t(r)].code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(got[size_t(r)].message().find("disagree on the config"), std::string::npos);
    EXPECT_NE(got[size_t(r)].message().find("rank 2 (0000000000000bad) differs"),
              std::string::npos) << got[size_t(r)].message();
  }
  LocalWorld ok(2);
  OnThreads(2, [&](int r) { EXPECT_TRUE(ok.comms[size_t(r)]->CheckAgreement(7, "x").ok()); });
}

// Operations issued back to back without waiting run in issue order.
TEST(CommunicatorTest, ManyOperationsInFlight) {
  const int w = 3, n = 50;
  LocalWorld lw(w);
  std::vector<std::vector<float>> buf(static_cast<size_t>(w), std::vector<float>(size_t(n)));
  OnThreads(w, [&](int r) {
    std::vector<Work> works;
    for (int k = 0; k < n; ++k) {
      buf[size_t(r)][size_t(k)] = float(k + r);
      works.push_back(lw.comms[size_t(r)]->AllReduce(&buf[size_t(r)][size_t(k)], DType::kF32,
                                                     &buf[size_t(r)][size_t(k)], DType::kF32, 1));
    }
    for (auto& wk : works) ASSERT_TRUE(wk.Wait().ok());
  });
  for (int r = 0; r < w; ++r)
    for (int k = 0; k < n; ++k) EXPECT_EQ(buf[size_t(r)][size_t(k)], float(3 * k + 3));
}

// A Wait on an operation still queued runs it on the waiter's thread, with every operation queued
// before it, in issue order: waits in a different order on each rank, from two threads, with the
// sequence check on (an operation run out of order would fail it, or land in the wrong sum).
TEST(CommunicatorTest, WaitersRunQueuedOperationsInIssueOrder) {
  const int w = 3, n = 60;
  CommOptions o;
  o.check_sequence = true;
  o.timeout = std::chrono::seconds(30);
  LocalWorld lw(w, o);
  std::vector<std::vector<double>> buf(size_t(w), std::vector<double>(size_t(n) * 3));
  OnThreads(w, [&](int r) {
    auto& c = *lw.comms[size_t(r)];
    std::vector<Work> works;
    for (int k = 0; k < n; ++k) {  // sizes 1..3 elements: a reordering changes the shapes
      const size_t len = size_t(k % 3) + 1;
      double* p = &buf[size_t(r)][size_t(k) * 3];
      for (size_t i = 0; i < len; ++i) p[i] = double(k * 10 + r) + double(i);
      works.push_back(c.AllReduce(p, DType::kF64, p, DType::kF64, len));
    }
    // Rank r waits from the back for r == 0, from the front for 1, every third first for 2;
    // a second thread waits on the odd ones at the same time.
    std::vector<size_t> order(static_cast<size_t>(n));
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (r == 0) std::reverse(order.begin(), order.end());
    if (r == 2)
      std::stable_partition(order.begin(), order.end(), [](size_t i) { return i % 3 == 0; });
    std::thread odd([&] {
      for (size_t i = 1; i < size_t(n); i += 2) EXPECT_TRUE(works[i].Wait().ok());
    });
    for (size_t i : order) EXPECT_TRUE(works[i].Wait().ok());
    odd.join();
    const CommStats st = c.stats();
    EXPECT_EQ(st.ops[size_t(OpKind::kAllReduce)], uint64_t(n));
  });
  for (int r = 0; r < w; ++r)
    for (int k = 0; k < n; ++k)
      for (size_t i = 0; i < size_t(k % 3) + 1; ++i)
        EXPECT_EQ(buf[size_t(r)][size_t(k) * 3 + i], double(30 * k + 3) + 3 * double(i))
            << "rank " << r << " op " << k;
}

// A call waited on at once mostly runs on the caller's thread (the communicator's thread wakes
// later): no hand-off there and back. Counted, not timed.
TEST(CommunicatorTest, AnOperationWaitedOnAtOnceRunsOnTheWaiter) {
  const int n = 200;
  LocalWorld lw(2);
  OnThreads(2, [&](int r) {
    for (int k = 0; k < n; ++k) ASSERT_TRUE(lw.comms[size_t(r)]->Barrier().Wait().ok());
  });
  for (int r = 0; r < 2; ++r) {
    const CommStats st = lw.comms[size_t(r)]->stats();
    EXPECT_EQ(st.ops[size_t(OpKind::kBarrier)], uint64_t(n));
    EXPECT_GT(st.ran_by_waiter, 0u) << "rank " << r;
    EXPECT_LE(st.ran_by_waiter, uint64_t(n));
  }
}

}  // namespace
}  // namespace zinf::comm
