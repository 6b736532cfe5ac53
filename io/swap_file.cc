#include "io/swap_file.h"

#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

namespace zinf::io {

namespace fs = std::filesystem;

Result<std::unique_ptr<SwapFile>> SwapFile::Create(const SwapFileOptions& o) {
  if (o.dirs.empty()) return InvalidArgument("swap file: no directory given");
  if (o.size == 0) return InvalidArgument("swap file: size must be > 0");
  if (o.dirs.size() > 1 && o.stripe_bytes == 0) {
    return InvalidArgument("swap file: stripe unit must be > 0 when striping over directories");
  }
  for (const auto& d : o.dirs) {
    std::error_code ec;
    auto st = fs::status(d, ec);
    if (ec || !fs::exists(st)) {
      return NotFound(fmt::format("swap directory {} does not exist", d));
    }
    if (!fs::is_directory(st)) {
      return InvalidArgument(fmt::format("swap directory {} is not a directory", d));
    }
  }
  auto swap = std::unique_ptr<SwapFile>(new SwapFile());
  swap->remove_on_close_ = o.remove_on_close;
  const size_t n = o.dirs.size();
  for (size_t i = 0; i < n; ++i) {
    std::string path = (fs::path(o.dirs[i]) / (n > 1 ? fmt::format("{}.{}", o.name, i)
                                                      : o.name)).string();
    if (o.keep_contents && !fs::exists(fs::symlink_status(path))) {
      return NotFound(fmt::format(
          "swap file {} does not exist: the checkpoint being resumed keeps its optimizer state "
          "there (was the swap directory emptied, or zinf.offload_optimizer.nvme_path changed?)",
          path));
    }
    auto f = File::Open(path, File::Options{.create = !o.keep_contents, .direct = o.direct,
                                            .only_own = o.keep_contents});
    if (!f.ok()) return f.status();
    // One process per swap file: a second run on the same directory would corrupt both. A
    // process killed a moment ago may still hold the lock: the kernel tears its io_uring down
    // (and with it the ring's reference to the file) asynchronously after the exit, so a lock
    // held by someone is retried for lock_wait_ms before it is taken as another run's.
    int e = 0;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(o.lock_wait_ms);
    while (::flock((*f)->fd(), LOCK_EX | LOCK_NB) != 0) {
      e = errno;
      if (e != EWOULDBLOCK || std::chrono::steady_clock::now() >= give_up) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      e = 0;
    }
    if (e != 0) {
      return e == EWOULDBLOCK
                 ? FailedPrecondition(fmt::format("swap file {} is in use by another process; "
                                                  "give each run its own swap directory", path))
                 : Status::FromErrno(e, "lock swap file " + path);
    }
    // A swap file starts empty (what a crashed run left is discarded), so after preallocation
    // every byte reads as zero.
    if (!o.keep_contents && ::ftruncate((*f)->fd(), 0) != 0) {
      return Status::FromErrno(errno, "truncate swap file " + path);
    }
    swap->offset_align_ = std::max(swap->offset_align_, (*f)->alignment().offset);
    swap->mem_align_ = std::max(swap->mem_align_, (*f)->alignment().mem);
    swap->members_.push_back(std::move(f).value());
  }
  const uint64_t align = swap->offset_align_;
  swap->size_ = (o.size + align - 1) / align * align;
  uint64_t member_bytes = swap->size_;
  if (n > 1) {
    if (o.stripe_bytes % align != 0) {
      return InvalidArgument(fmt::format(
          "swap file: stripe unit {} is not a multiple of the O_DIRECT alignment {} of {}",
          o.stripe_bytes, align, swap->members_[0]->path()));
    }
    swap->stripe_bytes_ = o.stripe_bytes;
    uint64_t units = (swap->size_ + o.stripe_bytes - 1) / o.stripe_bytes;
    member_bytes = (units + n - 1) / n * o.stripe_bytes;
  }
  for (auto& m : swap->members_) {
    if (o.keep_contents) {
      ZINF_ASSIGN_OR_RETURN(uint64_t have, m->Size());
      // Larger is fine: offsets map to members by the stripe unit alone, so the layout is
      // the same (zinf before 2026-12-05 gave every rank a swap file for the whole model).
      if (have < member_bytes) {
        return FailedPrecondition(fmt::format(
            "swap file {} holds {} bytes, this configuration needs {}: the swap settings "
            "(zinf.offload_optimizer, zinf.offload_param, the model) differ from the run that "
            "wrote the checkpoint", m->path(), have, member_bytes));
      }
    }
    ZINF_RETURN_IF_ERROR(m->Preallocate(member_bytes));
  }
  return swap;
}

Status SwapFile::Sync() const {
  for (auto& m : members_) {
    if (::fdatasync(m->fd()) != 0) return Status::FromErrno(errno, "fdatasync " + m->path());
  }
  return Status::Ok();
}

std::vector<std::string> SwapFile::Paths() const {
  std::vector<std::string> out;
  for (auto& m : members_) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(m->path()), ec);
    out.push_back(ec ? fs::absolute(m->path()).lexically_normal().string() : p.string());
  }
  return out;
}

SwapFile::~SwapFile() {
  if (!remove_on_close_) return;
  for (auto& m : members_) ::unlink(m->path().c_str());
}

FileLayout SwapFile::Layout() const {
  FileLayout l;
  for (auto& m : members_) l.members.push_back(FileMember{m->fd(), m->path()});
  l.stripe_bytes = stripe_bytes_;
  l.size = size_;
  l.mem_align = mem_align_;
  l.offset_align = offset_align_;
  return l;
}

bool SwapFile::direct() const {
  return std::all_of(members_.begin(), members_.end(), [](auto& m) { return m->direct(); });
}

}  // namespace zinf::io
