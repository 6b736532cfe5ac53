// tests/io/io_test_env.h — a swap file and an engine of a given kind, ready for round trips.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <string>
#include <vector>

#include "io/aligned_buffer.h"
#include "io/backend.h"
#include "io/engine.h"
#include "io/swap_file.h"
#include "tests/test_util.h"

namespace zinf::io::testing_env {

inline std::vector<EngineKind> AllKinds() {
  return {EngineKind::kUring, EngineKind::kAio, EngineKind::kPosix};
}

inline std::string KindName(const ::testing::TestParamInfo<EngineKind>& info) {
  return std::string(EngineKindName(info.param));
}

// Creates an engine of `kind`; sets *skip_reason when the system refuses that kind.
inline std::unique_ptr<Engine> MakeEngine(EngineKind kind, uint64_t block, unsigned qd,
                                          std::string* skip_reason) {
  EngineOptions o;
  o.kind = kind;
  o.block_size = block;
  o.queue_depth = qd;
  auto e = Engine::Create(o);
  if (!e.ok()) {
    *skip_reason = e.status().ToString();
    return nullptr;
  }
  return std::move(e).value();
}

// The raw backend of `kind` (for wrapping in a FaultInjectingBackend).
inline Result<std::unique_ptr<Backend>> MakeRawBackend(EngineKind kind, unsigned qd) {
  BackendOptions bo{qd, 0};
  switch (kind) {
    case EngineKind::kUring: return MakeUringBackend(bo);
    case EngineKind::kAio: return MakeAioBackend(bo);
    default: return MakePosixBackend(bo);
  }
}

// Runs `body` on its own thread. If it has not returned after `limit` (an engine that lost a
// request blocks forever), the test fails with `what` and the process exits at once: a thread
// stuck in the kernel cannot be unwound.
inline void WithinDeadline(std::chrono::seconds limit, const std::string& what,
                           std::function<void()> body) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  std::thread t([body = std::move(body), done] {
    body();
    done->set_value();
  });
  if (f.wait_for(limit) == std::future_status::timeout) {
    ADD_FAILURE() << what << ": still blocked after " << limit.count() << " s (a lost request?)";
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
  t.join();
}

}  // namespace zinf::io::testing_env
