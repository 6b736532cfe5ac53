// `zinf bench-io` end to end: JSON fields, sweeps, CSV and SVG output, refusals.
#include <fcntl.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using testing::RunZinf;
using testing::TempDir;

TEST(BenchIoCliTest, JsonHasEveryFieldPerRun) {
  TempDir dir;
  auto r = RunZinf("bench-io --path " + dir.path() +
                       " --size 8M --block 64K,256K --qd 1,4 --op read,randwrite --time 0.1"
                       " --engine posix --json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::istringstream lines(r.out);
  std::string line;
  int n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"engine", "op", "block_bytes", "queue_depth", "bytes", "seconds", "gbps",
                          "iops", "lat_p50_us", "lat_p99_us"}) {
      EXPECT_TRUE(j.contains(k)) << k << " missing in " << line;
    }
    EXPECT_EQ(j["engine"], "posix");
    EXPECT_GT(j["bytes"].get<uint64_t>(), 0u);
    EXPECT_GT(j["gbps"].get<double>(), 0.0);
    EXPECT_LE(j["lat_p50_us"].get<double>(), j["lat_p99_us"].get<double>());
    n++;
  }
  EXPECT_EQ(n, 2 * 2 * 2);  // ops x blocks x qds
  // The test file is removed unless --keep.
  EXPECT_FALSE(std::filesystem::exists(dir / "zinf-bench-io.dat"));
}

