#include "src/base/units.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(UnitsTest, ParsesSuffixes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("128K"), 128u << 10);
  EXPECT_EQ(*ParseBytes("1M"), 1u << 20);
  EXPECT_EQ(*ParseBytes("8MiB"), 8u << 20);
  EXPECT_EQ(*ParseBytes("2g"), 2ull << 30);
}

TEST(UnitsTest, RefusesGarbageNamingIt) {
  auto r = ParseBytes("12Q");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("12Q"), std::string::npos);
  EXPECT_FALSE(ParseBytes("").ok());
  EXPECT_FALSE(ParseBytes("M").ok());
  EXPECT_FALSE(ParseBytes("99999999999999T").ok());
}

TEST(UnitsTest, Lists) {
  auto r = ParseBytesList("128K,1M,8M");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, (std::vector<uint64_t>{128u << 10, 1u << 20, 8u << 20}));
  EXPECT_EQ(*ParseUintList("1,4,16,32"), (std::vector<uint64_t>{1, 4, 16, 32}));
  EXPECT_FALSE(ParseUintList("1,,4").ok());
  EXPECT_FALSE(ParseUintList("1,x").ok());
}

TEST(UnitsTest, SplitCommas) {
  EXPECT_EQ(SplitCommas("uring,aio"), (std::vector<std::string>{"uring", "aio"}));
  EXPECT_EQ(SplitCommas("a,,b"), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(SplitCommas(""), (std::vector<std::string>{""}));
}

TEST(UnitsTest, Seconds) {
  EXPECT_DOUBLE_EQ(*ParseSeconds("2.5"), 2.5);
  EXPECT_DOUBLE_EQ(*ParseSeconds("500ms"), 0.5);
  EXPECT_DOUBLE_EQ(*ParseSeconds("1m"), 60.0);
  EXPECT_FALSE(ParseSeconds("-1").ok());
  EXPECT_FALSE(ParseSeconds("abc").ok());
}

TEST(UnitsTest, Format) {
  EXPECT_EQ(FormatBytesShort(1 << 20), "1M");
  EXPECT_EQ(FormatBytesShort(128 << 10), "128K");
  EXPECT_EQ(FormatBytesShort(1000), "1000");
  EXPECT_EQ(FormatBytesHuman(1536), "1.5 KiB");
}

}  // namespace
}  // namespace zinf
