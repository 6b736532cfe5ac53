// The C ABI's pinned buffers (include/zinf/zinf.h): page-aligned, locked in RAM, tracked so that
// a free of a pointer zinf did not hand out is refused instead of corrupting the heap.
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "src/base/units.h"
#include "src/capi/capi_status.h"
#include "zinf/zinf.h"

namespace zinf::capi {
namespace {

constexpr uint64_t kPage = 4096;

std::mutex& BuffersMu() {
  static std::mutex mu;
  return mu;
}
std::map<void*, uint64_t>& Buffers() {  // GUARDED_BY(BuffersMu())
  static auto* m = new std::map<void*, uint64_t>();
  return *m;
}

Status Alloc(uint64_t bytes, void** out) {
  if (out == nullptr) return InvalidArgument("zinf_pinned_alloc: out is NULL");
  *out = nullptr;
  if (bytes == 0) return InvalidArgument("zinf_pinned_alloc: 0 bytes");
  const uint64_t rounded = (bytes + kPage - 1) / kPage * kPage;
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) {
    return ResourceExhausted(fmt::format("zinf_pinned_alloc: {} bytes: out of memory", bytes));
  }
  if (::mlock(p, rounded) != 0) {
    const int err = errno;
    std::free(p);
    rlimit lim{};
    ::getrlimit(RLIMIT_MEMLOCK, &lim);
    return Status::FromErrno(
        err, fmt::format("zinf_pinned_alloc: mlock of {} bytes ({}) refused; RLIMIT_MEMLOCK is "
                         "{} bytes (ulimit -l, or memlock in limits.conf)",
                         rounded, FormatBytesHuman(rounded),
                         lim.rlim_cur == RLIM_INFINITY ? std::string("unlimited")
                                                       : std::to_string(lim.rlim_cur)));
  }
  std::lock_guard<std::mutex> lock(BuffersMu());
  Buffers()[p] = rounded;
  *out = p;
  return Status::Ok();
}

Status Free(void* p) {
  if (p == nullptr) return Status::Ok();
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(BuffersMu());
    auto it = Buffers().find(p);
    if (it == Buffers().end()) {
      return InvalidArgument(fmt::format(
          "zinf_pinned_free: {} was not returned by zinf_pinned_alloc (or was freed already)",
          p));
    }
    bytes = it->second;
    Buffers().erase(it);
  }
  ::munlock(p, bytes);
  std::free(p);
  return Status::Ok();
}

}  // namespace
}  // namespace zinf::capi

extern "C" {

ZINF_API int zinf_pinned_alloc(uint64_t bytes, void** out) {
  return zinf::capi::Guard("zinf_pinned_alloc", [&] { return zinf::capi::Alloc(bytes, out); });
}

ZINF_API int zinf_pinned_free(void* ptr) {
  return zinf::capi::Guard("zinf_pinned_free", [&] { return zinf::capi::Free(ptr); });
}

}  // extern "C"
