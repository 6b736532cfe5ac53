// The C ABI's file I/O (include/zinf/zinf.h): DeepSpeed's aio_handle over io/engine.h. Each
// path is opened once per handle and mode (read / write) and registered with the engine; the
// transfers queued since the last wait are its tickets.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/engine.h"
#include "io/file.h"
#include "src/capi/capi_status.h"
#include "zinf/zinf.h"

struct zinf_io {
  std::unique_ptr<zinf::io::Engine> engine;
  bool direct = true;
  struct OpenFile {
    std::unique_ptr<zinf::io::File> file;
    zinf::io::FileId id = 0;
  };
  std::map<std::string, OpenFile> files;  // "r:<path>" / "w:<path>"
  std::vector<zinf::io::Ticket> tickets;  // queued since the last wait
  uint64_t queued = 0;
  zinf::Status deferred;  // the first failure among transfers waited for early
};

namespace zinf::capi {
namespace {

// Files may grow by writes and reads may run past their end (OutOfRange from the engine): the
// logical size the engine checks requests against is set beyond any real file.
constexpr uint64_t kUnbounded = uint64_t{1} << 62;

Status Open(const zinf_io_params* p, zinf_io** out) {
  if (out == nullptr) return InvalidArgument("zinf_io_open: out is NULL");
  *out = nullptr;
  ZINF_RETURN_IF_ERROR(
      CheckSized(p, p == nullptr ? 0 : p->size, sizeof(zinf_io_params), "zinf_io_open: params"));
  io::EngineOptions o;
  if (p->block_size != 0) o.block_size = p->block_size;
  if (p->queue_depth != 0) o.queue_depth = p->queue_depth;
  ZINF_ASSIGN_OR_RETURN(o.kind, io::ParseEngineKind(p->engine == nullptr ? "auto" : p->engine));
  auto h = std::make_unique<zinf_io>();
  h->direct = p->direct != 0;
  ZINF_ASSIGN_OR_RETURN(h->engine, io::Engine::Create(o));
  *out = h.release();
  return Status::Ok();
}

// Waits for every queued transfer; the first failure.
Status WaitAll(zinf_io* h) {
  Status first = std::exchange(h->deferred, Status::Ok());
  for (io::Ticket t : h->tickets) {
    Status s = h->engine->Wait(t);
    if (first.ok() && !s.ok()) first = s;
  }
  h->tickets.clear();
  return first;
}

Result<io::FileId> FileFor(zinf_io* h, const char* path, bool write) {
  if (path == nullptr || *path == '\0') return InvalidArgument("path is NULL or empty");
  const std::string key = std::string(write ? "w:" : "r:") + path;
  auto it = h->files.find(key);
  if (it != h->files.end()) return it->second.id;
  // Registering a file needs the engine idle: what is in flight finishes first (its failure
  // is kept for the next wait).
  if (!h->tickets.empty()) {
    Status s = WaitAll(h);
    if (h->deferred.ok()) h->deferred = s;
  }
  io::File::Options fo;
  fo.direct = h->direct;
  fo.create = write;
  fo.read_only = !write;
  ZINF_ASSIGN_OR_RETURN(auto file, io::File::Open(path, fo));
  io::FileLayout layout;
  layout.members.push_back({file->fd(), file->path()});
  layout.size = kUnbounded;
  layout.mem_align = file->alignment().mem;
  layout.offset_align = file->alignment().offset;
  ZINF_ASSIGN_OR_RETURN(io::FileId id, h->engine->AddFile(std::move(layout)));
  h->files[key] = {std::move(file), id};
  return id;
}

Status Queue(zinf_io* h, io::OpKind op, void* buf, uint64_t bytes, const char* path,
             uint64_t offset) {
  const char* call = op == io::OpKind::kRead ? "zinf_io_pread" : "zinf_io_pwrite";
  if (h == nullptr) return InvalidArgument(fmt::format("{}: io is NULL", call));
  if (buf == nullptr && bytes > 0) return InvalidArgument(fmt::format("{}: buf is NULL", call));
  if (bytes == 0) return Status::Ok();
  auto id = FileFor(h, path, op == io::OpKind::kWrite);
  if (!id.ok()) return id.status().WithContext(call);
  auto t = h->engine->Submit({.op = op, .file = *id, .offset = offset, .buf = buf, .len = bytes});
  if (!t.ok()) return t.status().WithContext(call);
  h->tickets.push_back(*t);
  ++h->queued;
  return Status::Ok();
}

}  // namespace
}  // namespace zinf::capi

using zinf::capi::Guard;

extern "C" {

ZINF_API int zinf_io_open(const zinf_io_params* params, zinf_io** out) {
  return Guard("zinf_io_open", [&] { return zinf::capi::Open(params, out); });
}

ZINF_API int zinf_io_close(zinf_io* io) {
  if (io == nullptr) return ZINF_OK;
  return Guard("zinf_io_close", [&] {
    zinf::capi::WaitAll(io).IgnoreError();
    delete io;
    return zinf::Status::Ok();
  });
}

ZINF_API int zinf_io_pread(zinf_io* io, void* buf, uint64_t bytes, const char* path,
                           uint64_t offset) {
  return Guard("zinf_io_pread", [&] {
    return zinf::capi::Queue(io, zinf::io::OpKind::kRead, buf, bytes, path, offset);
  });
}

ZINF_API int zinf_io_pwrite(zinf_io* io, const void* buf, uint64_t bytes, const char* path,
                            uint64_t offset) {
  return Guard("zinf_io_pwrite", [&] {
    return zinf::capi::Queue(io, zinf::io::OpKind::kWrite, const_cast<void*>(buf), bytes, path,
                             offset);
  });
}

ZINF_API int zinf_io_wait(zinf_io* io, uint64_t* completed) {
  return Guard("zinf_io_wait", [&] {
    if (io == nullptr) return zinf::InvalidArgument("zinf_io_wait: io is NULL");
    zinf::Status s = zinf::capi::WaitAll(io);
    if (completed != nullptr) *completed = io->queued;
    io->queued = 0;
    return s.WithContext("zinf_io_wait");
  });
}

ZINF_API int zinf_io_sync_pread(zinf_io* io, void* buf, uint64_t bytes, const char* path,
                                uint64_t offset) {
  const int queued = zinf_io_pread(io, buf, bytes, path, offset);
  if (queued != ZINF_OK) return queued;
  return zinf_io_wait(io, nullptr);
}

ZINF_API int zinf_io_sync_pwrite(zinf_io* io, const void* buf, uint64_t bytes,
                                 const char* path, uint64_t offset) {
  const int queued = zinf_io_pwrite(io, buf, bytes, path, offset);
  if (queued != ZINF_OK) return queued;
  return zinf_io_wait(io, nullptr);
}

ZINF_API const char* zinf_io_engine(const zinf_io* io) {
  static thread_local std::string name;
  name = io == nullptr ? "" : std::string(io->engine->name());
  return name.c_str();
}

}  // extern "C"
