// io/request.h — what callers ask the I/O engine to do, and the raw pieces backends run.
//
// A Request is one logical read or write of `len` bytes between host memory `buf` and the
// registered file `file` at `offset`. The Engine splits it into Pieces of at most
// `block_size` bytes (and at stripe boundaries), keeps up to `queue_depth` pieces in flight and
// retries short transfers; backends only ever see Pieces.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <cstddef>
#include <functional>
#include <string_view>

#include "zinf/status.h"

namespace zinf::io {

enum class OpKind : uint8_t { kRead, kWrite };
inline std::string_view OpKindName(OpKind k) { return k == OpKind::kRead ? "read" : "write"; }

using FileId = uint32_t;

// Who waits for a request, most urgent first. The engine cuts pending requests into pieces in
// this order (first come, first served within one priority); pieces already in the kernel are
// never preempted. kDemand: a caller blocks on it now (the default); kPrefetch: fetched ahead of
// use; kBackground: the optimizer's read-ahead and write-behind.
enum class Priority : uint8_t { kDemand = 0, kPrefetch = 1, kBackground = 2 };
inline constexpr int kPriorities = 3;

struct Request {
  OpKind op = OpKind::kRead;
  FileId file = 0;
  uint64_t offset = 0;  // logical offset within the (possibly striped) file
  void* buf = nullptr;
  size_t len = 0;
  Priority priority = Priority::kDemand;
};

// Called once per request, on the thread that reaped its last piece, with the request's final
// status: OK only when every byte was transferred.
using Callback = std::function<void(const Status&)>;

// One contiguous transfer on one member file, as a backend runs it.
struct Piece {
  OpKind op = OpKind::kRead;
  int fd = -1;
  int fixed_file = -1;  // registered-file slot, or -1
  int buf_index = -1;   // registered-buffer index, or -1
  uint64_t offset = 0;  // physical offset within the member file
  void* buf = nullptr;
  uint32_t len = 0;
  uint64_t tag = 0;     // the engine's slot; returned in the completion
};

// What the kernel (or the posix worker) said: bytes transferred, or -errno.
struct RawCompletion {
  uint64_t tag = 0;
  int64_t result = 0;
};

}  // namespace zinf::io
