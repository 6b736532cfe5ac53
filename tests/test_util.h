// tests/test_util.h — small helpers shared by the tests.
//
// TempDir makes a fresh directory under $ZINF_TEST_TMPDIR, else $TMPDIR, else /tmp, and removes
// it with everything in it when destroyed. ScopedMount mounts a size-limited tmpfs for tests
// that need a full disk; it reports whether the mount was permitted so the test can skip.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

namespace zinf::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("ZINF_TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    if (base == nullptr) base = "/tmp";
    std::string tmpl = std::string(base) + "/zinf-test-XXXXXX";
    path_ = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class ScopedTmpfs {
 public:
  ScopedTmpfs(const std::string& dir, const std::string& size) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    std::string opts = "size=" + size + ",mode=0700";
    mounted_ = ::mount("zinf-test", dir_.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

inline void FillRandom(void* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    __builtin_memcpy(b + i, &v, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

}  // namespace zinf::testing
