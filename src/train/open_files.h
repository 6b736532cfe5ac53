// src/train/open_files.h — read-only descriptors of the files a checkpoint's shards live in,
// opened once each (O_NOFOLLOW) and closed with the set (`zinf ckpt export` reads pieces of
// many shards of the same few files).
//
// Thread-safety: one thread uses a set.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <string>

#include "zinf/status.h"

namespace zinf::train {

class OpenFiles {
 public:
  OpenFiles() = default;
  OpenFiles(const OpenFiles&) = delete;
  OpenFiles& operator=(const OpenFiles&) = delete;
  ~OpenFiles() {
    for (auto& [path, fd] : fds_) ::close(fd);
  }
  Result<int> Get(const std::string& path) {
    auto it = fds_.find(path);
    if (it != fds_.end()) return it->second;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    fds_[path] = fd;
    return fd;
  }

 private:
  std::map<std::string, int> fds_;
};

}  // namespace zinf::train
