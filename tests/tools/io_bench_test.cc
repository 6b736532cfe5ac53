// tools::RunIoBench and its outputs.
#include "tools/io_bench.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace zinf::tools {
namespace {

using zinf::testing::TempDir;

TEST(IoBenchTest, SequentialReadMovesTheBytesItReports) {
  TempDir dir;
  auto t = IoBenchTarget::Create({dir.path()}, 4 << 20, 1 << 20, false);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  IoBenchSpec spec{.engine = io::EngineKind::kPosix, .pattern = IoPattern::kRead,
                   .block = 256 << 10, .queue_depth = 2, .seconds = 0, .bytes_limit = 4 << 20};
  auto r = RunIoBench(**t, spec);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 4u << 20);
  EXPECT_EQ(r->requests, 16u);
  EXPECT_EQ(r->engine, "posix");
  EXPECT_GT(r->gbps, 0);
  EXPECT_NEAR(r->gbps * 1e9, r->gibps * (1ull << 30), r->gbps * 1e9 * 1e-9);
  EXPECT_LE(r->lat_p50_us, r->lat_p99_us);
  EXPECT_LE(r->lat_p99_us, r->lat_max_us);
}

TEST(IoBenchTest, RefusesBlockLargerThanFileOrMisaligned) {
  TempDir dir;
  auto t = IoBenchTarget::Create({dir.path()}, 1 << 20, 1 << 20, false);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(RunIoBench(**t, {.block = 2 << 20, .seconds = 0.01}).ok());
  if ((*t)->offset_align() > 1) {
    EXPECT_FALSE(RunIoBench(**t, {.block = 1000, .seconds = 0.01}).ok());
  }
}

TEST(IoBenchTest, CsvAndSvgCarryEveryResult) {
  std::vector<IoBenchResult> rs;
  for (uint64_t b : {65536u, 1u << 20}) {
    for (unsigned qd : {1u, 8u, 32u}) {
      IoBenchResult r;
      r.engine = "uring";
      r.block = b;
      r.queue_depth = qd;
      r.gbps = 0.1 * qd + (b >> 20);
      rs.push_back(r);
    }
  }
  std::string csv = FormatCsv(rs);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 7);
  std::string svg = RenderSvgChart(rs, "t");
  size_t lines = 0;
  for (size_t p = 0; (p = svg.find("<polyline", p)) != std::string::npos; ++p) lines++;
  EXPECT_EQ(lines, 2u);
  size_t points = 0;
  for (size_t p = 0; (p = svg.find("<circle", p)) != std::string::npos; ++p) points++;
  EXPECT_EQ(points, 6u);
}

TEST(IoBenchTest, PatternNames) {
  EXPECT_EQ(*ParseIoPattern("randread"), IoPattern::kRandRead);
  EXPECT_FALSE(ParseIoPattern("sideways").ok());
}

}  // namespace
}  // namespace zinf::tools
