#include "base/status.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "base/unique_fd.h"

namespace ckptfs {
namespace {

TEST(StatusTest, OkAndErrors) {
  EXPECT_TRUE(Status::Ok().ok());
  EXPECT_EQ(Status::Ok().code(), 0);
  EXPECT_EQ(Status::Ok().ToString(), "OK");

  Status e = Status::Error(ENOSPC, "disk full");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.code(), ENOSPC);
  EXPECT_EQ(e.message(), "disk full");
  // An error never reads as success, even with errno 0.
  EXPECT_EQ(Status::Error(0, "x").code(), EIO);
}

TEST(StatusTest, FromErrnoNamesTheOperation) {
  Status s = Status::FromErrno(ENOENT, "open ns/a/b");
  EXPECT_EQ(s.code(), ENOENT);
  EXPECT_EQ(s.message(), std::string("open ns/a/b: ") + std::strerror(ENOENT));
  errno = EACCES;
  EXPECT_EQ(Status::FromErrno("x").code(), EACCES);
}

TEST(StatusTest, CorruptionAndContext) {
  Status c = Status::Corruption("bad magic");
  EXPECT_EQ(c.code(), EIO);
  EXPECT_EQ(c.message(), "corruption: bad magic");
  Status w = c.WithContext("reading pack 00ff");
  EXPECT_EQ(w.code(), EIO);
  EXPECT_EQ(w.message(), "reading pack 00ff: corruption: bad magic");
  EXPECT_TRUE(Status::Ok().WithContext("ignored").ok());
  EXPECT_EQ(Status::InvalidArgument("no").code(), EINVAL);
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(ResultTest, ValueAndStatus) {
  Result<int> r = Half(8);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(*r, 4);
  EXPECT_TRUE(r.status().ok());

  Result<int> bad = Half(3);
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), EINVAL);
}

TEST(ResultTest, MacrosPropagate) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), EINVAL);  // 6 -> 3 -> odd
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_EQ(CheckEven(1).code(), EINVAL);
}

TEST(ResultTest, MoveOnlyValues) {
  Result<std::unique_ptr<int>> r = std::make_unique<int>(7);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<int> p = std::move(r).value();
  EXPECT_EQ(*p, 7);

  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[1]);
  Result<UniqueFd> fr = UniqueFd(fds[0]);
  UniqueFd fd = std::move(fr).value();
  EXPECT_EQ(fd.get(), fds[0]);
  UniqueFd moved = std::move(fd);
  EXPECT_FALSE(fd.valid());
  EXPECT_TRUE(moved.valid());
}

}  // namespace
}  // namespace ckptfs
