// Fsck: read-only check of a store. Safe to run on a store that is not
// mounted; on a live store, a concurrent seal can show up as a transient
// warning (tmp file) or error (pack switched mid-check).
#include <fcntl.h>

#include <unordered_map>
#include <unordered_set>

#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// What is wrong with a pack OpenPack refused (it says when it is missing).
std::string CannotOpen(const Status& s) {
  return s.message().ends_with(" is missing") ? std::string("is missing")
                                              : "cannot be read (header or chunk table): " + s.message();
}

// One fsck run: the report, and what its checks learn about references on
// the way (which packs files and bases need, which staging files stubs name).
class FsckRun {
 public:
  FsckRun(Store* store, int staging_fd, int tmp_fd, std::function<void(uint64_t)> progress)
      : store_(store), env_(store->env()), staging_fd_(staging_fd), tmp_fd_(tmp_fd), progress_(std::move(progress)) {}

  void CheckSuperblock(int root_fd, const std::string& store_path);
  void CheckFiles(int ns_fd);
  void CheckBasePacks();
  void FindOrphanPacks();
  void ReportOrphans();
  void CheckStagingDir();
  void CheckTmpDir();
  FsckReport TakeReport() { return std::move(rep_); }

 private:
  void CheckStub(const std::string& path, int fd, const Status& open_status);
  void CheckStaged(const std::string& where, const StubRecord& rec);
  void CheckFilePack(const std::string& where, const std::string& path, const StubRecord& rec);
  void CheckUnneededPack(const std::string& where, ObjectId id);
  void NoteUnlisted(const PackUnlisted& u);
  std::string PackPath(ObjectId id) const { return store_->pack_objects().Where(id); }
  // What happens to orphans, said once every object has been read.
  std::string OrphanFate() const;

  Store* store_;
  Env* env_;
  int staging_fd_, tmp_fd_;
  std::function<void(uint64_t)> progress_;
  FsckReport rep_;
  std::unordered_map<ObjectId, std::string> pack_owner_;
  std::unordered_set<ObjectId> staging_ref_;
  std::vector<std::pair<ObjectId, std::string>> base_todo_;  // bases of files' packs, and who needs them
  std::unordered_set<ObjectId> needed_;                      // packs kept as bases
  std::vector<std::string> orphans_;                         // where each orphan pack is
  // Objects whose references are unknown: while there are any, recovery and
  // gc delete nothing, so no orphan may be promised to go.
  size_t unknown_refs_ = 0;
};

void FsckRun::CheckSuperblock(int root_fd, const std::string& store_path) {
  if (Result<internal::Superblock> sb = internal::ReadSuperblock(env_, root_fd, store_path); !sb.ok()) {
    rep_.errors.push_back("CKPTFS: " + sb.status().message());
  }
}

void FsckRun::CheckFiles(int ns_fd) {
  std::unordered_set<ino_t> seen;
  auto visit = [this](const std::string& path, int fd, const Status& open_status) {
    CheckStub(path, fd, open_status);
    return Status::Ok();
  };
  if (Status s = internal::WalkTree(env_, ns_fd, "", visit, &seen); !s.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back("ns/: walk stopped early: " + s.message());
  }
}

void FsckRun::CheckStub(const std::string& path, int fd, const Status& open_status) {
  const std::string where = "ns/" + path;
  if (path.ends_with('/')) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": directory cannot be read (its stubs are unknown): " + open_status.message());
    return;
  }
  ++rep_.files_checked;
  if (!open_status.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": cannot open stub: " + open_status.message());
    return;
  }
  Result<StubSlots> slots = ReadStubSlots(env_, fd);
  if (!slots.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": unreadable stub: " + slots.status().message());
    return;
  }
  if (!slots->damaged.empty()) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": stub has a damaged slot (" + slots->damaged +
                          "); the file shows the other slot's record, which may be older");
  }
  const StubRecord& rec = slots->current;
  if (rec.state == StubState::kStaged) {
    CheckStaged(where, rec);
  } else if (rec.object != 0) {  // 0: an empty file
    CheckFilePack(where, path, rec);
  }
}

void FsckRun::CheckStaged(const std::string& where, const StubRecord& rec) {
  staging_ref_.insert(rec.object);
  const std::string staging = "staging/" + internal::StagingFileName(rec.object);
  if (Result<struct stat> st = env_->FstatAt(staging_fd_, internal::StagingFileName(rec.object), 0); !st.ok()) {
    rep_.errors.push_back(where + ": staged, but " + staging + " is missing: " + st.status().message());
  } else {
    rep_.warnings.push_back(where + ": not sealed yet (content in " + staging + ")");
  }
}

// Reads every chunk of a sealed file's pack, and notes the bases it needs.
void FsckRun::CheckFilePack(const std::string& where, const std::string& path, const StubRecord& rec) {
  auto [it, inserted] = pack_owner_.emplace(rec.object, path);
  if (!inserted) {
    rep_.errors.push_back(where + ": pack " + ObjectIdHex(rec.object) + " is also referenced by ns/" + it->second);
    return;
  }
  Result<std::shared_ptr<PackReader>> pack = store_->OpenPack(rec.object);
  if (!pack.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": its pack " + PackPath(rec.object) + " " + CannotOpen(pack.status()));
    return;
  }
  ++rep_.packs_checked;
  if (!(*pack)->meta_status().ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where + ": meta block of its pack " + PackPath(rec.object) +
                          " cannot be read (the bases it needs are unknown): " + (*pack)->meta_status().message());
  }
  for (ObjectId b : (*pack)->meta().bases) base_todo_.emplace_back(b, PackPath(rec.object));
  if (Status s = (*pack)->VerifyAll(store_); !s.ok()) {
    rep_.errors.push_back(where + ": " + s.message());
    return;
  }
  rep_.chunks_checked += (*pack)->chunks().size();
  rep_.bytes_checked += (*pack)->header().logical_size;
  if (progress_) progress_(rep_.bytes_checked);
  if ((*pack)->header().logical_size != rec.size) {
    rep_.errors.push_back(where + ": stub says " + std::to_string(rec.size) + " bytes but pack " +
                          ObjectIdHex(rec.object) + " holds " + std::to_string((*pack)->header().logical_size));
  }
}

