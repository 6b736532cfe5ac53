// io::File: O_DIRECT alignment from the file system, refusals with clear messages.
#include "io/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf::io {
namespace {

using zinf::testing::ScopedTmpfs;
using zinf::testing::TempDir;

bool IsPowerOfTwo(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

TEST(FileTest, DirectAlignmentComesFromTheFileSystem) {
  TempDir dir;
  auto f = File::Open(dir / "a", {.create = true});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  if (!(*f)->direct()) GTEST_SKIP() << "this file system refuses O_DIRECT";
  const DirectAlignment& a = (*f)->alignment();
  EXPECT_TRUE(IsPowerOfTwo(a.mem)) << a.mem;
  EXPECT_TRUE(IsPowerOfTwo(a.offset)) << a.offset;
  EXPECT_GE(a.offset, 512u);
  EXPECT_FALSE(a.source.empty());
}

TEST(FileTest, CreatesMode0600) {
  TempDir dir;
  auto f = File::Open(dir / "a", {.create = true});
  ASSERT_TRUE(f.ok());
  struct stat st{};
  ASSERT_EQ(stat((dir / "a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST(FileTest, RefusesASymlinkInPlaceOfTheFile) {
  TempDir dir;
  std::string target = dir / "target";
  { auto t = File::Open(target, {.create = true}); ASSERT_TRUE(t.ok()); }
  ASSERT_EQ(symlink(target.c_str(), (dir / "link").c_str()), 0);
  auto f = File::Open(dir / "link", {.create = true});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(f.status().message().find("symbolic link"), std::string::npos);
  EXPECT_NE(f.status().message().find(dir / "link"), std::string::npos);
}

TEST(FileTest, MissingDirectoryIsNamed) {
  TempDir dir;
  std::string path = dir / "no/such/dir/file";
  auto f = File::Open(path, {.create = true});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find(path), std::string::npos);
}

TEST(FileTest, NotARegularFileIsRefused) {
  TempDir dir;
  ASSERT_EQ(mkfifo((dir / "fifo").c_str(), 0600), 0);
  auto f = File::Open(dir / "fifo", {.create = true, .direct = false});
  // O_RDWR on a fifo opens; the type check must refuse it.
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos);
}

TEST(FileTest, UnwritablePathIsRefused) {
  TempDir dir;
  std::string ro = dir / "ro";
  std::filesystem::create_directories(ro);
  std::unique_ptr<ScopedTmpfs> mount;
  if (geteuid() == 0) {
    // Root ignores permission bits: use a read-only mount instead.
    mount = std::make_unique<ScopedTmpfs>(ro, "1M");
    if (!mount->mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
    ASSERT_EQ(::mount(nullptr, ro.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0);
  } else {
    ASSERT_EQ(chmod(ro.c_str(), 0500), 0);
  }
  auto f = File::Open(ro + "/swap", {.create = true});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(f.status().message().find(ro + "/swap"), std::string::npos);
}

TEST(FileTest, FileSystemWithoutODirectFallsBackToBuffered) {
  TempDir dir;
  std::string mnt = dir / "ramfs";
  std::filesystem::create_directories(mnt);
  // ramfs has no O_DIRECT at all.
  if (::mount("zinf-test", mnt.c_str(), "ramfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount a ramfs here";
  }
  {
    auto f = File::Open(mnt + "/swap", {.create = true});
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    EXPECT_FALSE((*f)->direct());
    EXPECT_EQ((*f)->alignment().offset, 1u);
  }
  ::umount2(mnt.c_str(), MNT_DETACH);
}

TEST(FileTest, PreallocateOnAFullDiskNamesPathAndBytes) {
  TempDir dir;
  std::string mnt = dir / "small";
  ScopedTmpfs tmpfs(mnt, "1M");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a size-limited tmpfs here";
  auto f = File::Open(mnt + "/swap", {.create = true});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Status s = (*f)->Preallocate(8 << 20);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.errno_value(), ENOSPC);
  EXPECT_NE(s.message().find(mnt + "/swap"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::to_string(8 << 20)), std::string::npos) << s.message();
}

TEST(FileTest, PreallocateReservesRealBlocks) {
  TempDir dir;
  auto f = File::Open(dir / "a", {.create = true});
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Preallocate(4 << 20).ok());
  struct stat st{};
  ASSERT_EQ(stat((dir / "a").c_str(), &st), 0);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 4u << 20);
  EXPECT_EQ(*(*f)->Size(), 4u << 20);
}

}  // namespace
}  // namespace zinf::io
