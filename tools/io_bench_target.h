// tools/io_bench_target.h — the file `zinf bench-io` and `zinf tune` measure.
//
// Contract: a target is one of three kinds, and a read run only ever reads bytes that are
// really on the disk (a hole or an extent fallocate reserved but nobody wrote reads as zeros
// without touching the disk, which would report memory speed as disk speed).
// - Create(dirs, size, stripe, keep): a new test file "<dir>/zinf-bench-io.dat" (".<i>" when
//   striped over several directories): an io::SwapFile, so created O_EXCL, or our own leftover
//   reused and emptied, then preallocated. Before the first read run it is filled once with a
//   full write pass (EnsureFilled). Removed afterwards unless `keep`.
// - OpenKept(dirs, size, stripe): the test file(s) an earlier run kept, used as they are: no
//   truncation, no preallocation, nothing written before reads, never removed. Each must be
//   our own regular file with one link (io::File `only_own`) and hold, in the bytes the logical
//   range [0, size) maps to, only written data on the disk (io::CheckBacking); otherwise
//   FailedPrecondition names the file and the first offset range that is not (a hole, an
//   unwritten extent, the end of the file). Where the file system has no FIEMAP, a warning says
//   that only holes could be checked.
// - OpenReadOnly(path, size): an existing regular file or block device named by the user
//   (a symlink such as /dev/disk/by-id/... is resolved first), opened O_RDONLY and never
//   modified: RunIoBench refuses write runs on it. size 0 means the whole file or device
//   (rounded down to the O_DIRECT alignment); a larger size than it holds is refused. A regular
//   file must be written data on the disk in [0, size), as for OpenKept.
// Create and OpenKept lock each file (flock) for the life of the target.
//
// Thread-safety: single-threaded use; one run at a time per target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine.h"
#include "io/file.h"
#include "io/swap_file.h"
#include "zinf/status.h"

namespace zinf::tools {

inline constexpr const char* kIoBenchFileName = "zinf-bench-io.dat";

class IoBenchTarget {
 public:
  enum class Kind { kNewFile, kKeptFile, kReadOnlyFile, kBlockDevice };

  static Result<std::unique_ptr<IoBenchTarget>> Create(const std::vector<std::string>& dirs,
                                                       uint64_t size, uint64_t stripe_bytes,
                                                       bool keep);
  static Result<std::unique_ptr<IoBenchTarget>> OpenKept(const std::vector<std::string>& dirs,
                                                         uint64_t size, uint64_t stripe_bytes);
  static Result<std::unique_ptr<IoBenchTarget>> OpenReadOnly(const std::string& path,
                                                             uint64_t size);

  // What Engine::AddFile needs.
  const io::FileLayout& Layout() const { return layout_; }
  uint64_t size() const { return layout_.size; }
  const std::string& path() const { return layout_.members[0].path; }
  size_t member_count() const { return layout_.members.size(); }
  uint32_t offset_align() const { return layout_.offset_align; }
  uint32_t mem_align() const { return layout_.mem_align; }
  bool direct() const { return direct_; }
  Kind kind() const { return kind_; }
  bool read_only() const { return kind_ == Kind::kReadOnlyFile || kind_ == Kind::kBlockDevice; }
  // "new test file", "kept test file", "existing file, read-only", "block device, read-only".
  std::string_view KindName() const;

  // Writes the whole file once before the first read run of a new file (no-op otherwise).
  Status EnsureFilled();

 private:
  IoBenchTarget() = default;
  std::unique_ptr<io::SwapFile> swap_;            // kNewFile
  std::vector<std::unique_ptr<io::File>> files_;  // the others
  io::FileLayout layout_;
  Kind kind_ = Kind::kNewFile;
  bool direct_ = true;
  bool filled_ = false;
};

}  // namespace zinf::tools
