// The C ABI's pinned buffers (include/zinf/zinf.h): page-aligned, locked in RAM, tracked so that
// a free of a pointer zinf did not hand out is refused instead of corrupting the heap. Mapped by
// io::AlignedBuffer: huge pages from 2 MiB up, so large O_DIRECT transfers are not split for the
// device's segment limit.
#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
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
std::map<void*, io::AlignedBuffer>& Buffers() {  // GUARDED_BY(BuffersMu())
  static auto* m = new std::map<void*, io::AlignedBuffer>();
  return *m;
}

Status Alloc(uint64_t bytes, void** out) {
  if (out == nullptr) return InvalidArgument("zinf_pinned_alloc: out is NULL");
  *out = nullptr;
  if (bytes == 0) return InvalidArgument("zinf_pinned_alloc: 0 bytes");
  const uint64_t rounded = (bytes + kPage - 1) / kPage * kPage;
  auto buffer = io::AlignedBuffer::Allocate(rounded, kPage);
  if (!buffer.ok()) return buffer.status().WithContext("zinf_pinned_alloc");
  void* p = buffer->data();
  if (::mlock(p, rounded) != 0) {
    const int err = errno;
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
  Buffers().emplace(p, std::move(*buffer));
  *out = p;
  return Status::Ok();
}

Status Free(void* p) {
  if (p == nullptr) return Status::Ok();
  io::AlignedBuffer buffer;
  {
    std::lock_guard<std::mutex> lock(BuffersMu());
    auto it = Buffers().find(p);
    if (it == Buffers().end()) {
      return InvalidArgument(fmt::format(
          "zinf_pinned_free: {} was not returned by zinf_pinned_alloc (or was freed already)",
          p));
    }
    buffer = std::move(it->second);
    Buffers().erase(it);
  }
  ::munlock(p, buffer.size());
  return Status::Ok();  // buffer unmaps it
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
