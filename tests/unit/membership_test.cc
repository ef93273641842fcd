#include "store/cluster/membership.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>

#include "base/env.h"
#include "store/stub.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::TempDir;

constexpr uint64_t kSecond = 1000000000ull;

UniqueFd OpenRoot(const TempDir& dir) {
  return UniqueFd(::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
}

TEST(StubClusterFieldsTest, NodeAndClosedRoundTrip) {
  const StubRecord rec{.gen = 3, .state = StubState::kStaged, .size = 77, .object = 9, .node = NodeId("n1"),
                       .closed = true};
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot(rec, slot);
  auto back = DecodeStubSlot(slot);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, rec);
}

TEST(MembershipTest, NodeIdsAreNeverZeroAndDifferByName) {
  EXPECT_NE(NodeId(""), 0u);
  EXPECT_NE(NodeId("n1"), NodeId("n2"));
  EXPECT_EQ(NodeId("n1"), NodeId("n1"));
}

TEST(MembershipTest, ALeaseRunsOutAndADeadPidOnThisHostIsDeadAtOnce) {
  MemberRecord rec{.node = "n", .host = "elsewhere", .pid = 1, .renewed_ns = 100 * kSecond, .lease_seconds = 30};
  EXPECT_TRUE(MemberIsAlive(rec, 129 * kSecond, ThisHostName()));
  EXPECT_FALSE(MemberIsAlive(rec, 130 * kSecond, ThisHostName()));
  rec.host = ThisHostName();
  rec.pid = 0x7ffffff0;  // no such process
  EXPECT_FALSE(MemberIsAlive(rec, 101 * kSecond, ThisHostName()));
  EXPECT_FALSE(MemberIsAlive(MemberRecord{.node = "never-written"}, 1, ThisHostName()));
}

TEST(MembershipTest, JoinWritesARecordOthersReadAndRefusesALiveNodeName) {
  TempDir dir;
  UniqueFd root = OpenRoot(dir);
  Env* env = Env::Default();
  auto a = Membership::Join(env, root.get(), MemberRecord{.node = "a", .staging = "/local/a", .lease_seconds = 30});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto members = ReadMembers(env, root.get());
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ(members->front().node, "a");
  EXPECT_EQ(members->front().staging, "/local/a");
  EXPECT_EQ(members->front().pid, ::getpid());
  EXPECT_TRUE(MemberIsAlive(members->front(), env->WallTimeNs(), ThisHostName()));

  // Another process's live record of the same name: refused, naming it.
  MemberRecord other = members->front();
  other.pid = ::getppid();
  {
    const std::string text = "{\"host\":\"" + ThisHostName() + "\",\"pid\":" + std::to_string(other.pid) +
                             ",\"renewed_ns\":" + std::to_string(env->WallTimeNs()) + ",\"lease_seconds\":30}";
    UniqueFd f(::open(dir.Sub("nodes/b/member").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    if (!f.valid()) {
      ASSERT_EQ(::mkdir(dir.Sub("nodes/b").c_str(), 0700), 0);
      f = UniqueFd(::open(dir.Sub("nodes/b/member").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600));
    }
    ASSERT_EQ(::write(f.get(), text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  auto b = Membership::Join(env, root.get(), MemberRecord{.node = "b", .lease_seconds = 30});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), EBUSY);
  EXPECT_NE(b.status().message().find("-o node="), std::string::npos) << b.status().message();

  // A clean leave removes the record.
  a->reset();
  EXPECT_NE(::access(dir.Sub("nodes/a/member").c_str(), F_OK), 0);
}

}  // namespace
}  // namespace ckptfs
