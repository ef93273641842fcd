// Crash matrices: run a multi-step operation through a FaultEnv that "kills
// the process" after its K-th mutating call (every later call fails, as if
// nothing after that point happened), for every K, and in two ways:
//  - kill -9: the process dies, the backing file system keeps everything it
//    was given (page cache included);
//  - power loss: the machine dies too; only what fsync and directory fsync
//    made durable remains (FaultEnv::PowerOff).
// Then reopen with a healthy Env, recover, and check what SEMANTICS.md
// promises: a closed file reads back exactly after kill -9, an fsync'd one
// (and a sealed one, whose stub and pack the seal fsyncs) after power loss;
// nothing else is promised, but recovery must find every stub readable,
// leave no garbage, and every file must read back as one complete version
// that was written (never a mix, never a stub naming a missing object).
// The operations are the daemon's own code: the inode table, FileContent
// (Store::StageStub and SealStub) and the release of a replaced file's
// objects, through the Filesystem as the FUSE callbacks (fuse/ops.cc) call
// them; only the kernel's part (the create and rename syscalls, the payload
// copy) is done here.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "fuse/file_content.h"
#include "fuse/fs.h"
#include "store/store.h"
#include "store/store_internal.h"
#include "tests/unit/fault_env.h"
#include "tests/unit/test_util.h"

namespace ckptfs {
namespace {

using test::SmallChunks;
using test::TempDir;

enum class Cut { kKill, kPower };
const char* CutName(Cut c) { return c == Cut::kKill ? "kill -9" : "power loss"; }

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

// What a run of an op did: how many mutations it made, and whether the
// crash cut it short (refused a call; a crash right after its last mutation
// refuses nothing, and the run is whole).
struct RunOutcome {
  uint64_t mutations = 0;
  bool cut = false;
};

// Runs `op` on a store opened through a FaultEnv, crashing after mutation K
// (none for K == UINT64_MAX), then cuts as asked. `setup` prepares the store
// with a healthy Env; what it leaves counts as durable.
using Prepare = std::function<void(Store*)>;
using Op = std::function<void(Store*, FaultEnv*)>;
// With `mounted`, the store is recovered first, as a mount does (the pack
// index is then loaded, and the daemon's code runs as it does in the daemon).
RunOutcome RunCrashing(const std::string& dir, const Prepare& setup, const Op& op, uint64_t k, Cut cut = Cut::kKill,
                       bool mounted = false) {
  {
    auto s = OpenClean(dir);
    if (!s) return {};
    setup(s.get());
  }
  FaultEnv env;
  if (cut == Cut::kPower) EXPECT_OK(env.EnablePowerLoss(dir));
  RunOutcome out;
  {
    auto s = Store::Open(&env, dir, SmallChunks());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return {};
    if (mounted) {
      EXPECT_TRUE((*s)->Recover().ok());
    }
    env.ResetCounters();
    if (k != UINT64_MAX) env.CrashAfterMutations(k);
    op(s->get(), &env);
    out = {env.mutations(), env.injected() > 0};
  }
  if (cut == Cut::kPower) EXPECT_OK(env.PowerOff());
  return out;
}

// Calls run_at(k), which crashes a run after mutation k and checks it, for
// k = 0, 1, ...: every crash point of the clean run (`clean` mutations),
// and on until a run is not cut at all. The runs of one op need not make
// the same number of mutations: a new pack goes into packs/XX, XX from its
// random id, which costs a mkdir and an fsync of packs/ unless a pack is
// there already (the setup's, one time in 256). A bound taken from the
// clean run alone would leave a run that needs more cut every time, its
// last steps (the seal returning, say) never reached.
// run_at records its run's outcome in `run`; it may stop the test with a
// fatal failure.
void ForEachCrashPoint(uint64_t clean, const std::function<void(uint64_t k, RunOutcome& run)>& run_at) {
  // More than any run's count can differ by (two mutations per new pack).
  const uint64_t most = clean + 64;
  for (uint64_t k = 0;; ++k) {
    RunOutcome run;
    run_at(k, run);
    if (::testing::Test::HasFatalFailure()) return;
    if (!run.cut && k >= clean) return;
    if (k >= most) {
      ADD_FAILURE() << "a run is still cut after mutation " << k << "; the clean run made " << clean;
      return;
    }
  }
}

// A file's content after recovery; nullopt when it does not exist.
std::optional<std::vector<uint8_t>> ContentOrAbsent(Store* store, const std::string& name, const std::string& what) {
  auto c = test::ReadContentAt(store, name);
  if (!c.ok() && c.status().code() == ENOENT) return std::nullopt;
  EXPECT_TRUE(c.ok()) << what << ": " << c.status().ToString();
  if (!c.ok()) return std::vector<uint8_t>{0xde, 0xad};  // fails every comparison
  return *c;
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
    total = RunCrashing(dir.path(), setup, seal, UINT64_MAX).mutations;
  }
  ASSERT_GT(total, 8u);
  for (Cut cut : {Cut::kKill, Cut::kPower}) {
    ForEachCrashPoint(total, [&](uint64_t k, RunOutcome& run) {
      TempDir dir;
      run = RunCrashing(dir.path(), setup, seal, k, cut);
      const std::string what =
          std::string(CutName(cut)) + " after mutation " + std::to_string(k) + " of " + std::to_string(total);
      auto store = OpenClean(dir.path());
      ASSERT_NE(store, nullptr);
      RecoverAndCheckClean(store.get(), dir.path(), what);
      auto c = test::ReadContentAt(store.get(), "f");
      ASSERT_TRUE(c.ok()) << what << ": " << c.status().ToString();
      EXPECT_EQ(*c, content) << what;
      EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 1u) << what;
    });
    if (HasFatalFailure()) return;
  }
}

