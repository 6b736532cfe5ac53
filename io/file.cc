#include "io/file.h"

// Only <linux/stat.h> knows STATX_DIOALIGN and stx_dio_*: this file uses the raw statx syscall
// on <linux/stat.h>'s struct statx (<sys/stat.h>, here for fchmod, takes it from there too).
#include <fcntl.h>
#include <linux/stat.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "src/base/log.h"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x00002000U
#endif

namespace zinf::io {
namespace {

bool StatxDioAlign(int fd, uint32_t* mem, uint32_t* offset) {
  struct statx stx{};
  long rc = syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx);
  if (rc != 0 || !(stx.stx_mask & STATX_DIOALIGN)) return false;
  if (stx.stx_dio_offset_align == 0) return false;  // the file system says: no O_DIRECT
  *mem = stx.stx_dio_mem_align;
  *offset = stx.stx_dio_offset_align;
  return true;
}

// The logical block size of the block device holding the file, from sysfs. Partitions have no
// queue/ of their own; their parent device's is one level up.
uint32_t SysfsLogicalBlockSize(uint32_t major, uint32_t minor) {
  std::string base = fmt::format("/sys/dev/block/{}:{}", major, minor);
  for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream f(base + rel);
    uint32_t v = 0;
    if (f >> v && v > 0) return v;
  }
  return 0;
}

}  // namespace

DirectAlignment ProbeDirectAlignment(int fd, const std::string& path) {
  DirectAlignment a;
  if (StatxDioAlign(fd, &a.mem, &a.offset)) {
    a.source = "statx";
    return a;
  }
  struct statx stx{};
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) == 0) {
    // A block device's own queue; a file's, the device holding it.
    const bool bdev = (stx.stx_mode & S_IFMT) == S_IFBLK;
    uint32_t lbs = bdev ? SysfsLogicalBlockSize(stx.stx_rdev_major, stx.stx_rdev_minor)
                        : SysfsLogicalBlockSize(stx.stx_dev_major, stx.stx_dev_minor);
    if (lbs > 0) {
      a.mem = a.offset = lbs;
      a.source = "sysfs logical_block_size";
      return a;
    }
    a.mem = a.offset = stx.stx_blksize > 0 ? stx.stx_blksize : 4096;
    a.source = "st_blksize";
    WarnOnce("io.align." + path,
             fmt::format("io: {}: the kernel reports no O_DIRECT alignment; using the file "
                         "system block size {}", path, a.offset));
  }
  return a;
}

namespace {

std::string FileTypeName(uint32_t mode) {
  switch (mode & S_IFMT) {
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return fmt::format("of type {:o}", mode & S_IFMT);
  }
}

// open(2) with `flags`, O_DIRECT first when *direct; a file system that refuses O_DIRECT
// (EINVAL: tmpfs before Linux 6.6, some FUSE) gets the same open buffered, once warned.
int OpenMaybeDirect(const std::string& path, int flags, bool* direct) {
  int fd = ::open(path.c_str(), flags | (*direct ? O_DIRECT : 0), 0600);
  if (fd < 0 && *direct && errno == EINVAL) {
    *direct = false;
    fd = ::open(path.c_str(), flags, 0600);
    if (fd >= 0) {
      std::string dir = std::filesystem::path(path).parent_path().string();
      WarnOnce("io.buffered." + dir,
               fmt::format("io: the file system of {} refuses O_DIRECT; using buffered I/O "
                           "there (the page cache will take memory and skew benchmarks)", dir));
    }
  }
  return fd;
}

}  // namespace

