// tests/io/io_test_env.h — a swap file and an engine of a given kind, ready for round trips.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "io/aligned_buffer.h"
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

}  // namespace zinf::io::testing_env
