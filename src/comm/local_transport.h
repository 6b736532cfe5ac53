// src/comm/local_transport.h — ranks as threads of one process: world 1 for a single-rank run,
// and the unit tests of every collective (the same algorithms the Gloo transport runs).
//
// Contract: a LocalGroup of `world` ranks hands out one Transport per rank (Join, once each).
// A send copies its bytes into the receiver's mailbox and never waits; a receive waits for the
// message with its sender and tag. Kill(rank) simulates a dead rank: its own exchanges and every
// receive from it fail with Unavailable naming it (messages it sent before stay deliverable, as
// bytes already in a socket would be). A receive of a size other than what was sent fails with
// Internal naming both sizes.
//
// Thread-safety: the group is thread-safe; each Transport is used by one thread at a time. The
// group must outlive its transports.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "src/comm/transport.h"

namespace zinf::comm {

class LocalGroup {
 public:
  explicit LocalGroup(int world);
  int world() const { return world_; }
  std::unique_ptr<Transport> Join(int rank);
  void Kill(int rank);

 private:
  friend class LocalTransport;
  using Key = std::tuple<int, int, uint64_t>;  // (to, from, tag)
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Key, std::vector<uint8_t>> mail_;  // GUARDED_BY(mu_)
  std::vector<char> dead_;                    // GUARDED_BY(mu_)
};

}  // namespace zinf::comm
