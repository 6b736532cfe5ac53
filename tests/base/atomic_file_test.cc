// AtomicFile: a file appears whole (after Commit) or not at all; the temporary never survives a
// failure or an abandoned write; a symlink at the destination is replaced, not followed.
#include "src/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf {
namespace {

namespace fs = std::filesystem;
using zinf::testing::TempDir;

size_t EntriesIn(const std::string& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(AtomicFileTest, CommitReplacesTheFileWhole) {
  TempDir dir;
  const std::string path = dir / "m.json";
  ASSERT_TRUE(WriteFileAtomically(path, "old").ok());
  {
    auto f = AtomicFile::Create(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE(f->Append("ne", 2).ok());
    // Until Commit the old content stays and the new one is in a 0600 temporary beside it.
    EXPECT_EQ(*ReadWholeFile(path), "old");
    struct stat st{};
    ASSERT_EQ(::stat(f->temp_path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    ASSERT_TRUE(f->Append("w", 1).ok());
    EXPECT_EQ(f->size(), 3u);
    ASSERT_TRUE(f->Commit().ok());
  }
  EXPECT_EQ(*ReadWholeFile(path), "new");
  EXPECT_EQ(EntriesIn(dir.path()), 1u) << "no temporary left";
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u & ~CurrentUmask());
}

TEST(AtomicFileTest, AnAbandonedWriteLeavesNothingAndTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir / "data.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "kept").ok());
  {
    auto f = AtomicFile::Create(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Append("half", 4).ok());
  }  // destroyed without Commit: a crash between data and commit, in miniature
  EXPECT_EQ(*ReadWholeFile(path), "kept");
  EXPECT_EQ(EntriesIn(dir.path()), 1u);
}

TEST(AtomicFileTest, ASymlinkAtTheDestinationIsReplacedNotFollowed) {
  TempDir dir;
  const std::string target = dir / "victim";
  std::ofstream(target) << "precious";
  const std::string path = dir / "out";
  fs::create_symlink(target, path);
  ASSERT_TRUE(WriteFileAtomically(path, "mine").ok());
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(*ReadWholeFile(path), "mine");
  EXPECT_EQ(*ReadWholeFile(target), "precious");
}

TEST(AtomicFileTest, ReadingAShortFileIsDataLossNamingTheOffset) {
  TempDir dir;
  const std::string path = dir / "short";
  ASSERT_TRUE(WriteFileAtomically(path, "abc").ok());
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[8];
  Status s = PreadAll(fd, buf, 8, 0, path);
  ::close(fd);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("ends at offset 3"), std::string::npos) << s.message();
  EXPECT_FALSE(ReadWholeFile(dir / "missing").ok());
}

}  // namespace
}  // namespace zinf
