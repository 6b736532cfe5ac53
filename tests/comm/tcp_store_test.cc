// The rendezvous store: values across clients, waiting for a key, claims, a port in use, and no
// server at all.
#include <gtest/gtest.h>

#include <thread>

#include "src/comm/tcp_store.h"

namespace zinf::comm {
namespace {

using std::chrono::milliseconds;

TEST(TcpStoreTest, SetGetWaitAndClaim) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);
  auto a = TcpStoreClient::Connect("127.0.0.1", port, milliseconds(2000));
  auto b = TcpStoreClient::Connect("127.0.0.1", port, milliseconds(2000));
  ASSERT_TRUE(a.ok() && b.ok());
  // b waits for a key a sets later.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    ASSERT_TRUE((*a)->Set("k", {1, 2, 3}).ok());
  });
  auto v = (*b)->Get("k", milliseconds(5000));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, (std::vector<uint8_t>{1, 2, 3}));
  // An empty value is a value.
  ASSERT_TRUE((*a)->Set("empty", {}).ok());
  EXPECT_TRUE((*b)->Get("empty", milliseconds(100))->empty());
  auto first = (*a)->Claim("rank/1", {1});
  auto second = (*b)->Claim("rank/1", {1});
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_TRUE(*first);
  EXPECT_FALSE(*second);
}

// A claimant whose connection closes (its process died) is marked "<key>/closed".
TEST(TcpStoreTest, AClosedClaimantIsMarked) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto watcher = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), milliseconds(2000));
  auto claimant = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), milliseconds(2000));
  ASSERT_TRUE(watcher.ok() && claimant.ok());
  ASSERT_TRUE(*(*claimant)->Claim("rank/1", {1}));
  EXPECT_FALSE(*(*watcher)->Has("rank/1/closed"));
  claimant->reset();
  auto closed = (*watcher)->Get("rank/1/closed", milliseconds(5000));
  EXPECT_TRUE(closed.ok()) << closed.status().ToString();
  EXPECT_TRUE(*(*watcher)->Has("rank/1/closed"));
}

TEST(TcpStoreTest, GetTimesOutNamingTheKey) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto c = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), milliseconds(2000));
  ASSERT_TRUE(c.ok());
  auto v = (*c)->Get("never", milliseconds(150));
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kAborted);
  EXPECT_NE(v.status().message().find("no 'never' after 0.15 s"), std::string::npos)
      << v.status().message();
}

TEST(TcpStoreTest, APortInUseIsRefusedNamingIt) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto again = TcpStoreServer::Start("127.0.0.1", (*server)->port());
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(again.status().message().find("is in use"), std::string::npos);
  EXPECT_NE(again.status().message().find(std::to_string((*server)->port())), std::string::npos);
}

TEST(TcpStoreTest, NoServerFailsWithinTheTimeout) {
  // A port nobody listens on: take a free one and let it go.
  uint16_t port;
  {
    auto s = TcpStoreServer::Start("127.0.0.1", 0);
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto c = TcpStoreClient::Connect("127.0.0.1", port, milliseconds(300));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("is rank 0 running?"), std::string::npos);
  EXPECT_LT(secs, 5.0);
}

TEST(TcpStoreTest, ClientSeesTheServerGo) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok());
  auto c = TcpStoreClient::Connect("127.0.0.1", (*server)->port(), milliseconds(2000));
  ASSERT_TRUE(c.ok());
  server->reset();
  Status s = (*c)->Set("k", {1});
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("closed the connection"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace zinf::comm
