// Engine::Create: which backend runs (uring, aio, posix, or the best the system allows).
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>

#include "io/engine.h"
#include "src/base/log.h"

namespace zinf::io {
namespace {

std::string UringDisabledHint() {
  std::ifstream f("/proc/sys/kernel/io_uring_disabled");
  int v = 0;
  if (f >> v && v != 0) return fmt::format(" (kernel.io_uring_disabled = {})", v);
  return "";
}

}  // namespace

std::string_view EngineKindName(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto: return "auto";
    case EngineKind::kUring: return "uring";
    case EngineKind::kAio: return "aio";
    case EngineKind::kPosix: return "posix";
  }
  return "?";
}

Result<EngineKind> ParseEngineKind(std::string_view name) {
  if (name == "auto") return EngineKind::kAuto;
  if (name == "uring" || name == "io_uring") return EngineKind::kUring;
  if (name == "aio" || name == "libaio") return EngineKind::kAio;
  if (name == "posix" || name == "psync") return EngineKind::kPosix;
  return InvalidArgument(fmt::format("unknown I/O engine '{}': expected uring, aio, posix or auto",
                                     name));
}

Result<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  if (options.queue_depth == 0 || options.queue_depth > 4096) {
    return InvalidArgument(fmt::format("queue_depth {} out of range: expected 1..4096",
                                       options.queue_depth));
  }
  if (options.block_size == 0 || options.block_size > (1u << 30)) {
    return InvalidArgument(fmt::format("block_size {} out of range: expected 1 byte..1 GiB",
                                       options.block_size));
  }
  BackendOptions bo{options.queue_depth, options.posix_threads};
  switch (options.kind) {
    case EngineKind::kUring: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakeUringBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kAio: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakeAioBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kPosix: {
      ZINF_ASSIGN_OR_RETURN(auto b, MakePosixBackend(bo));
      return WithBackend(std::move(b), options);
    }
    case EngineKind::kAuto: break;
  }
  std::string why;
  const char* env = std::getenv("ZINF_IO_DISABLE_URING");
  bool env_off = env != nullptr && std::string_view(env) != "" && std::string_view(env) != "0";
  if (!options.allow_uring || env_off) {
    why = env_off ? "io_uring disabled by ZINF_IO_DISABLE_URING" : "io_uring disabled by config";
  } else {
    auto u = MakeUringBackend(bo);
    if (u.ok()) {
      InfoOnce("io.engine.uring", "io: engine uring (io_uring)");
      return WithBackend(std::move(u).value(), options);
    }
    why = "io_uring refused: " + u.status().message() + UringDisabledHint();
  }
  auto a = MakeAioBackend(bo);
  if (a.ok()) {
    WarnOnce("io.engine.aio", "io: engine aio (libaio); " + why);
    auto e = WithBackend(std::move(a).value(), options);
    e->fallback_reason_ = why;
    return e;
  }
  why += "; libaio refused: " + a.status().message();
  ZINF_ASSIGN_OR_RETURN(auto p, MakePosixBackend(bo));
  WarnOnce("io.engine.posix", "io: engine posix (pread/pwrite threads); " + why);
  auto e = WithBackend(std::move(p), options);
  e->fallback_reason_ = why;
  return e;
}

std::unique_ptr<Engine> Engine::WithBackend(std::unique_ptr<Backend> backend,
                                            const EngineOptions& options) {
  if (options.wrap_backend) backend = options.wrap_backend(std::move(backend));
  return std::unique_ptr<Engine>(new Engine(std::move(backend), options));
}

}  // namespace zinf::io
