// tools::IoBenchTarget: new, kept and read-only targets; reads only ever hit written data.
#include "tools/io_bench_target.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "io/extents.h"
#include "tests/test_util.h"
#include "tools/io_bench.h"

namespace zinf::tools {
namespace {

using zinf::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

IoBenchSpec ReadPass(uint64_t bytes) {
  return {.engine = io::EngineKind::kPosix, .pattern = IoPattern::kRead, .block = 256 << 10,
          .queue_depth = 2, .seconds = 0, .bytes_limit = bytes};
}

IoBenchSpec WritePass(uint64_t bytes) {
  IoBenchSpec s = ReadPass(bytes);
  s.pattern = IoPattern::kWrite;
  return s;
}

// Regression: the fill before reads wrote whole 1 MiB blocks only, so the tail of a file whose
// size is not a multiple of 1 MiB stayed unwritten (and read as zeros from no disk at all).
TEST(IoBenchTargetTest, ANewFileIsAllWrittenBeforeTheFirstRead) {
  TempDir dir;
  const uint64_t size = 3 * kMiB + (256 << 10);
  auto t = IoBenchTarget::Create({dir.path()}, size, kMiB, false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)->kind(), IoBenchTarget::Kind::kNewFile);
  ASSERT_TRUE(RunIoBench(**t, ReadPass(size)).ok());
  auto r = io::CheckBacking((*t)->Layout().members[0].fd, (*t)->path(), (*t)->size());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->first.has_value()) << r->first->kind << " at [" << r->first->begin << ", "
                                     << r->first->end << ")";
}

// Striped: member 0 holds units 0 and 2, member 1 unit 1 only (its second unit, preallocated
// but outside [0, size), is never written and must not be held against it).
TEST(IoBenchTargetTest, KeptStripedFilesAreCheckedWhereTheRangeMapsThem) {
  TempDir a, b;
  {
    auto t = IoBenchTarget::Create({a.path(), b.path()}, 3 * kMiB, kMiB, /*keep=*/true);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(RunIoBench(**t, WritePass(3 * kMiB)).ok());
  }
  auto kept = IoBenchTarget::OpenKept({a.path(), b.path()}, 3 * kMiB, kMiB);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ((*kept)->kind(), IoBenchTarget::Kind::kKeptFile);
  EXPECT_EQ((*kept)->member_count(), 2u);
  auto r = RunIoBench(**kept, ReadPass(3 * kMiB));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 3 * kMiB);
}

TEST(IoBenchTargetTest, AKeptFileWithAnUnwrittenTailIsRefusedNamingTheRange) {
  TempDir dir;
  const std::string path = dir / kIoBenchFileName;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fallocate(fd, 0, 0, 4 * kMiB), 0);
  std::vector<char> data(kMiB, 'q');
  ASSERT_EQ(::pwrite(fd, data.data(), kMiB, 0), static_cast<ssize_t>(kMiB));
  ::close(fd);
  auto t = IoBenchTarget::OpenKept({dir.path()}, 4 * kMiB, kMiB);
  ASSERT_FALSE(t.ok());
  const std::string& m = t.status().message();
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(m.find(path), std::string::npos) << m;
  auto fiemap_probe = ::open(path.c_str(), O_RDONLY);
  auto r = io::CheckBacking(fiemap_probe, path, 4 * kMiB);
  ::close(fiemap_probe);
  ASSERT_TRUE(r.ok());
  if (r->fiemap_supported) {
    EXPECT_NE(m.find("bytes [1048576, 4194304) are an unwritten extent"), std::string::npos) << m;
  }
  // The first MiB alone is fine, and is left as it was.
  auto ok = IoBenchTarget::OpenKept({dir.path()}, kMiB, kMiB);
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
}

TEST(IoBenchTargetTest, AMissingKeptFileSaysHowToMakeOne) {
  TempDir dir;
  auto t = IoBenchTarget::OpenKept({dir.path()}, kMiB, kMiB);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("does not exist"), std::string::npos);
  EXPECT_NE(t.status().message().find("--keep"), std::string::npos);
}

TEST(IoBenchTargetTest, AReadOnlyFileIsReadWholeAndNeverWritten) {
  TempDir dir;
  const std::string path = dir / "data.bin";
  std::vector<char> data(2 * kMiB + 100);
  zinf::testing::FillRandom(data.data(), data.size(), 4);
  std::ofstream(path, std::ios::binary)
      .write(data.data(), static_cast<std::streamsize>(data.size()));
  auto t = IoBenchTarget::OpenReadOnly(path, 0);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->read_only());
  EXPECT_EQ((*t)->kind(), IoBenchTarget::Kind::kReadOnlyFile);
  // The whole file, rounded down to the O_DIRECT alignment.
  EXPECT_EQ((*t)->size(), (2 * kMiB + 100) / (*t)->offset_align() * (*t)->offset_align());
  auto w = RunIoBench(**t, WritePass(kMiB));
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(w.status().message().find("never modified"), std::string::npos);
  EXPECT_TRUE(RunIoBench(**t, ReadPass(2 * kMiB)).ok());
  std::ifstream in(path, std::ios::binary);
  std::vector<char> back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(back, data);
  auto big = IoBenchTarget::OpenReadOnly(path, 4 * kMiB);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("less than --size"), std::string::npos);
}

}  // namespace
}  // namespace zinf::tools
