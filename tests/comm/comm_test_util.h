// tests/comm/comm_test_util.h — running one function per rank on threads, for the collectives'
// tests over the local transport and over Gloo.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "src/comm/communicator.h"
#include "src/comm/local_transport.h"
#include "src/comm/p2p_communicator.h"

namespace zinf::comm::testing {

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

}  // namespace zinf::comm::testing
