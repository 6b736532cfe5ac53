// io::SwapFile: creation, preallocation, striping layout, refusals.
#include "io/swap_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf::io {
namespace {

using zinf::testing::ScopedTmpfs;
using zinf::testing::TempDir;

TEST(SwapFileTest, CreatesPreallocated0600AndRemovesOnClose) {
  TempDir dir;
  std::string path = dir / "zinf.swap";
  {
    auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 3 << 20});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    struct stat st{};
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 3u << 20);
    FileLayout l = (*s)->Layout();
    EXPECT_EQ(l.members.size(), 1u);
    EXPECT_EQ(l.size, 3u << 20);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(SwapFileTest, StripedMembersShareTheSizeByStripeUnits) {
  TempDir a, b;
  auto s = SwapFile::Create(
      {.dirs = {a.path(), b.path()}, .size = 5 << 20, .stripe_bytes = 1 << 20});
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ((*s)->members().size(), 2u);
  // 5 units over 2 members: 3 units each (rounded up).
  for (auto& m : (*s)->members()) EXPECT_EQ(*m->Size(), 3u << 20);
  EXPECT_TRUE(std::filesystem::exists(a / "zinf.swap.0"));
  EXPECT_TRUE(std::filesystem::exists(b / "zinf.swap.1"));
  EXPECT_EQ((*s)->Layout().stripe_bytes, 1u << 20);
}

TEST(SwapFileTest, SymlinkInPlaceOfTheSwapFileIsRefused) {
  TempDir dir;
  std::string victim = dir / "victim";
  std::ofstream(victim) << "precious";
  ASSERT_EQ(symlink(victim.c_str(), (dir / "zinf.swap").c_str()), 0);
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("symbolic link"), std::string::npos);
  std::ifstream in(victim);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "precious");
}

TEST(SwapFileTest, MissingDirectoryIsNamed) {
  TempDir dir;
  auto s = SwapFile::Create({.dirs = {dir / "nope"}, .size = 1 << 20});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find(dir / "nope"), std::string::npos);
}

TEST(SwapFileTest, FullDiskFailsUpFrontWithPathAndBytes) {
  TempDir dir;
  std::string mnt = dir / "small";
  ScopedTmpfs tmpfs(mnt, "1M");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a size-limited tmpfs here";
  auto s = SwapFile::Create({.dirs = {mnt}, .size = 16 << 20});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find(mnt + "/zinf.swap"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find(std::to_string(16 << 20)), std::string::npos);
}

TEST(SwapFileTest, StripeUnitMustMatchTheAlignment) {
  TempDir a, b;
  auto s = SwapFile::Create({.dirs = {a.path(), b.path()}, .size = 1 << 20, .stripe_bytes = 100});
  // Refused unless the file system needs no alignment (buffered fallback).
  if (s.ok()) {
    EXPECT_EQ((*s)->offset_align(), 1u);
  } else {
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("stripe unit 100"), std::string::npos);
  }
}

}  // namespace
}  // namespace zinf::io

namespace zinf::io {
namespace {

TEST(SwapFileTest, ASecondProcessOnTheSamePathIsRefused) {
  zinf::testing::TempDir dir;
  auto first = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false});
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = SwapFile::Create(
      {.dirs = {dir.path()}, .size = 1 << 20, .direct = false, .lock_wait_ms = 100});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
  first->reset();
  EXPECT_TRUE(SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false}).ok());
}

// A checkpoint names extents of the swap file: kept at close, reopened with its contents, only
// at exactly the size the run gives it.
TEST(SwapFileTest, KeptContentsAreReopenedWhole) {
  zinf::testing::TempDir dir;
  const std::string path = dir / "zinf.swap";
  const std::string data(4096, '\x5a');
  {
    auto s = SwapFile::Create(
        {.dirs = {dir.path()}, .size = 1 << 20, .direct = false, .remove_on_close = false});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_EQ(::pwrite((*s)->members()[0]->fd(), data.data(), data.size(), 8192),
              static_cast<ssize_t>(data.size()));
    ASSERT_TRUE((*s)->Sync().ok());
  }
  ASSERT_TRUE(std::filesystem::exists(path)) << "remove_on_close = false keeps the file";
  {
    auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false,
                               .remove_on_close = false, .keep_contents = true});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    std::string back(data.size(), '\0');
    ASSERT_EQ(::pread((*s)->members()[0]->fd(), back.data(), back.size(), 8192),
              static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, data);
    EXPECT_EQ((*s)->Paths(), std::vector<std::string>{std::filesystem::weakly_canonical(path)});
  }
  {
    // A file larger than this configuration needs is reopened as it is (same layout).
    auto smaller = SwapFile::Create({.dirs = {dir.path()}, .size = 512 << 10, .direct = false,
                                     .remove_on_close = false, .keep_contents = true});
    ASSERT_TRUE(smaller.ok()) << smaller.status().ToString();
    std::string back(data.size(), '\0');
    ASSERT_EQ(::pread((*smaller)->members()[0]->fd(), back.data(), back.size(), 8192),
              static_cast<ssize_t>(back.size()));
    EXPECT_EQ(back, data);
  }
  // One smaller than it needs is refused, naming the file.
  auto other_size = SwapFile::Create(
      {.dirs = {dir.path()}, .size = 2 << 20, .direct = false, .keep_contents = true});
  ASSERT_FALSE(other_size.ok());
  EXPECT_NE(other_size.status().message().find(path), std::string::npos)
      << other_size.status().ToString();
  zinf::testing::TempDir empty;
  auto missing = SwapFile::Create(
      {.dirs = {empty.path()}, .size = 1 << 20, .direct = false, .keep_contents = true});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// What a crashed run left in the file is gone: a new swap file reads as zeros.
