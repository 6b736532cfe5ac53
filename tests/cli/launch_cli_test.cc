// `zinf launch` end to end: the environment each rank gets, output relayed per rank, a failing
// or killed rank ending the others with its name and last message, signals passed on, and
// `zinf bench-comm` over Gloo between processes: 2 and 4 ranks, two "nodes" (two launches on
// this machine), a port in use.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tests/cli/cli_util.h"
#include "tests/cli/rank_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;
using testing::ranks::FreePort;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(LaunchCliTest, EachRankGetsTorchrunsEnvironment) {
  TempDir dir;
  auto r = RunZinf("launch --nproc 2 --master-port 29611 -- sh -c 'echo rank=$RANK "
                   "world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE "
                   "at=$MASTER_ADDR:$MASTER_PORT run=${ZINF_RUN_ID:+set}; echo oops >&2'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] rank=0 world=2 local=0/2 at=127.0.0.1:29611 run=set"),
            std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] rank=1 world=2 local=1/2 at=127.0.0.1:29611 run=set"),
            std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[rank 1] oops"), std::string::npos) << r.err;
}

TEST(LaunchCliTest, AFailingRankEndsTheOthersAndIsNamed) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunZinf("launch --nproc 3 --grace 1 -- sh -c 'if [ $RANK = 1 ]; then echo "
                   "\"bad things happened\" >&2; exit 3; fi; sleep 60'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_LT(Seconds(t0), 20.0);
  EXPECT_NE(r.err.find("zinf launch: rank 1 exited with status 3, its last message: bad things "
                       "happened; the other ranks were ended"),
            std::string::npos) << r.err;
}

TEST(LaunchCliTest, AKilledRankIsNamed) {
  TempDir dir;
  auto r = RunZinf("launch --nproc 2 --grace 1 -- sh -c 'if [ $RANK = 0 ]; then echo going; "
                   "kill -9 $$; fi; sleep 60'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 0 was killed by signal 9 (Killed), its last message: going"),
            std::string::npos) << r.err;
}

TEST(LaunchCliTest, AMissingProgramIsNamed) {
  TempDir dir;
  auto r = RunZinf("launch --nproc 1 -- /nonexistent/prog", dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot run '/nonexistent/prog'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0 exited with status 127"), std::string::npos) << r.err;
}

TEST(LaunchCliTest, BadUsage) {
  TempDir dir;
  EXPECT_EQ(RunZinf("launch --nproc 2", dir.path()).exit_code, 2);
  auto r = RunZinf("launch --nproc 1 --nnodes 2 --node-rank 2 -- true", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--node-rank 2 is not below --nnodes 2"), std::string::npos);
}

TEST(LaunchCliTest, SignalsArePassedToEveryRank) {
  TempDir dir;
  int out_fd = -1;
  const pid_t pid = testing::SpawnZinf(
      {"launch", "--nproc", "2", "--", "sh", "-c",
       "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait"},
      dir / "err.txt", &out_fd);
  ASSERT_GT(pid, 0);
  std::string out;
  char buf[4096];
  // Wait for both ranks to be ready, then signal the launcher.
  while (out.find("[rank 0] ready") == std::string::npos ||
         out.find("[rank 1] ready") == std::string::npos) {
    const ssize_t n = ::read(out_fd, buf, sizeof(buf));
    ASSERT_GT(n, 0) << out;
    out.append(buf, size_t(n));
  }
  ::kill(pid, SIGTERM);
  for (ssize_t n; (n = ::read(out_fd, buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
  ::close(out_fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_NE(out.find("[rank 0] got-term"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] got-term"), std::string::npos) << out;
}

// Collectives between processes over Gloo: bench-comm checks every zinf result against the
// exact sum.
TEST(LaunchCliTest, BenchCommBetweenTwoAndFourProcesses) {
  TempDir dir;
  for (int n : {2, 4}) {
    const uint16_t port = FreePort();
    auto r = RunZinf("launch --nproc " + std::to_string(n) + " --master-port " +
                         std::to_string(port) + " -- " + ZINF_BINARY +
                         " bench-comm --sizes 64KiB,1MiB --reps 1",
                     dir.path());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("(" + std::to_string(n) + " ranks)"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[rank 0] reduce_scatter    1.0 MiB"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("[rank 1]"), std::string::npos) << r.out;  // rank 0 prints
  }
}

// Multi-node as two launches on this machine, each a "node" of 2 ranks.
TEST(LaunchCliTest, TwoNodesAsTwoLaunches) {
  TempDir dir;
  const std::string port = std::to_string(FreePort());
  const std::string common = " --nproc 2 --nnodes 2 --master-port " + port +
                             " --run-id two-nodes -- " + ZINF_BINARY +
                             " bench-comm --sizes 256KiB --reps 1";
  testing::CommandResult node1;
  // Node 1's directory exists before its thread runs in it (created after, a slow start of the
  // main thread left node 1's shell without it: it never launched, and node 0 waited 120 s).
  std::filesystem::create_directories(dir / "n1");
  std::thread t([&] { node1 = RunZinf("launch --node-rank 1" + common, dir / "n1"); });
  auto node0 = RunZinf("launch --node-rank 0" + common, dir.path());
  t.join();
  EXPECT_EQ(node0.exit_code, 0) << node0.out << node0.err;
  EXPECT_EQ(node1.exit_code, 0) << node1.out << node1.err;
  EXPECT_NE(node0.out.find("(4 ranks)"), std::string::npos) << node0.out;
}

TEST(LaunchCliTest, APortInUseIsNamed) {
  TempDir dir;
  auto holder = comm::TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(holder.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunZinf("launch --nproc 2 --grace 1 --master-port " +
                       std::to_string((*holder)->port()) + " -- " + ZINF_BINARY +
                       " bench-comm --sizes 64KiB --reps 1",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("is in use"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zinf launch: rank 0 exited with status 1"), std::string::npos) << r.err;
  EXPECT_LT(Seconds(t0), 30.0);
}

// A rank killed in the middle of collectives: the launch ends within seconds, naming it.
TEST(LaunchCliTest, ARankKilledMidCollectiveEndsTheJob) {
  TempDir dir;
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunZinf("launch --nproc 2 --grace 2 --master-port " + std::to_string(FreePort()) +
                       " -- sh -c 'if [ $RANK = 1 ]; then (sleep 2; kill -9 $$) & fi; exec " +
                       ZINF_BINARY + " bench-comm --sizes 16MiB --reps 1000'",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("rank 1 was killed by signal 9"), std::string::npos) << r.err;
  EXPECT_LT(Seconds(t0), 30.0);
}

// Without the launcher to end it, a rank whose peer died fails by itself, naming the peer.
TEST(LaunchCliTest, ARankSeesItsPeerDieAndNamesIt) {
  TempDir dir;
  const std::string env = "WORLD_SIZE=2 MASTER_PORT=" + std::to_string(FreePort());
  const std::string bench =
      std::string(ZINF_BINARY) + " bench-comm --sizes 16MiB --reps 1000 --no-gloo";
  const std::string script = "RANK=1 " + env + " " + bench + " >/dev/null 2>&1 & p=$!; "
                             "(sleep 2; kill -9 $p) & RANK=0 " + env + " " + bench + " >/dev/null";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunZinf("info >/dev/null; sh -c '" + script + "'", dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("the connection with rank 1 failed"), std::string::npos) << r.err;
  EXPECT_LT(Seconds(t0), 60.0);
}

}  // namespace
}  // namespace zinf