Result<std::unique_ptr<File>> File::Open(const std::string& path, const Options& options) {
  // O_NONBLOCK: opening a FIFO planted at the path must not block (cleared again below: io_uring
  // would answer EAGAIN on an O_NONBLOCK file instead of waiting for the disk).
  const int flags =
      O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (options.read_only ? O_RDONLY : O_RDWR);
  bool direct = options.direct;
  bool created = false;
  int fd = -1;
  if (options.create) {
    // Only a file this call creates is trusted as is; O_EXCL never opens what is there.
    fd = OpenMaybeDirect(path, flags | O_CREAT | O_EXCL, &direct);
    created = fd >= 0;
    if (fd < 0 && errno == EEXIST) fd = OpenMaybeDirect(path, flags, &direct);
  } else {
    fd = OpenMaybeDirect(path, flags, &direct);
  }
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP) {
      return FailedPrecondition(fmt::format(
          "open {}: it is a symbolic link; swap files are never opened through a symlink "
          "(remove it or point the path at a real directory)", path));
    }
    if (e == EISDIR) {
      return FailedPrecondition(fmt::format("open {}: not a regular file (a directory)", path));
    }
    if (e == ENOENT && !options.create) return Status::FromErrno(e, "open " + path);
    if (e == ENOENT) {
      return Status::FromErrno(e, fmt::format("create {} (does the directory {} exist?)", path,
                                              std::filesystem::path(path).parent_path().string()));
    }
    return Status::FromErrno(e, std::string(options.create ? "create " : "open ") + path);
  }
  auto refuse = [&](Status s) {
    ::close(fd);
    return s;
  };
  struct statx stx{};
  if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH,
              STATX_TYPE | STATX_MODE | STATX_UID | STATX_NLINK, &stx) != 0) {
    return refuse(Status::FromErrno(errno, "statx " + path));
  }
  const bool block_device = (stx.stx_mode & S_IFMT) == S_IFBLK;
  if ((stx.stx_mode & S_IFMT) != S_IFREG &&
      !(block_device && options.read_only && options.allow_block_device)) {
    return refuse(FailedPrecondition(
        fmt::format("open {}: not a regular file ({})", path, FileTypeName(stx.stx_mode))));
  }
  if ((options.create || options.only_own) && !created) {
    // Reusing what is already there: only our own file, with no other name. A hard link
    // planted in a shared directory would have us empty its target; another user's file is
    // theirs to keep.
    const uid_t me = geteuid();
    if (stx.stx_uid != me) {
      return refuse(FailedPrecondition(fmt::format(
          "open {}: the existing file is owned by uid {}, not by this user (uid {}); it is not "
          "reused (remove it or choose another directory)", path, stx.stx_uid, me)));
    }
    if (stx.stx_nlink != 1) {
      return refuse(FailedPrecondition(fmt::format(
          "open {}: the existing file has hard link count {} (expected 1: another name points "
          "at it); it is not reused (remove it or choose another directory)",
          path, stx.stx_nlink)));
    }
    if ((stx.stx_mode & 07777) != 0600 && ::fchmod(fd, 0600) != 0) {
      return refuse(Status::FromErrno(errno, "chmod 0600 " + path));
    }
  }
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return refuse(Status::FromErrno(errno, "fcntl (clear O_NONBLOCK) " + path));
  }
  DirectAlignment a = direct ? ProbeDirectAlignment(fd, path) : DirectAlignment{1, 1, "buffered"};
  return std::unique_ptr<File>(new File(fd, path, direct, std::move(a)));
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

Result<uint64_t> File::Size() const {
  off_t end = ::lseek(fd_, 0, SEEK_END);
  if (end < 0) return Status::FromErrno(errno, "lseek " + path_);
  return static_cast<uint64_t>(end);
}

Status File::Preallocate(uint64_t bytes) {
  struct statx stx{};
  if (syscall(SYS_statx, fd_, "", AT_EMPTY_PATH, STATX_SIZE | STATX_BLOCKS, &stx) != 0) {
    return Status::FromErrno(errno, "statx " + path_);
  }
  uint64_t allocated = stx.stx_blocks * 512;
  struct statvfs vfs{};
  if (allocated < bytes && fstatvfs(fd_, &vfs) == 0) {
    uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    uint64_t need = bytes - allocated;
    if (avail < need) {
      return Status(StatusCode::kResourceExhausted,
                    fmt::format("preallocate {}: needs {} more bytes ({} in all) but the file "
                                "system has {} bytes available",
                                path_, need, bytes, avail),
                    ENOSPC);
    }
  }
  int rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
    rc = posix_fallocate(fd_, 0, static_cast<off_t>(bytes));  // emulated by writing
    if (rc != 0) errno = rc;
  }
  if (rc != 0) {
    int e = errno;
    return Status::FromErrno(e, fmt::format("preallocate {} bytes for {}", bytes, path_));
  }
  return Status::Ok();
}

}  // namespace zinf::io