TEST(SwapFileTest, ALeftoverFileStartsOverAsZeros) {
  zinf::testing::TempDir dir;
  {
    std::ofstream junk(dir / "zinf.swap", std::ios::binary);
    std::string bytes(1 << 20, '\x5a');
    junk.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ASSERT_EQ(::chmod((dir / "zinf.swap").c_str(), 0600), 0);
  auto swap = SwapFile::Create({.dirs = {dir.path()}, .size = 2 << 20, .direct = false});
  ASSERT_TRUE(swap.ok()) << swap.status().ToString();
  std::ifstream in(dir / "zinf.swap", std::ios::binary);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(back.size(), 2u << 20);
  EXPECT_EQ(back, std::string(2 << 20, '\0'));
}

}  // namespace
}  // namespace zinf::io

namespace zinf::io {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Regression: Create opened with O_CREAT but without O_EXCL and then truncated, so a hard link
// planted in a shared swap directory had its target (any file of ours) emptied.
TEST(SwapFileTest, AHardLinkPlantedAtThePathIsRefusedAndItsTargetKept) {
  zinf::testing::TempDir dir;
  std::string victim = dir / "victim";
  std::ofstream(victim) << "precious";
  ASSERT_EQ(::chmod(victim.c_str(), 0600), 0);
  ASSERT_EQ(::link(victim.c_str(), (dir / "zinf.swap").c_str()), 0);
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(dir / "zinf.swap"), std::string::npos)
      << s.status().message();
  EXPECT_NE(s.status().message().find("hard link count 2"), std::string::npos)
      << s.status().message();
  EXPECT_EQ(Slurp(victim), "precious");
}

TEST(SwapFileTest, ADanglingSymlinkIsRefusedAndNothingIsCreatedThroughIt) {
  zinf::testing::TempDir dir, elsewhere;
  std::string target = elsewhere / "planted";
  ASSERT_EQ(symlink(target.c_str(), (dir / "zinf.swap").c_str()), 0);
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("symbolic link"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(target));
}

TEST(SwapFileTest, ADirectoryAtThePathIsRefused) {
  zinf::testing::TempDir dir;
  ASSERT_TRUE(std::filesystem::create_directory(dir / "zinf.swap"));
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(dir / "zinf.swap"), std::string::npos);
  EXPECT_NE(s.status().message().find("not a regular file (a directory)"), std::string::npos)
      << s.status().message();
}

TEST(SwapFileTest, AFifoAtThePathIsRefusedWithoutBlocking) {
  zinf::testing::TempDir dir;
  ASSERT_EQ(mkfifo((dir / "zinf.swap").c_str(), 0600), 0);
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("not a regular file (a FIFO)"), std::string::npos)
      << s.status().message();
}

TEST(SwapFileTest, AnotherUsersFileIsNotReused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another user";
  zinf::testing::TempDir dir;
  std::string path = dir / "zinf.swap";
  std::ofstream(path) << "theirs";
  ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0);
  auto s = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .direct = false});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("owned by uid 65534"), std::string::npos)
      << s.status().message();
  EXPECT_EQ(Slurp(path), "theirs");
}

// Our own leftover (one link, ours) is still reused as before: emptied, preallocated, private.
TEST(SwapFileTest, OurOwnLeftoverIsReusedEmptiedAndMadePrivate) {
  zinf::testing::TempDir dir;
  std::string path = dir / "zinf.swap";
  {
    std::ofstream junk(path, std::ios::binary);
    std::string bytes(3 << 20, '\x5a');
    junk.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto swap = SwapFile::Create({.dirs = {dir.path()}, .size = 1 << 20, .remove_on_close = false});
  ASSERT_TRUE(swap.ok()) << swap.status().ToString();
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(Slurp(path), std::string(1 << 20, '\0'));
}

}  // namespace
}  // namespace zinf::io
