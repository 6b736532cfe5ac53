// src/comm/work_state.h — the shared state behind a Work (internal to the communicators).
//
// Contract: Finish is called once, by the communicator's thread; Work::Wait blocks until then.
// Thread-safety: guarded by `mu`.
#pragma once

#include <condition_variable>
#include <mutex>

#include "src/comm/communicator.h"

namespace zinf::comm {

struct Work::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;    // GUARDED_BY(mu)
  Status status;        // GUARDED_BY(mu)
  void Finish(Status s);
};

}  // namespace zinf::comm
