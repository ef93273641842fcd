// Crash matrices: run a multi-step operation through a FaultEnv that "kills
// the process" after its K-th mutating call (every later call fails, as if
// nothing after that point happened), for every K. Then reopen with a
// healthy Env, recover, and check that the file holds exactly what had been
// acknowledged, that no garbage is left, and that fsck is clean.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <functional>

#include "store/fault_env.h"
#include "store/store.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::SmallChunks;
using test::TempDir;

std::unique_ptr<Store> OpenClean(const std::string& path) {
  auto s = Store::Open(Env::Default(), path, SmallChunks());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

// Recovery must leave every file sealed and nothing unreferenced.
void RecoverAndCheckClean(Store* store, const std::string& dir, const std::string& what) {
  auto rep = store->Recover();
  ASSERT_TRUE(rep.ok()) << what << ": " << rep.status().ToString();
  EXPECT_EQ(rep->broken_stubs, 0u) << what;
  auto fsck = store->Fsck();
  ASSERT_TRUE(fsck.ok()) << what;
  EXPECT_TRUE(fsck->clean()) << what << ": " << (fsck->errors.empty() ? "" : fsck->errors[0]);
  EXPECT_TRUE(fsck->warnings.empty()) << what << ": " << (fsck->warnings.empty() ? "" : fsck->warnings[0]);
  EXPECT_EQ(test::CountFiles(dir + "/tmp"), 0u) << what;
  EXPECT_EQ(test::CountFiles(dir + "/staging"), 0u) << what;
}

// Runs `op` on a store opened through a FaultEnv, crashing after mutation K.
// `setup` prepares the store with a healthy Env. Returns the number of
// mutations a clean run makes (K == UINT64_MAX).
using Prepare = std::function<void(Store*)>;
using Op = std::function<void(Store*, FaultEnv*)>;
uint64_t RunCrashing(const std::string& dir, const Prepare& setup, const Op& op, uint64_t k) {
  {
    auto s = OpenClean(dir);
    if (!s) return 0;
    setup(s.get());
  }
  FaultEnv env;
  auto s = Store::Open(&env, dir, SmallChunks());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (!s.ok()) return 0;
  env.ResetCounters();
  if (k != UINT64_MAX) env.CrashAfterMutations(k);
  op(s->get(), &env);
  return env.mutations();
}

// --------------------------------------------------------- SealStub

TEST(CrashTest, SealStubAtEveryStep) {
  const std::vector<uint8_t> content = test::MixedContent(4096, 7);
  Prepare setup = [&](Store* s) { ASSERT_TRUE(test::MakeStagedFile(s, "f", content).ok()); };
  Op seal = [&](Store* s, FaultEnv*) {
    auto stub = s->env()->OpenAt(s->ns_fd(), "f", O_RDWR);
    if (!stub.ok()) return;
    auto rec = ReadStub(s->env(), stub->get());
    if (!rec.ok()) return;
    auto staging = s->OpenStaging(rec->object);
    if (!staging.ok()) return;
    (void)s->SealStub(stub->get(), *rec, staging->get());
  };

  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(dir.path(), setup, seal, UINT64_MAX);
  }
  ASSERT_GT(total, 8u);
  for (uint64_t k = 0; k <= total; ++k) {
    TempDir dir;
    RunCrashing(dir.path(), setup, seal, k);
    const std::string what = "crash after mutation " + std::to_string(k) + " of " + std::to_string(total);
    auto store = OpenClean(dir.path());
    ASSERT_NE(store, nullptr);
    RecoverAndCheckClean(store.get(), dir.path(), what);
    auto c = test::ReadContentAt(store.get(), "f");
    ASSERT_TRUE(c.ok()) << what << ": " << c.status().ToString();
    EXPECT_EQ(*c, content) << what;
    EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 1u) << what;
    if (HasFatalFailure()) return;
  }
}

// --------------------------------------------- rewriting a file's content

// What the FUSE layer does when a sealed file is rewritten: stage the new
// bytes durably, switch the stub to STAGED, release the old pack. The
// switch is the commit point.
struct Rewrite {
  uint64_t stub_write_mutation = 0;  // 1-based index of the stub's pwrite
  void Run(Store* s, FaultEnv* env, const std::string& name, const std::vector<uint8_t>& bytes, bool create) {
    Env* e = s->env();
    auto stub = e->OpenAt(s->ns_fd(), name, create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0644);
    if (!stub.ok()) return;
    if (create && !e->Fsync(s->ns_fd()).ok()) return;
    auto cur = ReadStub(e, stub->get());
    if (!cur.ok()) return;
    ObjectId id = 0;
    auto staging = s->CreateStaging(&id);
    if (!staging.ok()) return;
    if (!e->PWriteAll(staging->get(), bytes, 0).ok()) return;
    if (!e->Fdatasync(staging->get()).ok()) return;
    if (!s->SyncStagingDir().ok()) return;
    stub_write_mutation = env->mutations() + 1;
    auto staged = WriteStub(e, stub->get(), *cur, {.state = StubState::kStaged, .size = bytes.size(), .object = id});
    if (!staged.ok()) return;
    if (!e->Fsync(stub->get()).ok()) return;
    (void)s->ReleaseStubObjects(*cur);
  }
};

