// src/comm/work_state.h — the shared state behind a Work (internal to the communicators).
//
// Contract: Finish is called once, by whichever thread ran the operation (the communicator's, or
// a waiter that ran it itself: `runner`); Work::Wait blocks until then.
// Thread-safety: guarded by `mu`; `runner` is set before the Work is handed out and not changed.
#pragma once

#include <condition_variable>
#include <mutex>

#include "src/comm/communicator.h"

namespace zinf::comm {

// A communicator that lets a waiter run its own operation when the operation is still queued
// and nothing else runs (p2p_communicator.h): no hand-off to its thread and back.
class WorkRunner {
 public:
  virtual ~WorkRunner() = default;
  // Runs the queued operations up to and including `target` on the calling thread, when
  // `target` is queued and no operation is running; otherwise returns at once.
  virtual void RunUpTo(const Work::State* target) = 0;
};

struct Work::State {
  WorkRunner* runner = nullptr;  // may run this operation on the waiter's thread
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;    // GUARDED_BY(mu)
  Status status;        // GUARDED_BY(mu)
  void Finish(Status s);
};

}  // namespace zinf::comm
