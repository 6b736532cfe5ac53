#include "io/extents.h"

#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace zinf::io {
namespace {

constexpr unsigned kExtentsPerCall = 256;

// Records [begin, end) as not on the disk: merged into the first range when it continues it
// with the same kind, or the new first range when it is lower.
void Note(BackingReport* r, uint64_t begin, uint64_t end, const char* kind) {
  if (begin >= end) return;
  r->unbacked_bytes += end - begin;
  if (r->first && r->first->kind == kind && r->first->end == begin) {
    r->first->end = end;
  } else if (!r->first || begin < r->first->begin) {
    r->first = UnbackedRange{begin, end, kind};
  }
}

Status CheckHoles(int fd, const std::string& path, uint64_t limit, BackingReport* r) {
  uint64_t off = 0;
  while (off < limit) {
    off_t hole = ::lseek(fd, static_cast<off_t>(off), SEEK_HOLE);
    if (hole < 0) {
      if (errno == ENXIO) return Status::Ok();  // off is past the end
      return Status::FromErrno(errno, fmt::format("lseek SEEK_HOLE {} offset {}", path, off));
    }
    if (static_cast<uint64_t>(hole) >= limit) return Status::Ok();
    off_t data = ::lseek(fd, hole, SEEK_DATA);
    uint64_t end = limit;
    if (data >= 0) {
      end = std::min<uint64_t>(limit, static_cast<uint64_t>(data));
    } else if (errno != ENXIO) {  // ENXIO: no data after the hole
      return Status::FromErrno(errno, fmt::format("lseek SEEK_DATA {} offset {}", path, hole));
    }
    Note(r, static_cast<uint64_t>(hole), end, "hole");
    off = end;
  }
  return Status::Ok();
}

// Holes (gaps between mapped extents) and unwritten extents in [0, limit), from FIEMAP. Sets
// fiemap_supported false (and notes nothing) when the file system has no FIEMAP.
Status CheckExtents(int fd, const std::string& path, uint64_t limit, BackingReport* r) {
  std::vector<uint64_t> storage(
      (sizeof(fiemap) + kExtentsPerCall * sizeof(fiemap_extent) + 7) / 8);
  auto* fm = reinterpret_cast<fiemap*>(storage.data());
  uint64_t start = 0;  // everything below is accounted for
  while (start < limit) {
    std::memset(fm, 0, storage.size() * 8);
    fm->fm_start = start;
    fm->fm_length = limit - start;
    fm->fm_flags = FIEMAP_FLAG_SYNC;
    fm->fm_extent_count = kExtentsPerCall;
    if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) {
      const int e = errno;
      if (e == EOPNOTSUPP || e == ENOTTY || e == ENOSYS || e == EINVAL) {
        r->fiemap_supported = false;
        r->fiemap_error = fmt::format("FS_IOC_FIEMAP: {}", std::strerror(e));
        return Status::Ok();
      }
      return Status::FromErrno(e, fmt::format("FIEMAP {} offset {}", path, start));
    }
    bool last = fm->fm_mapped_extents == 0;
    for (unsigned i = 0; i < fm->fm_mapped_extents && start < limit; ++i) {
      const fiemap_extent& e = fm->fm_extents[i];
      const uint64_t begin = std::max<uint64_t>(e.fe_logical, start);
      const uint64_t end = std::min<uint64_t>(e.fe_logical + e.fe_length, limit);
      if (begin > start) Note(r, start, std::min(begin, limit), "hole");
      if (end > begin && (e.fe_flags & FIEMAP_EXTENT_UNWRITTEN)) {
        Note(r, begin, end, "unwritten extent");
      }
      start = std::max(start, end);
      last = last || (e.fe_flags & FIEMAP_EXTENT_LAST);
    }
    if (last) break;
  }
  // Nothing mapped after `start`: the rest is a hole.
  if (start < limit) Note(r, start, limit, "hole");
  return Status::Ok();
}

}  // namespace

Result<BackingReport> CheckBacking(int fd, const std::string& path, uint64_t bytes) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat " + path);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t limit = std::min(size, bytes);
  BackingReport r;
  ZINF_RETURN_IF_ERROR(CheckExtents(fd, path, limit, &r));
  // Without FIEMAP, holes at least (ext4 would also count unwritten extents as holes here, so
  // this is the fallback only).
  if (!r.fiemap_supported) ZINF_RETURN_IF_ERROR(CheckHoles(fd, path, limit, &r));
  if (size < bytes) Note(&r, size, bytes, "end of file");
  return r;
}

}  // namespace zinf::io