TEST(BenchIoCliTest, OutWritesCsvAndSvg) {
  TempDir dir;
  std::string out = dir / "charts";
  auto r = RunZinf("bench-io --path " + dir.path() +
                       " --size 4M --block 64K,128K --qd 1,2 --time 0.05 --out " + out,
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("GB/s"), std::string::npos);
  std::ifstream csv(out + "/bench-io.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("engine,op,block_bytes,queue_depth", 0), 0u) << header;
  int rows = 0;
  for (std::string l; std::getline(csv, l);) rows++;
  EXPECT_EQ(rows, 4);
  bool found_svg = false;
  for (auto& e : std::filesystem::directory_iterator(out)) {
    if (e.path().extension() != ".svg") continue;
    found_svg = true;
    std::ifstream in(e.path());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string svg = ss.str();
    EXPECT_NE(svg.find("<svg"), std::string::npos);
    // One line per block size.
    size_t lines = 0;
    for (size_t p = 0; (p = svg.find("<polyline", p)) != std::string::npos; ++p) lines++;
    EXPECT_EQ(lines, 2u);
  }
  EXPECT_TRUE(found_svg);
}

TEST(BenchIoCliTest, BadValuesAreNamed) {
  TempDir dir;
  auto r = RunZinf("bench-io --path " + dir.path() + " --block 12Q", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("12Q"), std::string::npos) << r.err;
  r = RunZinf("bench-io --path " + dir.path() + " --op sideways", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("sideways"), std::string::npos) << r.err;
  r = RunZinf("bench-io --path " + dir.path() + " --engine spdk", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("spdk"), std::string::npos) << r.err;
  r = RunZinf("bench-io --path " + dir.path() + "/missing", dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("missing"), std::string::npos) << r.err;
}

TEST(BenchIoCliTest, MisalignedBlockIsRefusedWithTheAlignment) {
  TempDir dir;
  auto r = RunZinf("bench-io --path " + dir.path() + " --size 1M --block 1000 --time 0.05",
                   dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("multiple of"), std::string::npos) << r.err;
}

TEST(BenchIoCliTest, StripesOverSeveralPaths) {
  TempDir a, b;
  auto r = RunZinf("bench-io --path " + a.path() + " --path " + b.path() +
                       " --size 4M --stripe 256K --op write --time 0.05 --json --keep",
                   a.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(a / "zinf-bench-io.dat.0"));
  EXPECT_TRUE(std::filesystem::exists(b / "zinf-bench-io.dat.1"));
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Regression: `--keep --no-fill` re-created (emptied and re-fallocated) the kept file and then
// read unwritten extents: 40-50 GB/s the disk never saw. The content must survive unchanged.
TEST(BenchIoCliTest, NoFillKeepsTheFileContent) {
  TempDir dir;
  const std::string file = dir / "zinf-bench-io.dat";
  auto w = RunZinf("bench-io --path " + dir.path() +
                       " --size 4M --op write --time 0 --keep --engine posix --json",
                   dir.path());
  ASSERT_EQ(w.exit_code, 0) << w.err;
  const std::string before = Slurp(file);
  ASSERT_EQ(before.size(), 4u << 20);
  ASSERT_NE(before, std::string(4 << 20, '\0'));
  auto r = RunZinf("bench-io --path " + dir.path() +
                       " --size 4M --op read,randread --time 0 --no-fill --engine posix --json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(Slurp(file), before) << "--no-fill changed the kept file";
  // Never removed: it was there before the run.
  EXPECT_TRUE(std::filesystem::exists(file));
}

// Regression: a freshly fallocated file (unwritten extents, zeros from no disk) was read as is.
TEST(BenchIoCliTest, NoFillRefusesAFreshlyFallocatedFile) {
  TempDir dir;
  const std::string file = dir / "zinf-bench-io.dat";
  int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fallocate(fd, 0, 0, 4 << 20), 0);
  ::close(fd);
  auto r = RunZinf("bench-io --path " + dir.path() + " --size 4M --op read --time 0 --no-fill",
                   dir.path());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find(file), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bytes [0, 4194304) are an unwritten extent"), std::string::npos) << r.err;
}

TEST(BenchIoCliTest, NoFillRefusesASparseFileNamingTheHole) {
  TempDir dir;
  const std::string file = dir / "zinf-bench-io.dat";
  {
    std::ofstream f(file, std::ios::binary);
    std::string mib(1 << 20, 'x');
    f.write(mib.data(), static_cast<std::streamsize>(mib.size()));
  }
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  ASSERT_EQ(::truncate(file.c_str(), 4 << 20), 0);
  auto r = RunZinf("bench-io --path " + dir.path() + " --size 4M --no-fill", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bytes [1048576, 4194304) are a hole"), std::string::npos) << r.err;
  EXPECT_EQ(std::filesystem::file_size(file), 4u << 20);
}

TEST(BenchIoCliTest, NoFillWithoutAKeptFileSaysHowToMakeOne) {
  TempDir dir;
  auto r = RunZinf("bench-io --path " + dir.path() + " --size 4M --no-fill", dir.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
}

// Regression: --path had to be a directory. An existing file is read as it is and never
// modified, as fio does with --filename.
TEST(BenchIoCliTest, AnExistingFileIsReadAndNeverModified) {
  TempDir dir;
  const std::string file = dir / "data.bin";
  {
    std::string bytes(3 << 20, '\0');
    zinf::testing::FillRandom(bytes.data(), bytes.size(), 8);
    std::ofstream(file, std::ios::binary).write(bytes.data(),
                                                static_cast<std::streamsize>(bytes.size()));
  }
  const std::string before = Slurp(file);
  const auto mtime = std::filesystem::last_write_time(file);
  auto r = RunZinf("bench-io --path " + file + " --op read,randread --time 0 --engine posix --json",
                   dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // No --size: the whole file, every byte read once per sequential pass.
  auto first = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(first["bytes"].get<uint64_t>(), 3u << 20);
  auto w = RunZinf("bench-io --path " + file + " --op read,write --time 0", dir.path());
  EXPECT_EQ(w.exit_code, 2);
  EXPECT_NE(w.err.find("never modifies"), std::string::npos) << w.err;
  EXPECT_NE(w.err.find(file), std::string::npos) << w.err;
  EXPECT_EQ(Slurp(file), before);
  EXPECT_EQ(std::filesystem::last_write_time(file), mtime);
  EXPECT_FALSE(std::filesystem::exists(dir / "zinf-bench-io.dat"));
}

// A block device (a loop device over a file here) is read the same way, never written.
TEST(BenchIoCliTest, ABlockDeviceIsReadAndNeverModified) {
  TempDir dir;
  const std::string backing = dir / "backing.img";
  {
    std::string bytes(4 << 20, '\0');
    zinf::testing::FillRandom(bytes.data(), bytes.size(), 9);
    std::ofstream(backing, std::ios::binary).write(bytes.data(),
                                                   static_cast<std::streamsize>(bytes.size()));
  }
  const std::string before = Slurp(backing);
  int control = ::open("/dev/loop-control", O_RDWR | O_CLOEXEC);
  if (control < 0) GTEST_SKIP() << "no /dev/loop-control here";
  int n = ::ioctl(control, LOOP_CTL_GET_FREE);
  ::close(control);
  if (n < 0) GTEST_SKIP() << "no free loop device";
  const std::string dev = "/dev/loop" + std::to_string(n);
  int loop = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
  int back = ::open(backing.c_str(), O_RDWR | O_CLOEXEC);
  if (loop < 0 || back < 0 || ::ioctl(loop, LOOP_SET_FD, back) != 0) {
    if (loop >= 0) ::close(loop);
    if (back >= 0) ::close(back);
    GTEST_SKIP() << "cannot attach a loop device here";
  }
  ::close(back);
  auto r = RunZinf("bench-io --path " + dev + " --op read --time 0 --engine posix --json",
                   dir.path());
  auto w = RunZinf("bench-io --path " + dev + " --op write --time 0", dir.path());
  ::ioctl(loop, LOOP_CLR_FD, 0);
  ::close(loop);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')));
  EXPECT_EQ(j["bytes"].get<uint64_t>(), 4u << 20);
  EXPECT_EQ(w.exit_code, 2);
  EXPECT_NE(w.err.find("never modifies"), std::string::npos) << w.err;
  EXPECT_EQ(Slurp(backing), before);
}

}  // namespace
}  // namespace zinf
