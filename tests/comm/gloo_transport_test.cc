// The collectives over Gloo's TCP pairs on loopback (ranks as threads of this process, each with
// its own Gloo context, joined through the TCP store or the file store), the rendezvous's
// refusals, and Gloo's own collectives (bench-comm's baseline).
#include <signal.h>

#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include "src/comm/gloo_transport.h"
#include "src/comm/p2p_communicator.h"
#include "src/comm/tcp_store.h"
#include "src/comm/world.h"
#include "tests/comm/comm_test_util.h"

namespace zinf::comm {
namespace {

using testing::OnThreads;
using std::chrono::milliseconds;

using testing::Env;
using testing::FreePort;

CommOptions Quick() {
  CommOptions o;
  o.timeout = milliseconds(20000);
  o.piece_bytes = 1000;
  return o;
}

class GlooWorldTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooWorldTest, CollectivesMatchTheLocalTransportBitForBit) {
  const int w = GetParam();
  const uint16_t port = FreePort();
  testing::CheckCollectivesBitForBit(
      w, [&](int r) { return Connect(Env(r, w, port), Quick()); }, "gloo tcp 127.0.0.1");
}

INSTANTIATE_TEST_SUITE_P(Worlds, GlooWorldTest, ::testing::Values(2, 4),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

// A rank seconds late is not a dead one: the others wait for it (Gloo's own wait, had it timed
// out in between, would have closed every pair).
TEST(GlooTransportTest, ARankSecondsLateIsWaitedFor) {
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  OnThreads(2, [&](int r) {
    auto c = Connect(Env(r, 2, port), Quick());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    float x = float(r + 1), y = 0;
    got[size_t(r)] = (*c)->AllReduce(&x, DType::kF32, &y, DType::kF32, 1).Wait();
    EXPECT_EQ(y, 3.0f);
    got[size_t(r)] = (*c)->Barrier().Wait();
  });
  EXPECT_TRUE(got[0].ok()) << got[0].ToString();
  EXPECT_TRUE(got[1].ok()) << got[1].ToString();
}

// Two ranks join through a file store and sum 1 + 2. The collective also keeps either rank
// from leaving early: one that closes its pairs while the other is still connecting fails that
// one's join ("Connection closed by peer").
void JoinThroughAFileStoreAndSum() {
  char tmpl[] = "/tmp/zinf_gloo_fsXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  OnThreads(2, [&](int r) {
    WorldEnv e = Env(r, 2, 1);
    e.store_dir = tmpl;
    auto c = Connect(e, Quick());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    float x = float(r + 1), y = 0;
    ASSERT_TRUE((*c)->AllReduce(&x, DType::kF32, &y, DType::kF32, 1).Wait().ok());
    EXPECT_EQ(y, 3.0f);
  });
  std::filesystem::remove_all(tmpl);
}

TEST(GlooTransportTest, FileStoreRendezvous) { JoinThroughAFileStoreAndSum(); }

// A peer that dies mid-collective must be an error naming it, not SIGPIPE ending this process
// (exit 141, seen once in the kill test of tests/cli/train_ranks_cli_test.cc).
TEST(GlooTransportTest, JoiningIgnoresSigpipe) {
  signal(SIGPIPE, SIG_DFL);
  JoinThroughAFileStoreAndSum();
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_IGN);
}

TEST(GlooTransportTest, WrongWorldSizeIsNamed) {
  const uint16_t port = FreePort();
  std::vector<Status> got(2);
  CommOptions o = Quick();
  o.timeout = milliseconds(3000);
  OnThreads(2, [&](int r) {
    auto c = Connect(Env(r, r == 0 ? 2 : 3, port), o);
    got[size_t(r)] = c.status();
  });
  EXPECT_EQ(got[1].code(), StatusCode::kFailedPrecondition) << got[1].ToString();
  EXPECT_NE(got[1].message().find("rank 0 runs WORLD_SIZE=2, rank 1 was given WORLD_SIZE=3"),
            std::string::npos) << got[1].message();
  // Rank 0 waits for a peer that never joins, and says so within its timeout.
  EXPECT_FALSE(got[0].ok());
}

TEST(GlooTransportTest, ARankGivenTwiceIsRefused) {
  const uint16_t port = FreePort();
  std::vector<Status> got(3);
  CommOptions o = Quick();
  o.timeout = milliseconds(3000);
  OnThreads(3, [&](int i) {
    // Ranks 0, 1, 1 in a world of 3.
    auto c = Connect(Env(i == 0 ? 0 : 1, 3, port), o);
    got[size_t(i)] = c.status();
  });
  int twice = 0;
  for (const Status& s : got)
    if (s.message().find("RANK=1 joined twice") != std::string::npos) ++twice;
  EXPECT_EQ(twice, 1) << got[0].ToString() << " | " << got[1].ToString() << " | "
                      << got[2].ToString();
}

TEST(GlooTransportTest, APortInUseIsNamed) {
  auto holder = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(holder.ok());
  auto c = Connect(Env(0, 2, (*holder)->port()), Quick());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("is in use"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("rank 0: joining the world"), std::string::npos);
}