// ------------------------------------- writing a file, as the daemon does

void WithFilesystem(Store* s, const std::function<void(Filesystem*)>& fn);

// One file's life through FUSE: [create,] lookup, open for writing, change
// the content, [fsync,] close, seal. The Filesystem and FileContent do the
// work; the test plays the kernel (create syscall, copying the payload into
// the staging fd). Each step stops at the first error, as a dead daemon would.
struct WriteFile {
  std::string name = "f";
  bool create = false;
  bool fsync = false;
  // Changes the content of the open file; returns false on error.
  std::function<bool(FileContent*, Env*)> change;
  // Mutation counts when the steps that promises hang on returned success
  // (UINT64_MAX: they did not). A run's own record decides what it was
  // promised: counts differ between runs (a pack's fan-out directory may
  // need creating or not, by its random id).
  uint64_t changed = UINT64_MAX;  // the new content is in the backing files
  uint64_t synced = UINT64_MAX;   // fsync returned
  uint64_t sealed = UINT64_MAX;   // the seal returned

  void Run(Store* s, FaultEnv* env) {
    WithFilesystem(s, [&](Filesystem* fs) { Run(fs, env); });
  }
  void Run(Filesystem* fs, FaultEnv* env) {
    Env* e = fs->store()->env();
    InodeTable& inodes = fs->inodes();
    if (create) {  // OpCreate
      auto made = e->OpenAt(fs->store()->ns_fd(), name, O_CREAT | O_EXCL | O_WRONLY, 0644);
      if (!made.ok()) return;
    }
    struct stat st {};
    auto inode = inodes.Lookup(inodes.root(), name, &st);  // LOOKUP
    if (!inode.ok()) return;
    auto fc = fs->ContentOf(**inode);  // OpenHandle
    if (!fc.ok()) return;
    FileContent& f = **fc;
    if (create) f.MarkCreated();
    inodes.Opened(**inode);
    (void)f.OnOpen(true);  // nothing is pushed here: it never says to wait
    const bool ok = change(&f, e);
    if (ok) changed = env->mutations();
    if (ok && fsync && f.Sync().ok()) synced = env->mutations();
    const bool seal = f.OnRelease(true);  // OpRelease
    inodes.Released(**inode);
    if (!seal || !ok) return;
    if (f.SealIfIdle().ok() && !f.NeedsSeal()) sealed = env->mutations();  // the seal queue
  }
};

// Runs `fn` on a Filesystem over `s`, as a mount would serve it (no kernel
// attached: the test makes the requests).
void WithFilesystem(Store* s, const std::function<void(Filesystem*)>& fn) {
  {
    auto fs = Filesystem::Open(s, FsConfig{});
    if (!fs.ok()) return;
    fn(fs->get());
  }
  s->SetBaseCache(nullptr);  // the Filesystem's cache is gone
}

