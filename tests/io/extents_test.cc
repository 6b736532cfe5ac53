// io::CheckBacking: which bytes of a file a read really fetches from the disk.
#include "io/extents.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf::io {
namespace {

using zinf::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

class ExtentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fd_ = ::open((dir_ / "f").c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override { ::close(fd_); }

  void WriteAt(uint64_t off, uint64_t len) {
    std::vector<char> data(len, 'z');
    ASSERT_EQ(::pwrite(fd_, data.data(), len, static_cast<off_t>(off)),
              static_cast<ssize_t>(len));
  }

  BackingReport Check(uint64_t bytes) {
    auto r = CheckBacking(fd_, dir_ / "f", bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : BackingReport{};
  }

  // FIEMAP is what tells unwritten extents from data; without it those tests mean nothing.
  bool HasFiemap() { return Check(0).fiemap_supported; }

  TempDir dir_;
  int fd_ = -1;
};

TEST_F(ExtentsTest, AFullyWrittenFileIsAllOnTheDisk) {
  WriteAt(0, 4 * kMiB);
  BackingReport r = Check(4 * kMiB);
  EXPECT_FALSE(r.first.has_value()) << r.first->kind << " at " << r.first->begin;
  EXPECT_EQ(r.unbacked_bytes, 0u);
}

TEST_F(ExtentsTest, AFreshlyFallocatedFileIsOneUnwrittenRange) {
  ASSERT_EQ(::fallocate(fd_, 0, 0, 4 * kMiB), 0);
  if (!HasFiemap()) GTEST_SKIP() << "no FIEMAP on this file system";
  BackingReport r = Check(4 * kMiB);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->kind, "unwritten extent");
  EXPECT_EQ(r.first->begin, 0u);
  EXPECT_EQ(r.first->end, 4 * kMiB);
  EXPECT_EQ(r.unbacked_bytes, 4 * kMiB);
}

TEST_F(ExtentsTest, AHalfWrittenFallocatedFileIsUnwrittenFromWhereTheWritesStopped) {
  ASSERT_EQ(::fallocate(fd_, 0, 0, 4 * kMiB), 0);
  WriteAt(0, kMiB);  // still in the page cache: FIEMAP_FLAG_SYNC writes it out first
  if (!HasFiemap()) GTEST_SKIP() << "no FIEMAP on this file system";
  BackingReport r = Check(4 * kMiB);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->kind, "unwritten extent");
  EXPECT_EQ(r.first->begin, kMiB);
  EXPECT_EQ(r.first->end, 4 * kMiB);
  EXPECT_EQ(r.unbacked_bytes, 3 * kMiB);
  EXPECT_FALSE(Check(kMiB).first.has_value());  // the written part alone is fine
}

TEST_F(ExtentsTest, ASparseFileIsAHole) {
  ASSERT_EQ(::ftruncate(fd_, 4 * kMiB), 0);
  BackingReport r = Check(4 * kMiB);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->kind, "hole");
  EXPECT_EQ(r.first->begin, 0u);
  EXPECT_EQ(r.first->end, 4 * kMiB);
}

TEST_F(ExtentsTest, AHoleInTheMiddleIsFoundWhereItIs) {
  WriteAt(0, kMiB);
  WriteAt(3 * kMiB, kMiB);
  BackingReport r = Check(4 * kMiB);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->kind, "hole");
  EXPECT_EQ(r.first->begin, kMiB);
  EXPECT_EQ(r.first->end, 3 * kMiB);
  EXPECT_EQ(r.unbacked_bytes, 2 * kMiB);
}

TEST_F(ExtentsTest, BytesPastTheEndAreNamed) {
  WriteAt(0, kMiB);
  BackingReport r = Check(2 * kMiB);
  ASSERT_TRUE(r.first.has_value());
  EXPECT_EQ(r.first->kind, "end of file");
  EXPECT_EQ(r.first->begin, kMiB);
  EXPECT_EQ(r.first->end, 2 * kMiB);
}

// tmpfs has no FIEMAP: the report says so and holes still come from SEEK_HOLE.
TEST(ExtentsFallbackTest, WithoutFiemapHolesAreStillFound) {
  TempDir dir;
  const std::string mnt = dir / "tmpfs";
  zinf::testing::ScopedTmpfs tmpfs(mnt, "16M");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here";
  const std::string path = mnt + "/f";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  std::vector<char> data(kMiB, 'z');
  ASSERT_EQ(::pwrite(fd, data.data(), kMiB, 0), static_cast<ssize_t>(kMiB));
  ASSERT_EQ(::ftruncate(fd, 4 * kMiB), 0);
  auto r = CheckBacking(fd, path, 4 * kMiB);
  ::close(fd);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  if (r->fiemap_supported) GTEST_SKIP() << "this kernel's tmpfs has FIEMAP";
  EXPECT_NE(r->fiemap_error.find("FIEMAP"), std::string::npos) << r->fiemap_error;
  ASSERT_TRUE(r->first.has_value());
  EXPECT_EQ(r->first->kind, "hole");
  EXPECT_EQ(r->first->begin, kMiB);
  EXPECT_EQ(r->first->end, 4 * kMiB);
}

}  // namespace
}  // namespace zinf::io
