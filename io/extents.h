// io/extents.h — which bytes of a file a read really fetches from the disk.
//
// Contract: CheckBacking(fd, path, bytes) looks at [0, bytes) of an open regular file and
// reports every range a read would NOT fetch from the disk, and the first of them:
//   "end of file"       past the file's size;
//   "hole"              not allocated (no extent): reads return zeros;
//   "unwritten extent"  allocated by fallocate but never written (FIEMAP_EXTENT_UNWRITTEN):
//                       reads return zeros without touching the disk.
// Both come from FIEMAP, run with FIEMAP_FLAG_SYNC so data still in the page cache is written
// out first and counts as written. Where the file system has no FIEMAP (tmpfs, some FUSE, NFS)
// the report says so (fiemap_supported false, fiemap_error the reason) and holes come from
// lseek SEEK_HOLE/SEEK_DATA: unwritten extents cannot be told from data there.
// A benchmark that reads such ranges measures memory, not the disk: callers refuse them.
//
// Thread-safety: no state of its own; it moves the fd's file offset (lseek), which pread,
// io_uring and libaio never use.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "zinf/status.h"

namespace zinf::io {

struct UnbackedRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  std::string kind;  // "end of file", "hole", "unwritten extent"
};

struct BackingReport {
  std::optional<UnbackedRange> first;  // the lowest range not on the disk; empty: all of it is
  uint64_t unbacked_bytes = 0;         // all bytes of [0, bytes) not on the disk
  bool fiemap_supported = true;
  std::string fiemap_error;            // why not, when not
};

Result<BackingReport> CheckBacking(int fd, const std::string& path, uint64_t bytes);

}  // namespace zinf::io