// OpRename of `from` over `to`, which the kernel looked up first, then the
// kernel's FORGET of the replaced inode: the daemon's own code frees its
// objects (Filesystem::ForgetLinkIfGone, InodeTable::Forget ->
// FileContent::MarkForgotten -> Store::ReleaseStubObjects). Returns whether
// the rename returned success.
bool RenameOver(Filesystem* fs, const std::string& from, const std::string& to) {
  InodeTable& inodes = fs->inodes();
  struct stat st {};
  auto victim = inodes.Lookup(inodes.root(), to, &st);
  if (!victim.ok()) return false;
  const int ns = fs->store()->ns_fd();
  if (!fs->store()->env()->RenameAt(ns, from, ns, to).ok()) return false;
  fs->ForgetLinkIfGone(*victim);
  inodes.Forget(**victim, 1);
  return true;
}

// A write of `bytes` at `off`, as OpWriteBuf does it (the payload copy is
// libfuse's; one pwrite here).
bool WriteAt(FileContent* f, Env* e, std::span<const uint8_t> bytes, uint64_t off) {
  auto fd = f->BeginWrite();
  if (!fd.ok()) return false;
  const bool ok = e->PWriteAll(fd->get(), bytes, off).ok();
  *fd = FdCache::Lease();  // the lease goes before EndWrite, as in OpWriteBuf
  f->EndWrite();
  return ok;
}

// A new file created, written whole and fsync'd: the temporary of a
// replace-by-rename. `content` must outlive the WriteFile.
WriteFile NewSyncedFile(const std::string& name, const std::vector<uint8_t>& content) {
  WriteFile wf;
  wf.name = name;
  wf.create = true;
  wf.fsync = true;
  wf.change = [&content](FileContent* f, Env* e) { return WriteAt(f, e, content, 0); };
  return wf;
}

// Runs `wf` at every crash point, in both ways of crashing, and checks the
// file: `before` and `after` are its content before and after the op
// (nullopt: absent); `between` lists other complete versions the op passes
// through (an O_TRUNC leaves an empty file for a moment, on ext4 too).
void CheckWriteMatrix(const Prepare& setup, WriteFile wf, const std::optional<std::vector<uint8_t>>& before,
                      const std::vector<uint8_t>& after, const std::vector<std::vector<uint8_t>>& between = {}) {
  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(
                dir.path(), setup, [&](Store* s, FaultEnv* env) { wf.Run(s, env); }, UINT64_MAX, Cut::kKill,
                /*mounted=*/true)
                .mutations;
  }
  ASSERT_NE(wf.changed, UINT64_MAX);
  ASSERT_NE(wf.sealed, UINT64_MAX);
  if (wf.fsync) {
    ASSERT_NE(wf.synced, UINT64_MAX);
  }
  const WriteFile clean = wf;
  auto step = [](uint64_t at) { return at == UINT64_MAX ? std::string("-") : std::to_string(at); };
  for (Cut cut : {Cut::kKill, Cut::kPower}) {
    int promised_runs = 0;
    ForEachCrashPoint(total, [&](uint64_t k, RunOutcome& outcome) {
      TempDir dir;
      WriteFile run = clean;
      run.changed = run.synced = run.sealed = UINT64_MAX;
      outcome = RunCrashing(
          dir.path(), setup, [&](Store* s, FaultEnv* env) { run.Run(s, env); }, k, cut, /*mounted=*/true);
      // kill -9 keeps what a closed file's daemon wrote; a power cut keeps
      // what fsync or the seal made durable, but the name of a new file
      // only once its directory was fsync'd (the file's first fsync does).
      const bool promised = cut == Cut::kKill
                                ? run.changed != UINT64_MAX
                                : (run.synced != UINT64_MAX || run.sealed != UINT64_MAX) && !(wf.create && !wf.fsync);
      const std::string what = std::string(CutName(cut)) + " after mutation " + std::to_string(k) + " of " +
                               std::to_string(total) + " (written at " + step(run.changed) + ", fsync'd at " +
                               step(run.synced) + ", sealed at " + step(run.sealed) + ")";
      auto store = OpenClean(dir.path());
      ASSERT_NE(store, nullptr);
      RecoverAndCheckClean(store.get(), dir.path(), what);
      std::optional<std::vector<uint8_t>> c = ContentOrAbsent(store.get(), wf.name, what);
      promised_runs += promised;
      if (promised) {
        EXPECT_EQ(c, std::optional(after)) << what;
      } else {
        const bool known = c == before || c == std::optional(after) ||
                           (c && std::find(between.begin(), between.end(), *c) != between.end());
        EXPECT_TRUE(known) << what << ": content is no version that was written ("
                           << (c ? std::to_string(c->size()) + " bytes" : "absent") << ")";
      }
      // The file's pack, and the old one when the new version is stored
      // against it (recovery leaves no orphan: fsck has no warnings).
      EXPECT_LE(test::CountFiles(dir.Sub("packs"), true), 2u) << what;
    });
    if (::testing::Test::HasFatalFailure()) return;
    if (cut == Cut::kKill || wf.fsync || !wf.create) {
      EXPECT_GT(promised_runs, 0) << CutName(cut);
    }
  }
}

