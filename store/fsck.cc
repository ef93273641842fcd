// Fsck: read-only check of a store. Safe to run on a store that is not
// mounted; on a live store, a concurrent seal can show up as a transient
// warning (tmp file) or error (pack switched mid-check).
#include <fcntl.h>

#include <map>
#include <unordered_map>
#include <unordered_set>

#include "base/log.h"
#include "store/store.h"
#include "store/store_internal.h"

namespace ckptfs {

Result<FsckReport> Store::Fsck() {
  FsckReport rep;
  if (Result<internal::Superblock> sb = internal::ReadSuperblock(env_, root_.get(), path_); !sb.ok()) {
    rep.errors.push_back("CKPTFS: " + sb.status().message());
  }

  std::unordered_map<ObjectId, std::string> pack_owner;
  std::unordered_set<ObjectId> staging_ref;
  std::vector<std::pair<ObjectId, std::string>> base_todo;  // bases of files' packs, and who needs them
  // Objects whose references are unknown: while there are any, recovery and
  // gc delete nothing, so no orphan may be promised to go.
  size_t unknown_refs = 0;
  auto pack_path = [](ObjectId id) {
    return "packs/" + internal::PackDirName(id) + "/" + internal::PackFileName(id);
  };
  // What is wrong with a pack OpenPack refused (it says when it is missing).
  auto cannot_open = [](const Status& s) {
    return s.message().ends_with(" is missing") ? std::string("is missing")
                                                : "cannot be read (header or chunk table): " + s.message();
  };
  auto visit = [&](const std::string& path, int fd, const Status& open_status) -> Status {
    const std::string where = "ns/" + path;
    if (path.ends_with('/')) {
      ++unknown_refs;
      rep.errors.push_back(where + ": directory cannot be read (its stubs are unknown): " + open_status.message());
      return Status::Ok();
    }
    ++rep.files_checked;
    if (!open_status.ok()) {
      ++unknown_refs;
      rep.errors.push_back(where + ": cannot open stub: " + open_status.message());
      return Status::Ok();
    }
    Result<StubSlots> slots = ReadStubSlots(env_, fd);
    if (!slots.ok()) {
      ++unknown_refs;
      rep.errors.push_back(where + ": unreadable stub: " + slots.status().message());
      return Status::Ok();
    }
    if (!slots->damaged.empty()) {
      ++unknown_refs;
      rep.errors.push_back(where + ": stub has a damaged slot (" + slots->damaged +
                           "); the file shows the other slot's record, which may be older");
    }
    const StubRecord* rec = &slots->current;
    if (rec->state == StubState::kStaged) {
      staging_ref.insert(rec->object);
      const std::string staging = "staging/" + internal::StagingFileName(rec->object);
      if (Result<struct stat> st = env_->FstatAt(staging_.get(), internal::StagingFileName(rec->object), 0); !st.ok()) {
        rep.errors.push_back(where + ": staged, but " + staging + " is missing: " + st.status().message());
      } else {
        rep.warnings.push_back(where + ": not sealed yet (content in " + staging + ")");
      }
      return Status::Ok();
    }
    if (rec->object == 0) return Status::Ok();  // empty file
    auto [it, inserted] = pack_owner.emplace(rec->object, path);
    if (!inserted) {
      rep.errors.push_back(where + ": pack " + ObjectIdHex(rec->object) + " is also referenced by ns/" + it->second);
      return Status::Ok();
    }
    Result<std::shared_ptr<PackReader>> pack = OpenPack(rec->object);
    if (!pack.ok()) {
      ++unknown_refs;
      rep.errors.push_back(where + ": its pack " + pack_path(rec->object) + " " + cannot_open(pack.status()));
      return Status::Ok();
    }
    ++rep.packs_checked;
    if (!(*pack)->meta_status().ok()) {
      ++unknown_refs;
      rep.errors.push_back(where + ": meta block of its pack " + pack_path(rec->object) +
                           " cannot be read (the bases it needs are unknown): " + (*pack)->meta_status().message());
    }
    for (ObjectId b : (*pack)->meta().bases) base_todo.emplace_back(b, pack_path(rec->object));
    if (Status s = (*pack)->VerifyAll(this); !s.ok()) {
      rep.errors.push_back(where + ": " + s.message());
      return Status::Ok();
    }
    rep.chunks_checked += (*pack)->chunks().size();
    rep.bytes_checked += (*pack)->header().logical_size;
    if ((*pack)->header().logical_size != rec->size) {
      rep.errors.push_back(where + ": stub says " + std::to_string(rec->size) + " bytes but pack " +
                           ObjectIdHex(rec->object) + " holds " + std::to_string((*pack)->header().logical_size));
    }
    return Status::Ok();
  };
  std::unordered_set<ino_t> seen;
  if (Status s = internal::WalkTree(env_, ns_.get(), "", visit, &seen); !s.ok()) {
    ++unknown_refs;
    rep.errors.push_back("ns/: walk stopped early: " + s.message());
  }

  // Packs kept only as bases of others (their own file was deleted).
  std::unordered_set<ObjectId> needed;
  while (!base_todo.empty()) {
    const auto [id, needer] = base_todo.back();
    base_todo.pop_back();
    if (!needed.insert(id).second || pack_owner.count(id)) continue;
    Result<std::shared_ptr<PackReader>> pack = OpenPack(id);
    if (!pack.ok()) {
      ++unknown_refs;
      rep.errors.push_back(pack_path(id) + ": base pack needed by " + needer + " " + cannot_open(pack.status()));
      continue;
    }
    if (!(*pack)->meta_status().ok()) {
      ++unknown_refs;
      rep.errors.push_back(pack_path(id) + ": meta block of this base pack (needed by " + needer +
                           ") cannot be read (the bases it needs are unknown): " + (*pack)->meta_status().message());
    }
    for (ObjectId b : (*pack)->meta().bases) base_todo.emplace_back(b, pack_path(id));
  }

  // Packs no readable stub or pack needs. Each is opened: one that cannot
  // be read may be what a file needs, and hides what it needs itself.
  struct Orphan {
    std::string where;
  };
  std::vector<Orphan> orphans;
  if (Result<std::vector<DirEntry>> dirs = env_->ListDir(packs_.get()); dirs.ok()) {
    for (const DirEntry& d : *dirs) {
      Result<UniqueFd> dir = env_->OpenAt(packs_.get(), d.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      Result<std::vector<DirEntry>> files =
          dir.ok() ? env_->ListDir(dir->get()) : Result<std::vector<DirEntry>>(dir.status());
      if (!files.ok()) {
        ++unknown_refs;
        rep.errors.push_back("packs/" + d.name + "/: directory cannot be read (its packs are unknown): " +
                             files.status().message());
        continue;
      }
      for (const DirEntry& f : *files) {
        std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kPackSuffix);
        const std::string where = "packs/" + d.name + "/" + f.name;
        if (!id || internal::PackDirName(*id) != d.name) {
          rep.warnings.push_back(where + ": unexpected file");
          continue;
        }
        if (pack_owner.count(*id) || needed.count(*id)) continue;
        Result<std::shared_ptr<PackReader>> pack = OpenPack(*id);
        if (!pack.ok()) {
          ++unknown_refs;
          rep.errors.push_back(where + ": pack no file names cannot be read (header or chunk table), so what it "
                               "needs is unknown: " + pack.status().message());
        } else if (!(*pack)->meta_status().ok()) {
          ++unknown_refs;
          rep.errors.push_back(where + ": meta block of a pack no file names cannot be read, so what it needs is "
                               "unknown: " + (*pack)->meta_status().message());
        } else {
          orphans.push_back({where});
        }
      }
    }
  } else {
    ++unknown_refs;
    rep.errors.push_back("packs/: " + dirs.status().message());
  }
  // Orphans are not corruption. Recovery removes them only when it could
  // read every stub and pack; otherwise they may be what an unreadable
  // object needs, and stay.
  const std::string fate = unknown_refs == 0
                               ? "the next mount or `ckptfs gc` removes it"
                               : "kept: recovery and gc delete nothing while the objects reported above cannot be read";
  for (const Orphan& o : orphans) rep.warnings.push_back(o.where + ": orphan pack (no file needs it; " + fate + ")");
  if (Result<std::vector<DirEntry>> files = env_->ListDir(staging_.get()); files.ok()) {
    for (const DirEntry& f : *files) {
      std::optional<ObjectId> id = internal::ParseObjectFileName(f.name, internal::kStagingSuffix);
      if (!id) {
        rep.warnings.push_back("staging/" + f.name + ": unexpected file");
      } else if (!staging_ref.count(*id)) {
        rep.warnings.push_back("staging/" + f.name + ": orphan staging file (no stub names it; " + fate + ")");
      }
    }
  } else {
    rep.errors.push_back("staging/: " + files.status().message());
  }
  if (Result<std::vector<DirEntry>> files = env_->ListDir(tmp_.get()); files.ok()) {
    for (const DirEntry& f : *files) {
      rep.warnings.push_back("tmp/" + f.name + ": left by an interrupted seal (recovery removes it)");
    }
  } else {
    rep.errors.push_back("tmp/: " + files.status().message());
  }
  return rep;
}

}  // namespace ckptfs
