#include "zinf/status.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(StatusTest, FromErrnoMapsCodeAndKeepsContext) {
  Status s = Status::FromErrno(ENOSPC, "fallocate /x length 4096");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.errno_value(), ENOSPC);
  EXPECT_NE(s.message().find("fallocate /x length 4096"), std::string::npos);
  EXPECT_NE(s.message().find("errno 28"), std::string::npos);
  EXPECT_EQ(Status::FromErrno(EIO, "x").code(), StatusCode::kIoError);
  EXPECT_EQ(Status::FromErrno(ENOENT, "x").code(), StatusCode::kNotFound);
  EXPECT_EQ(Status::FromErrno(ELOOP, "x").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Status::FromErrno(EACCES, "x").code(), StatusCode::kPermissionDenied);
}

TEST(StatusTest, WithContextPrefixesMessage) {
  Status s = IoError("short read").WithContext("swap /a");
  EXPECT_EQ(s.message(), "swap /a: short read");
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_TRUE(Status().WithContext("x").ok());
}

Result<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  ZINF_ASSIGN_OR_RETURN(int h, Half(x));
  ZINF_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(ResultTest, AssignOrReturnPropagates) {
  ASSERT_TRUE(Quarter(8).ok());
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf
