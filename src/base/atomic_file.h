// src/base/atomic_file.h — files that appear whole or not at all (safetensors weights,
// checkpoint manifests and data).
//
// Contract: AtomicFile::Create(path) opens a new file beside `path` (same directory, so the
// rename is atomic) under a name nobody else uses, "<path>.tmp.<pid>.<random>", created
// O_CREAT|O_EXCL|O_NOFOLLOW mode 0600: a file or symlink already there (planted, or another
// writer's) is never opened or followed. Append() writes at the end (EINTR retried, every result
// checked, errors name the file and offset). Commit() fsyncs the data, gives the file the mode
// any new file of this user gets (0666 & ~umask), closes it, renames it over `path` and fsyncs
// the directory: after it returns OK the file survives a crash whole. Until then `path` is
// untouched; a failed step, or destruction without Commit, removes the temporary file.
// WriteFileAtomically does all of it for bytes in memory. ReadWholeFile and PreadAll read with
// every result checked (a short file is DataLoss naming the offset).
//
// Thread-safety: an AtomicFile is used by one thread; distinct ones (even for the same path)
// may be written concurrently, the last Commit wins.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

class AtomicFile {
 public:
  static Result<AtomicFile> Create(const std::string& path);
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&& other) noexcept;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();  // removes the temporary file unless committed

  Status Append(const void* data, uint64_t bytes);
  uint64_t size() const { return size_; }
  Status Commit();

  const std::string& temp_path() const { return temp_; }
  const std::string& path() const { return path_; }

 private:
  AtomicFile() = default;
  void Abandon();
  std::string path_, temp_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Fault injection for tests (a checkpoint commit that meets EIO or ENOSPC): while a hook is
// set, each AtomicFile write ("write"), fsync ("fsync"), rename ("rename") and FsyncDirectory
// ("fsync_dir") first calls it with the operation and the final path (the directory for
// fsync_dir); a non-zero return is the errno that call then fails with, as the system call
// would have. Process-wide and thread-safe; an empty function removes the hook.
using FileFaultHook = std::function<int(std::string_view op, const std::string& path)>;
void SetFileFaultHookForTesting(FileFaultHook hook);

Status WriteFileAtomically(const std::string& path, std::string_view bytes);
// fsync of a directory, so that the names created or renamed in it survive a crash.
Status FsyncDirectory(const std::string& dir);
// The process umask, read without changing it.
unsigned CurrentUmask();

Status PreadAll(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path);
// pwrite until all n bytes are written (EINTR and short writes resumed); errors name the path
// and offset.
Status PwriteAll(int fd, const void* src, uint64_t n, uint64_t offset, const std::string& path);
Result<std::string> ReadWholeFile(const std::string& path);

}  // namespace zinf
