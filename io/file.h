// io/file.h — opening files for O_DIRECT I/O, and what alignment O_DIRECT needs on them.
//
// Contract:
// - File::Open never follows a symlink at the final component (O_NOFOLLOW): a symlink in place
//   of the file is refused with FailedPrecondition naming the path. Only regular files are
//   accepted (a block device too with `allow_block_device` and `read_only`); anything else is
//   refused naming what it is, without blocking (a FIFO).
// - With `create`, the file is created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600. A file already
//   at the path is reused only when it is a regular file owned by the effective user with
//   exactly one link (st_nlink == 1); it is then set to mode 0600. Otherwise FailedPrecondition
//   names the path and why (symbolic link, hard link count N, owned by uid U, not a regular
//   file), and the file is left as it was. `only_own` applies the same rule to an existing file
//   opened without `create` (a kept benchmark file that may be rewritten).
// - With `direct`, the file is opened O_DIRECT and its alignment is read from the file system
//   (statx STATX_DIOALIGN where the kernel reports it, else the block device's logical block
//   size from sysfs, else st_blksize) — never assumed. A file system that refuses O_DIRECT
//   (some tmpfs, FUSE) gets a buffered file and one warning per directory; its alignment is 1.
// - Preallocate reserves the bytes with fallocate, after checking the free space, so a full
//   disk is reported up front with the path, the bytes needed and the bytes available.
//
// Thread-safety: a File is immutable after Open; its fd may be used by many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zinf/status.h"

namespace zinf::io {

struct DirectAlignment {
  uint32_t mem = 1;     // buffer address alignment
  uint32_t offset = 1;  // file offset and length alignment
  std::string source;   // "statx", "sysfs logical_block_size", "st_blksize", "buffered"
};

// The O_DIRECT alignment of an open file (see the contract above).
DirectAlignment ProbeDirectAlignment(int fd, const std::string& path);

class File {
 public:
  struct Options {
    bool create = false;
    bool direct = true;
    bool read_only = false;
    bool only_own = false;            // without create: reuse rules as with create
    bool allow_block_device = false;  // with read_only: a block device is accepted too
  };

  static Result<std::unique_ptr<File>> Open(const std::string& path, const Options& options);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }
  const DirectAlignment& alignment() const { return alignment_; }

  Result<uint64_t> Size() const;
  // Grows the file to at least `bytes` with real allocated blocks (fallocate).
  Status Preallocate(uint64_t bytes);

 private:
  File(int fd, std::string path, bool direct, DirectAlignment a)
      : fd_(fd), path_(std::move(path)), direct_(direct), alignment_(std::move(a)) {}
  int fd_;
  std::string path_;
  bool direct_;
  DirectAlignment alignment_;
};

}  // namespace zinf::io