class WriteCrashTest : public ::testing::TestWithParam<bool> {};  // param: fsync before close
INSTANTIATE_TEST_SUITE_P(CrashTest, WriteCrashTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Fsync" : "NoFsync"; });

// A sealed file rewritten whole in place (same size): stage, write, seal.
TEST_P(WriteCrashTest, RewriteSealedFile) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 1);
  const std::vector<uint8_t> new_content = test::MixedContent(4096, 2);
  ASSERT_EQ(old_content.size(), new_content.size());
  WriteFile wf;
  wf.fsync = GetParam();
  wf.change = [&](FileContent* f, Env* e) { return WriteAt(f, e, new_content, 0); };
  CheckWriteMatrix([&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "f", old_content).ok()); }, wf, old_content,
                   new_content);
}

// A few bytes changed in the middle: the rest is decoded into staging.
TEST_P(WriteCrashTest, PatchSealedFile) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 4);
  std::vector<uint8_t> new_content = old_content;
  const std::vector<uint8_t> patch = test::RandomBytes(100, 9);
  std::copy(patch.begin(), patch.end(), new_content.begin() + 5000);
  WriteFile wf;
  wf.fsync = GetParam();
  wf.change = [&](FileContent* f, Env* e) { return WriteAt(f, e, patch, 5000); };
  CheckWriteMatrix([&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "f", old_content).ok()); }, wf, old_content,
                   new_content);
}

// open(O_TRUNC) + write, as torch.save over last.ckpt does.
TEST_P(WriteCrashTest, TruncateAndRewriteSealedFile) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 5);
  const std::vector<uint8_t> new_content = test::RandomBytes(6000, 6);
  WriteFile wf;
  wf.fsync = GetParam();
  wf.change = [&](FileContent* f, Env* e) { return f->Truncate(0).ok() && WriteAt(f, e, new_content, 0); };
  CheckWriteMatrix([&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "f", old_content).ok()); }, wf, old_content,
                   new_content, {std::vector<uint8_t>{}});
}

// A new file: create, write. Until its directory is fsync'd (the first
// fsync does that) a power cut may take the name away.
TEST_P(WriteCrashTest, CreateNewFile) {
  const std::vector<uint8_t> content = test::MixedContent(4096, 3);
  WriteFile wf;
  wf.name = "new";
  wf.create = true;
  wf.fsync = GetParam();
  wf.change = [&](FileContent* f, Env* e) { return WriteAt(f, e, content, 0); };
  CheckWriteMatrix([](Store*) {}, wf, std::nullopt, content, {std::vector<uint8_t>{}});
}

// An empty file (sealed, no pack) written: its stub names a staging file
// that must be durable before the stub is.
TEST_P(WriteCrashTest, WriteEmptyFile) {
  const std::vector<uint8_t> content = test::RandomBytes(3000, 8);
  WriteFile wf;
  wf.fsync = GetParam();
  wf.change = [&](FileContent* f, Env* e) { return WriteAt(f, e, content, 0); };
  CheckWriteMatrix([&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "f", {}).ok()); }, wf, std::vector<uint8_t>{},
                   content);
}

