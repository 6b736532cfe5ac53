#include "src/comm/world.h"

#include <charconv>
#include <cstdlib>

#include <fmt/format.h>

#include "src/comm/gloo_transport.h"
#include "src/comm/local_transport.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/p2p_communicator.h"

namespace zinf::comm {
namespace {

Result<long> ParseInt(const char* name, const char* text, long lo, long hi) {
  long v = 0;
  const char* end = text + std::char_traits<char>::length(text);
  auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || v < lo || v > hi)
    return InvalidArgument(fmt::format("environment variable {}='{}': expected an integer in "
                                       "[{}, {}]",
                                       name, text, lo, hi));
  return v;
}

}  // namespace

std::string WorldEnv::Describe() const {
  return fmt::format("rank {} of {} (local {} of {}), store {}", rank, world, local_rank,
                     local_world,
                     store_dir.empty() ? fmt::format("{}:{}", master_addr, master_port)
                                       : "file " + store_dir);
}

Result<WorldEnv> ReadWorldEnv(const GetEnvFn& get) {
  WorldEnv e;
  const char* rank = get("RANK");
  const char* world = get("WORLD_SIZE");
  if (rank == nullptr && world == nullptr) return e;
  if (rank == nullptr || world == nullptr)
    return InvalidArgument(fmt::format(
        "environment variable {} is set but {} is not: a rank needs both (as torchrun and "
        "`zinf launch` set them)",
        rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK"));
  ZINF_ASSIGN_OR_RETURN(long w, ParseInt("WORLD_SIZE", world, 1, 4096));
  ZINF_ASSIGN_OR_RETURN(long r, ParseInt("RANK", rank, 0, 4095));
  if (r >= w)
    return InvalidArgument(fmt::format("environment variable RANK={} is not below WORLD_SIZE={}",
                                       r, w));
  e.rank = int(r);
  e.world = int(w);
  e.local_rank = e.rank;
  e.local_world = e.world;
  if (const char* v = get("LOCAL_WORLD_SIZE")) {
    ZINF_ASSIGN_OR_RETURN(long lw, ParseInt("LOCAL_WORLD_SIZE", v, 1, w));
    e.local_world = int(lw);
  }
  if (const char* v = get("LOCAL_RANK")) {
    ZINF_ASSIGN_OR_RETURN(long lr, ParseInt("LOCAL_RANK", v, 0, e.local_world - 1));
    e.local_rank = int(lr);
  } else if (e.local_world != e.world) {
    return InvalidArgument("environment variable LOCAL_RANK is not set but LOCAL_WORLD_SIZE "
                           "says the ranks span several nodes");
  }
  if (const char* v = get("MASTER_ADDR")) {
    if (*v == '\0') return InvalidArgument("environment variable MASTER_ADDR is empty");
    e.master_addr = v;
  }
  if (const char* v = get("MASTER_PORT")) {
    ZINF_ASSIGN_OR_RETURN(long port, ParseInt("MASTER_PORT", v, 1, 65535));
    e.master_port = uint16_t(port);
  }
  if (const char* v = get("ZINF_RUN_ID")) e.run_id = v;
  if (const char* v = get("ZINF_STORE_DIR")) e.store_dir = v;
  if (const char* v = get("ZINF_SOCKET_HOST")) e.socket_host = v;
  return e;
}

Result<WorldEnv> ReadWorldEnv() {
  return ReadWorldEnv([](const char* n) -> const char* { return std::getenv(n); });
}

const char* CommBackendName(CommBackend b) {
  return b == CommBackend::kNccl ? "nccl" : "gloo";
}

RankGpu GpuOfRank(const WorldEnv& env, int device_count) {
  if (device_count <= 0) return {};
  return {env.local_rank % device_count, env.local_rank >= device_count};
}

Result<std::unique_ptr<Communicator>> Connect(const WorldEnv& env, const CommOptions& options,
                                              const Link& link) {
  if (env.world == 1) {
    // The group must outlive the transport: a static one serves every world of one (its only
    // state is the mailbox, empty with no peers).
    static LocalGroup solo(1);
    return P2PCommunicator::Create(solo.Join(0), options);
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, ConnectGloo(env, options.timeout));
  if (link.backend == CommBackend::kNccl) {
    ZINF_ASSIGN_OR_RETURN(t, ConnectNccl(std::move(t), {}, link.cuda_ordinal, options.timeout));
  }
  return P2PCommunicator::Create(std::move(t), options);
}

Result<std::unique_ptr<Communicator>> ConnectGroup(const WorldEnv& env, const CommOptions& options,
                                                   const std::string& name,
                                                   std::span<const int> members,
                                                   const Link& link) {
  if (members.size() == 1) {
    static LocalGroup solo(1);
    return P2PCommunicator::Create(solo.Join(0), options);
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t,
                        ConnectGlooGroup(env, options.timeout, name, members));
  if (link.backend == CommBackend::kNccl) {
    ZINF_ASSIGN_OR_RETURN(
        t, ConnectNccl(std::move(t), members, link.cuda_ordinal, options.timeout));
  }
  return P2PCommunicator::Create(std::move(t), options);
}

std::vector<int> NodeGroup(const WorldEnv& env) {
  const int node = env.rank / env.local_world;
  std::vector<int> m;
  for (int l = 0; l < env.local_world; ++l) m.push_back(node * env.local_world + l);
  return m;
}

std::vector<int> ReplicaGroup(const WorldEnv& env) {
  std::vector<int> m;
  for (int r = env.rank % env.local_world; r < env.world; r += env.local_world) m.push_back(r);
  return m;
}

}  // namespace zinf::comm
