// io/swap_file.h — preallocated swap files, optionally striped over several directories.
//
// Contract: Create() checks every directory first (exists, is a directory), then creates
// "<dir>/<name>" (or "<dir>/<name>.<i>" when striped over several directories) with
// O_CREAT|O_EXCL|O_NOFOLLOW and mode 0600 (io::File::Open with `create`), and preallocates each
// to its full size before returning — a full disk fails here, naming the path and the bytes
// needed, before any work starts. Striping is RAID-0 in software: stripe unit k lives in member
// k % n (io::FileLayout says how). A file already at the path is reused only when it is a
// regular file owned by the effective user with exactly one link, opened without following a
// symlink; it is then emptied (truncated to 0, then preallocated, mode set to 0600), so a new
// swap file always reads as zeros until written. Anything else there (a symlink, a hard link
// to another file, another user's file, a directory) is refused with FailedPrecondition naming
// the path and why, and left untouched. Each member is locked (flock) for the life of the
// SwapFile: a second process on the same path is refused (FailedPrecondition) instead of
// corrupting the first, after the lock was retried for lock_wait_ms (a process killed a
// moment ago holds it until the kernel has torn its io_uring down). With remove_on_close the files are unlinked when the SwapFile is
// destroyed. With keep_contents (a resume) the files must already be there, pass the same
// ownership checks and have exactly the member size; nothing is truncated.
//
// Thread-safety: immutable after Create; Layout() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/file.h"
#include "zinf/status.h"

namespace zinf::io {

inline constexpr uint64_t kDefaultStripeBytes = 1 << 20;

struct SwapFileOptions {
  std::vector<std::string> dirs;  // one or more directories (one per NVMe drive)
  std::string name = "zinf.swap";
  uint64_t size = 0;              // logical bytes, rounded up to the O_DIRECT alignment
  uint64_t stripe_bytes = kDefaultStripeBytes;
  bool direct = true;
  bool remove_on_close = true;
  // Reopen what a previous run left (a resume from a checkpoint naming extents of it): the
  // files must exist with exactly the size this configuration gives them (NotFound or
  // FailedPrecondition naming the path and both sizes otherwise); their contents are kept.
  bool keep_contents = false;
  // How long a lock held by someone else is retried before the file is taken as another run's.
  uint32_t lock_wait_ms = 5000;
};

class SwapFile {
 public:
  static Result<std::unique_ptr<SwapFile>> Create(const SwapFileOptions& options);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // What Engine::AddFile needs: fds, paths, stripe unit, size, alignment.
  FileLayout Layout() const;
  uint64_t size() const { return size_; }
  uint64_t stripe_bytes() const { return stripe_bytes_; }
  bool direct() const;  // false when any member fell back to buffered I/O
  const std::vector<std::unique_ptr<File>>& members() const { return members_; }
  uint32_t offset_align() const { return offset_align_; }
  uint32_t mem_align() const { return mem_align_; }
  // Makes every completed write durable (fdatasync of each member): a checkpoint's manifest may
  // then name the extents. Thread-safe.
  Status Sync() const;
  // The members' absolute paths (symlinks in the directories resolved).
  std::vector<std::string> Paths() const;

 private:
  SwapFile() = default;
  std::vector<std::unique_ptr<File>> members_;
  uint64_t size_ = 0;
  uint64_t stripe_bytes_ = 0;
  uint32_t offset_align_ = 1;
  uint32_t mem_align_ = 1;
  bool remove_on_close_ = true;
};

}  // namespace zinf::io