// ------------------------------------------- replacing a file by rename

// tmp + rename over last.ckpt, the pattern of Lightning and of careful
// torch.save callers: the new file is created, written, fsync'd and sealed
// under a temporary name, renamed over the old one (OpRename), whose
// objects are then released (once the kernel forgets the old inode and no
// handle is open: InodeTable -> FileContent::MarkForgotten ->
// Store::ReleaseStubObjects), and the
// directory is fsync'd, or not (the parameter). The rename is the commit
// point; after a power cut it holds once the directory was fsync'd.
class RenameCrashTest : public ::testing::TestWithParam<bool> {};  // param: fsync the directory
INSTANTIATE_TEST_SUITE_P(CrashTest, RenameCrashTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "FsyncDir" : "NoFsyncDir"; });

TEST_P(RenameCrashTest, ReplaceByRename) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 11);
  const std::vector<uint8_t> new_content = test::MixedContent(4096, 12);
  const bool fsync_dir = GetParam();
  Prepare setup = [&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "last", old_content).ok()); };
  uint64_t tmp_synced = UINT64_MAX, renamed = UINT64_MAX, dir_synced = UINT64_MAX;
  Op op = [&](Store* s, FaultEnv* env) {
    WithFilesystem(s, [&](Filesystem* fs) {
      WriteFile tmp = NewSyncedFile("tmp", new_content);
      tmp.Run(fs, env);
      tmp_synced = tmp.synced;
      if (tmp.sealed == UINT64_MAX || !RenameOver(fs, "tmp", "last")) return;
      renamed = env->mutations();
      if (fsync_dir && s->env()->Fsync(s->ns_fd()).ok()) dir_synced = env->mutations();
    });
  };
  uint64_t total;
  {
    TempDir dir;
    total = RunCrashing(dir.path(), setup, op, UINT64_MAX, Cut::kKill, /*mounted=*/true).mutations;
  }
  ASSERT_NE(renamed, UINT64_MAX);
  if (fsync_dir) {
    ASSERT_NE(dir_synced, UINT64_MAX);
  }
  using Version = std::optional<std::vector<uint8_t>>;
  const Version old_v = old_content, new_v = new_content, empty_v = std::vector<uint8_t>{}, absent = std::nullopt;
  auto step = [](uint64_t at) { return at == UINT64_MAX ? std::string("-") : std::to_string(at); };
  for (Cut cut : {Cut::kKill, Cut::kPower}) {
    ForEachCrashPoint(total, [&](uint64_t k, RunOutcome& run) {
      TempDir dir;
      // This run's own record of what returned success (see WriteFile).
      tmp_synced = renamed = dir_synced = UINT64_MAX;
      run = RunCrashing(dir.path(), setup, op, k, cut, /*mounted=*/true);
      const bool promised = (cut == Cut::kKill ? renamed : dir_synced) != UINT64_MAX;
      const std::string what = std::string(CutName(cut)) + " after mutation " + std::to_string(k) + " of " +
                               std::to_string(total) + " (tmp fsync'd at " + step(tmp_synced) + ", renamed at " +
                               step(renamed) + ", directory fsync'd at " + step(dir_synced) + ")";
      auto store = OpenClean(dir.path());
      ASSERT_NE(store, nullptr);
      RecoverAndCheckClean(store.get(), dir.path(), what);
      const Version last = ContentOrAbsent(store.get(), "last", what);
      const Version tmp = ContentOrAbsent(store.get(), "tmp", what);
      if (promised) {
        EXPECT_EQ(last, new_v) << what;
        EXPECT_EQ(tmp, absent) << what;
      } else {
        EXPECT_TRUE(last == old_v || last == new_v) << what << ": last.ckpt is no version that was written";
        EXPECT_TRUE(tmp == absent || tmp == empty_v || tmp == new_v) << what << ": tmp is no version that was written";
        // Once fsync'd, the new version never vanishes: it is under one name or the other.
        if (tmp_synced != UINT64_MAX) {
          EXPECT_TRUE(last == new_v || tmp == new_v) << what << ": the new version is lost";
        }
      }
      EXPECT_LE(test::CountFiles(dir.Sub("packs"), true), 2u) << what;
    });
    if (HasFatalFailure()) return;
  }
}

