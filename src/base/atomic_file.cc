#include "src/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>

namespace zinf {
namespace {

std::mutex hook_mu;
std::shared_ptr<const FileFaultHook> hook;  // GUARDED_BY(hook_mu)

// The errno the test hook injects into `op` on `path`, or 0.
int InjectedFault(std::string_view op, const std::string& path) {
  std::shared_ptr<const FileFaultHook> h;
  {
    std::lock_guard<std::mutex> lock(hook_mu);
    h = hook;
  }
  return h ? (*h)(op, path) : 0;
}

// Fails like the system call with the injected errno, else makes it.
template <typename Call>
auto FaultOr(std::string_view op, const std::string& path, Call call) -> decltype(call()) {
  if (const int e = InjectedFault(op, path); e != 0) {
    errno = e;
    return -1;
  }
  return call();
}

std::string DirectoryOf(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

}  // namespace

void SetFileFaultHookForTesting(FileFaultHook h) {
  std::lock_guard<std::mutex> lock(hook_mu);
  hook = h ? std::make_shared<const FileFaultHook>(std::move(h)) : nullptr;
}

unsigned CurrentUmask() {
  // umask(2) can only be read by setting it, which would race with other threads creating
  // files: /proc first, else the get-and-restore dance.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Umask:", 0) == 0) {
      return static_cast<unsigned>(std::strtoul(line.c_str() + 6, nullptr, 8));
    }
  }
  const mode_t m = ::umask(022);
  ::umask(m);
  return m;
}

Result<AtomicFile> AtomicFile::Create(const std::string& path) {
  constexpr int kAttempts = 100;
  thread_local std::mt19937_64 rng{std::random_device{}() ^
                                   std::hash<std::thread::id>{}(std::this_thread::get_id())};
  for (int i = 0; i < kAttempts; ++i) {
    AtomicFile f;
    f.path_ = path;
    f.temp_ = fmt::format("{}.tmp.{}.{:016x}", path, ::getpid(), rng());
    f.fd_ = ::open(f.temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (f.fd_ >= 0) return f;
    if (errno != EEXIST) return Status::FromErrno(errno, "create temporary file " + f.temp_);
  }
  return Status::FromErrno(EEXIST, fmt::format("create a temporary file beside {} ({} names "
                                               "taken)", path, kAttempts));
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept { *this = std::move(other); }

AtomicFile& AtomicFile::operator=(AtomicFile&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    temp_ = std::move(other.temp_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

AtomicFile::~AtomicFile() { Abandon(); }

void AtomicFile::Abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(temp_.c_str());
  fd_ = -1;
}

Status AtomicFile::Append(const void* data, uint64_t n) {
  if (fd_ < 0) return FailedPrecondition("append to " + path_ + ": the file is closed");
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
    const ssize_t w = FaultOr("write", path_, [&] { return ::write(fd_, p + done, chunk); });
    if (w < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      Abandon();
      return Status::FromErrno(e, fmt::format("write {} offset {} length {}", temp_, size_ + done,
                                              chunk));
    }
    done += static_cast<uint64_t>(w);
  }
  size_ += n;
  return Status::Ok();
}

Status AtomicFile::Commit() {
  if (fd_ < 0) return FailedPrecondition("commit " + path_ + ": the file is closed");
  if (FaultOr("fsync", path_, [&] { return ::fsync(fd_); }) != 0) {
    const int e = errno;
    Abandon();
    return Status::FromErrno(e, "fsync " + temp_);
  }
  // Created 0600 so that nobody reads it half written; the finished file gets the mode any new
  // file of this user gets.
  const mode_t mode = 0666 & ~static_cast<mode_t>(CurrentUmask());
  if (::fchmod(fd_, mode) != 0) {
    const int e = errno;
    Abandon();
    return Status::FromErrno(e, fmt::format("chmod {:o} {}", mode, temp_));
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(temp_.c_str());
    return Status::FromErrno(e, "close " + temp_);
  }
  if (FaultOr("rename", path_, [&] { return ::rename(temp_.c_str(), path_.c_str()); }) != 0) {
    const int e = errno;
    ::unlink(temp_.c_str());
    return Status::FromErrno(e, fmt::format("rename {} to {}", temp_, path_));
  }
  return FsyncDirectory(DirectoryOf(path_));
}

Status WriteFileAtomically(const std::string& path, std::string_view bytes) {
  ZINF_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  ZINF_RETURN_IF_ERROR(f.Append(bytes.data(), bytes.size()));
  return f.Commit();
}

Status FsyncDirectory(const std::string& dir) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Status::FromErrno(errno, "open directory " + dir);
  const int rc = FaultOr("fsync_dir", dir, [&] { return ::fsync(dfd); });
  const int e = errno;
  ::close(dfd);
  if (rc != 0) return Status::FromErrno(e, "fsync directory " + dir);
  return Status::Ok();
}

Status PreadAll(int fd, void* dst, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
    const ssize_t r = ::pread(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(
          errno, fmt::format("pread {} offset {} length {}", path, offset + done, chunk));
    }
    if (r == 0) {
      return DataLoss(fmt::format("pread {} offset {} length {}: the file ends at offset {}", path,
                                  offset + done, chunk, offset + done));
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Status PwriteAll(int fd, const void* src, uint64_t n, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(src);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
    const ssize_t r = ::pwrite(fd, p + done, chunk, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(
          errno, fmt::format("pwrite {} offset {} length {}", path, offset + done, chunk));
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Result<std::string> ReadWholeFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return Status::FromErrno(errno, "open " + path);
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::FromErrno(e, "stat " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + " is not a regular file");
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  Status s = PreadAll(fd, out.data(), out.size(), 0, path);
  ::close(fd);
  if (!s.ok()) return s;
  return out;
}

}  // namespace zinf