// Gloo's reduce-scatter may end on one rank while the other still reads its last piece: each
// keeps its transport open until both are done (bench-comm ends with a zinf barrier).
TEST(GlooTransportTest, GlooOwnCollectivesAgree) {
  const int w = 2;
  const uint16_t port = FreePort();
  const size_t count = 1024;
  std::barrier done(w);
  OnThreads(w, [&](int r) {
    std::unique_ptr<Transport> kept;  // closed after the barrier below, on every path
    struct Leave {
      std::barrier<>& b;
      ~Leave() { b.arrive_and_wait(); }
    } leave{done};
    auto t = ConnectGloo(Env(r, w, port), milliseconds(20000));
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    kept = std::move(*t);
    Transport& tr = *kept;
    std::vector<float> buf(count * w, float(r + 1)), out(count * w * w);
    ASSERT_TRUE(GlooRaw::AllReduce(tr, buf.data(), buf.size()).ok());
    EXPECT_EQ(buf[5], 3.0f);
    ASSERT_TRUE(GlooRaw::AllGather(tr, buf.data(), out.data(), buf.size()).ok());
    EXPECT_EQ(out.back(), 3.0f);
    std::vector<float> rs(count * w, float(r + 1));
    auto run = GlooRaw::PrepareReduceScatter(tr, rs.data(), count);
    ASSERT_TRUE(run.ok());
    const Status st = (*run)();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(rs[size_t(r) * count], 3.0f);
  });
}

// HYBRID_SHARD's groups over four ranks as two nodes of two (LOCAL_WORLD_SIZE 2): each node's
// ranks and each local rank's replicas sum among themselves only, through the TCP store and
// the file store; a rank not among the members is refused naming the group.
TEST(GlooTransportTest, NodeAndReplicaGroupsSumAmongTheirMembers) {
  EXPECT_EQ(NodeGroup([] { WorldEnv e; e.rank = 3; e.world = 4; e.local_world = 2; return e; }()),
            (std::vector<int>{2, 3}));
  EXPECT_EQ(
      ReplicaGroup([] { WorldEnv e; e.rank = 3; e.world = 4; e.local_world = 2; return e; }()),
      (std::vector<int>{1, 3}));
  char tmpl[] = "/tmp/zinf_gloo_grXXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  for (const bool file_store : {false, true}) {
    SCOPED_TRACE(file_store ? "file store" : "TCP store");
    const uint16_t port = FreePort();
    OnThreads(4, [&](int r) {
      WorldEnv e = Env(r, 4, port);
      e.local_rank = r % 2;
      e.local_world = 2;
      if (file_store) e.store_dir = tmpl;
      auto world = Connect(e, Quick());
      ASSERT_TRUE(world.ok()) << world.status().ToString();
      const std::vector<int> node = NodeGroup(e), replicas = ReplicaGroup(e);
      auto n = ConnectGroup(e, Quick(), "node" + std::to_string(r / 2), node);
      ASSERT_TRUE(n.ok()) << n.status().ToString();
      auto rep = ConnectGroup(e, Quick(), "local" + std::to_string(r % 2), replicas);
      ASSERT_TRUE(rep.ok()) << rep.status().ToString();
      EXPECT_EQ((*n)->world(), 2);
      EXPECT_EQ((*n)->rank(), r % 2);
      EXPECT_EQ((*rep)->rank(), r / 2);
      // Values 1, 10, 100, 1000 for ranks 0..3: each sum names its members.
      const float mine = std::pow(10.0f, float(r));
      float y = 0;
      ASSERT_TRUE((*n)->AllReduce(&mine, DType::kF32, &y, DType::kF32, 1).Wait().ok());
      EXPECT_EQ(y, r < 2 ? 11.0f : 1100.0f) << r;
      ASSERT_TRUE((*rep)->AllReduce(&mine, DType::kF32, &y, DType::kF32, 1).Wait().ok());
      EXPECT_EQ(y, r % 2 == 0 ? 101.0f : 1010.0f) << r;
      ASSERT_TRUE((*world)->AllReduce(&mine, DType::kF32, &y, DType::kF32, 1).Wait().ok());
      EXPECT_EQ(y, 1111.0f);
      // Every member done with the groups before any closes its side.
      ASSERT_TRUE((*world)->Barrier().Wait().ok());
    });
  }
  std::filesystem::remove_all(tmpl);
  // A group this rank is not in.
  const uint16_t port = FreePort();
  OnThreads(2, [&](int r) {
    auto world = Connect(Env(r, 2, port), Quick());
    ASSERT_TRUE(world.ok()) << world.status().ToString();
    if (r == 0) {
      const int others[] = {1};
      auto g = ConnectGlooGroup(Env(r, 2, port), milliseconds(2000), "lonely", others);
      EXPECT_FALSE(g.ok());
      EXPECT_NE(g.status().ToString().find("rank 0 is not in the group lonely"),
                std::string::npos) << g.status().ToString();
    }
    ASSERT_TRUE((*world)->Barrier().Wait().ok());
  });
}

}  // namespace
}  // namespace zinf::comm