// A pack is deleted only once the rename that dropped its last name is
// durable (Store::SyncBeforeDeleting). Without that, a later publish that
// fsyncs the same packs/XX/ directory makes the deletion durable first, and a
// power cut brings back the old stub naming a pack that is gone: the file
// reads EIO and recovery, finding it, deletes nothing ever after.
TEST(CrashTest, PowerLossNeverBringsBackAStubWhosePackWasDeleted) {
  const std::vector<uint8_t> old_content = test::MixedContent(4096, 21);
  const std::vector<uint8_t> new_content = test::MixedContent(4096, 22);
  Prepare setup = [&](Store* s) { ASSERT_TRUE(test::MakeSealedFile(s, "last", old_content).ok()); };
  bool released = false;
  Op op = [&](Store* s, FaultEnv* env) {
    Env* e = s->env();
    auto old_stub = e->OpenAt(s->ns_fd(), "last", O_RDONLY);
    ASSERT_TRUE(old_stub.ok());
    auto rec = ReadStub(e, old_stub->get());
    ASSERT_TRUE(rec.ok());
    old_stub->reset();
    WithFilesystem(s, [&](Filesystem* fs) {
      WriteFile tmp = NewSyncedFile("tmp", new_content);
      tmp.Run(fs, env);
      ASSERT_NE(tmp.sealed, UINT64_MAX);
      ASSERT_TRUE(RenameOver(fs, "tmp", "last"));  // the directory is not fsync'd
    });
    released = s->PackFileSize(rec->object).status().code() == ENOENT;
    // What a later publish into the same fan-out directory does.
    auto pack_dir = e->OpenAt(s->ns_fd(), "../packs/" + internal::PackDirName(rec->object), O_RDONLY | O_DIRECTORY);
    ASSERT_TRUE(pack_dir.ok());
    ASSERT_OK(e->Fsync(pack_dir->get()));
  };
  TempDir dir;
  RunCrashing(dir.path(), setup, op, UINT64_MAX, Cut::kPower, /*mounted=*/true);
  ASSERT_TRUE(released);
  auto store = OpenClean(dir.path());
  ASSERT_NE(store, nullptr);
  RecoverAndCheckClean(store.get(), dir.path(), "power cut after the old pack was deleted");
  EXPECT_EQ(ContentOrAbsent(store.get(), "last", "last"), std::optional(new_content));
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
    total = RunCrashing(dir.path(), setup, recover, UINT64_MAX).mutations;
  }
  for (Cut cut : {Cut::kKill, Cut::kPower}) {
    ForEachCrashPoint(total, [&](uint64_t k, RunOutcome& run) {
      TempDir dir;
      run = RunCrashing(dir.path(), setup, recover, k, cut);
      const std::string what = "recovery cut by " + std::string(CutName(cut)) + " after mutation " + std::to_string(k);
      auto store = OpenClean(dir.path());
      ASSERT_NE(store, nullptr);
      RecoverAndCheckClean(store.get(), dir.path(), what);
      EXPECT_EQ(*test::ReadContentAt(store.get(), "a"), a) << what;
      EXPECT_EQ(*test::ReadContentAt(store.get(), "b"), b) << what;
      EXPECT_EQ(test::CountFiles(dir.Sub("packs"), true), 2u) << what;
    });
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
  for (Cut cut : {Cut::kKill, Cut::kPower}) {
    for (uint64_t k = 0; k <= total; ++k) {
      TempDir dir;
      {
        FaultEnv env;
        if (cut == Cut::kPower) ASSERT_OK(env.EnablePowerLoss(dir.path()));
        env.CrashAfterMutations(k);
        (void)Store::Open(&env, dir.path(), SmallChunks());
        if (cut == Cut::kPower) ASSERT_OK(env.PowerOff());
      }
      const std::string what = "init cut by " + std::string(CutName(cut)) + " after mutation " + std::to_string(k);
      auto store = OpenClean(dir.path());
      ASSERT_NE(store, nullptr) << what;
      RecoverAndCheckClean(store.get(), dir.path(), what);
      if (HasFatalFailure()) return;
    }
  }
}

}  // namespace
}  // namespace ckptfs
