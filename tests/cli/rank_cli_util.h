// tests/cli/rank_cli_util.h — what the end-to-end tests of several ranks share: a free port
// for the rendezvous, and `zinf launch` of n ranks on it.
//
// Thread-safety: plain functions. A port found free may be taken by someone else before the
// ranks bind it; the tests then fail naming the port in use (rare on a quiet machine).
#pragma once

#include <cstdint>
#include <string>

#include "src/comm/tcp_store.h"

namespace zinf::testing::ranks {

// A TCP port nobody listened on a moment ago.
inline uint16_t FreePort() {
  auto s = comm::TcpStoreServer::Start("127.0.0.1", 0);
  return s.ok() ? (*s)->port() : 0;
}

// `zinf launch` of n ranks on a free port, up to the "--".
inline std::string LaunchPrefix(int n) {
  return "launch --nproc " + std::to_string(n) + " --grace 2 --master-port " +
         std::to_string(FreePort()) + " -- ";
}

#ifdef ZINF_BINARY
// ... of `zinf <args>`.
inline std::string Launch(int n) { return LaunchPrefix(n) + ZINF_BINARY + " "; }
#endif

}  // namespace zinf::testing::ranks