TEST(CrashTest, RewriteFileAtEveryStep) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 1);
  const std::vector<uint8_t> new_content = test::MixedContent(4096, 2);
  Prepare setup = [&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "f", old_content).ok()); };
  Rewrite rw;
  Op op = [&](Store* s, FaultEnv* env) { rw.Run(s, env, "f", new_content, false); };

  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(dir.path(), setup, op, UINT64_MAX);
  }
  const uint64_t commit = rw.stub_write_mutation;
  ASSERT_GT(commit, 1u);
  ASSERT_LT(commit, total);
  for (uint64_t k = 0; k <= total; ++k) {
    TempDir dir;
    RunCrashing(dir.path(), setup, op, k);
    const std::string what = "crash after mutation " + std::to_string(k) + " of " + std::to_string(total) +
                             " (stub write is " + std::to_string(commit) + ")";
    auto store = OpenClean(dir.path());
    ASSERT_NE(store, nullptr);
    RecoverAndCheckClean(store.get(), dir.path(), what);
    auto c = test::ReadContentAt(store.get(), "f");
    ASSERT_TRUE(c.ok()) << what << ": " << c.status().ToString();
    EXPECT_EQ(*c, k >= commit ? new_content : old_content) << what;
    EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 1u) << what;
    if (HasFatalFailure()) return;
  }
}

TEST(CrashTest, CreateNewFileAtEveryStep) {
  const std::vector<uint8_t> content = test::MixedContent(4096, 3);
  Prepare setup = [](Store*) {};
  Rewrite rw;
  Op op = [&](Store* s, FaultEnv* env) { rw.Run(s, env, "new", content, true); };

  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(dir.path(), setup, op, UINT64_MAX);
  }
  const uint64_t commit = rw.stub_write_mutation;
  for (uint64_t k = 0; k <= total; ++k) {
    TempDir dir;
    RunCrashing(dir.path(), setup, op, k);
    const std::string what = "crash after mutation " + std::to_string(k) + " of " + std::to_string(total);
    auto store = OpenClean(dir.path());
    ASSERT_NE(store, nullptr);
    RecoverAndCheckClean(store.get(), dir.path(), what);
    auto c = test::ReadContentAt(store.get(), "new");
    if (k == 0) {  // the stub was never created
      EXPECT_EQ(c.status().code(), ENOENT) << what;
      continue;
    }
    ASSERT_TRUE(c.ok()) << what << ": " << c.status().ToString();
    // Before the commit point the file exists but is empty (what O_CREAT made).
    EXPECT_EQ(*c, k >= commit ? content : std::vector<uint8_t>{}) << what;
    EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), k >= commit ? 1u : 0u) << what;
    if (HasFatalFailure()) return;
  }
}

// ------------------------------------------------- recovery and init

TEST(CrashTest, RecoveryItselfAtEveryStep) {
  const std::vector<uint8_t> a = test::MixedContent(4096, 4), b = test::RandomBytes(5000, 5);
  Prepare setup = [&](Store* s) {
    ASSERT_TRUE(test::MakeStagedFile(s, "a", a).ok());
    ASSERT_TRUE(test::MakeSealedFile(s, "b", b).ok());
    ObjectId id;
    ASSERT_TRUE(s->CreateStaging(&id).ok());  // orphan
    // An interrupted publish.
    auto fd = s->env()->OpenAt(s->ns_fd(), "../tmp/00000000000000aa.pack.tmp", O_CREAT | O_RDWR, 0644);
    ASSERT_TRUE(fd.ok());
  };
  Op recover = [](Store* s, FaultEnv*) { (void)s->Recover(); };
  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(dir.path(), setup, recover, UINT64_MAX);
  }
  for (uint64_t k = 0; k <= total; ++k) {
    TempDir dir;
    RunCrashing(dir.path(), setup, recover, k);
    const std::string what = "recovery crashed after mutation " + std::to_string(k);
    auto store = OpenClean(dir.path());
    ASSERT_NE(store, nullptr);
    RecoverAndCheckClean(store.get(), dir.path(), what);
    EXPECT_EQ(*test::ReadContentAt(store.get(), "a"), a) << what;
    EXPECT_EQ(*test::ReadContentAt(store.get(), "b"), b) << what;
    EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 2u) << what;
    if (HasFatalFailure()) return;
  }
}

TEST(CrashTest, InitialisationAtEveryStep) {
  uint64_t total;
  {
    TempDir dir;
    FaultEnv env;
    ASSERT_TRUE(Store::Open(&env, dir.path(), SmallChunks()).ok());
    total = env.mutations();
  }
  ASSERT_GT(total, 5u);
  for (uint64_t k = 0; k <= total; ++k) {
    TempDir dir;
    {
      FaultEnv env;
      env.CrashAfterMutations(k);
      (void)Store::Open(&env, dir.path(), SmallChunks());
    }
    const std::string what = "init crashed after mutation " + std::to_string(k);
    auto store = OpenClean(dir.path());
    ASSERT_NE(store, nullptr) << what;
    RecoverAndCheckClean(store.get(), dir.path(), what);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace ckptfs