// Packs kept only as bases of others (their own file was deleted).
void FsckRun::CheckBasePacks() {
  while (!base_todo_.empty()) {
    const auto [id, needer] = base_todo_.back();
    base_todo_.pop_back();
    if (!needed_.insert(id).second || pack_owner_.count(id)) continue;
    Result<std::shared_ptr<PackReader>> pack = store_->OpenPack(id);
    if (!pack.ok()) {
      ++unknown_refs_;
      rep_.errors.push_back(PackPath(id) + ": base pack needed by " + needer + " " + CannotOpen(pack.status()));
      continue;
    }
    if (!(*pack)->meta_status().ok()) {
      ++unknown_refs_;
      rep_.errors.push_back(PackPath(id) + ": meta block of this base pack (needed by " + needer +
                            ") cannot be read (the bases it needs are unknown): " + (*pack)->meta_status().message());
    }
    for (ObjectId b : (*pack)->meta().bases) base_todo_.emplace_back(b, PackPath(id));
  }
}

// Packs no readable stub or pack needs.
void FsckRun::FindOrphanPacks() {
  Result<PackListing> listing = store_->pack_objects().List(ListDetail::kNames);
  if (!listing.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(store_->pack_objects().Describe() + ": " + listing.status().message());
    return;
  }
  for (const PackUnlisted& u : listing->unlisted) NoteUnlisted(u);
  for (const std::string& where : listing->unexpected) rep_.warnings.push_back(where + ": unexpected file");
  for (const PackObjectEntry& e : listing->packs) {
    if (e.misplaced) {
      rep_.warnings.push_back(e.where + ": unexpected file");
    } else if (!e.complete) {
      rep_.warnings.push_back(e.where + ": left by an interrupted seal, or a seal still writing it (gc removes it)");
    } else if (!pack_owner_.count(e.id) && !needed_.count(e.id)) {
      CheckUnneededPack(e.where, e.id);
    }
  }
}

void FsckRun::NoteUnlisted(const PackUnlisted& u) {
  ++unknown_refs_;
  rep_.errors.push_back(u.where + (u.directory ? ": directory cannot be read (its packs are unknown): "
                                               : ": cannot tell whether it is a published pack: ") +
                        u.status.message());
}

// Each pack nothing needs is opened: one that cannot be read may be what a
// file needs, and hides what it needs itself.
void FsckRun::CheckUnneededPack(const std::string& where, ObjectId id) {
  Result<std::shared_ptr<PackReader>> pack = store_->OpenPack(id);
  if (!pack.ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where +
                          ": pack no file names cannot be read (header or chunk table), so what it "
                          "needs is unknown: " +
                          pack.status().message());
  } else if (!(*pack)->meta_status().ok()) {
    ++unknown_refs_;
    rep_.errors.push_back(where +
                          ": meta block of a pack no file names cannot be read, so what it needs is "
                          "unknown: " +
                          (*pack)->meta_status().message());
  } else {
    orphans_.push_back(where);
  }
}

// Orphans are not corruption. Recovery removes them only when it could
// read every stub and pack; otherwise they may be what an unreadable
// object needs, and stay.
std::string FsckRun::OrphanFate() const {
  return unknown_refs_ == 0 ? "the next mount or `ckptfs gc` removes it"
                            : "kept: recovery and gc delete nothing while the objects reported above cannot be read";
}

void FsckRun::ReportOrphans() {
  const std::string fate = OrphanFate();
  for (const std::string& o : orphans_) rep_.warnings.push_back(o + ": orphan pack (no file needs it; " + fate + ")");
}

void FsckRun::CheckStagingDir() {
  Result<std::vector<DirEntry>> files = env_->ListDir(staging_fd_);
  if (!files.ok()) {
    rep_.errors.push_back("staging/: " + files.status().message());
    return;
  }
  const std::string fate = OrphanFate();
  for (const DirEntry& f : *files) {
    std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
    if (!id) {
      rep_.warnings.push_back("staging/" + f.name + ": unexpected file");
    } else if (!staging_ref_.count(*id)) {
      rep_.warnings.push_back("staging/" + f.name + ": orphan staging file (no stub names it; " + fate + ")");
    }
  }
}

void FsckRun::CheckTmpDir() {
  Result<std::vector<DirEntry>> files = env_->ListDir(tmp_fd_);
  if (!files.ok()) {
    rep_.errors.push_back("tmp/: " + files.status().message());
    return;
  }
  for (const DirEntry& f : *files) {
    rep_.warnings.push_back("tmp/" + f.name + ": left by an interrupted seal (recovery removes it)");
  }
}

}  // namespace

Result<FsckReport> Store::Fsck(const std::function<void(uint64_t)>& progress) {
  FsckRun run(this, staging_.get(), tmp_.get(), progress);
  run.CheckSuperblock(root_.get(), path_);
  run.CheckFiles(ns_.get());
  run.CheckBasePacks();
  run.FindOrphanPacks();
  run.ReportOrphans();
  run.CheckStagingDir();
  run.CheckTmpDir();
  return run.TakeReport();
}

}  // namespace ckptfs
