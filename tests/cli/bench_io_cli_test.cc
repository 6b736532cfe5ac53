// `zinf bench-io` end to end: JSON fields, sweeps, CSV and SVG output, refusals.
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

}  // namespace
}  // namespace zinf
