// Store::Open: the backing directory, the superblock, the lock, the
// layout directories and where packs live.
#include "store/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "store/cluster/rados_pack_objects.h"
#include "store/dir_pack_objects.h"
#include "store/private_store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

constexpr const char* kLayoutDirs[] = {"ns", "packs", "staging", "tmp"};
constexpr size_t kMaxSuperblockBytes = 64 * 1024;

bool IsErr(const Status& s, int code) { return !s.ok() && s.code() == code; }

// Opens the backing directory, creating it (but not its parents) when
// allowed, with messages that tell the user what to do.
Result<UniqueFd> OpenBackingDir(Env* env, const std::string& backing, bool create) {
  Result<UniqueFd> fd = env->OpenAt(AT_FDCWD, backing, O_RDONLY | O_DIRECTORY);
  if (fd.ok()) return fd;
  const int err = fd.status().code();
  const std::string missing = "backing directory " + backing + " does not exist; create it or pass an empty directory";
  if (err == ENOENT && create) {
    Status mk = env->MkdirAt(AT_FDCWD, backing, kPrivateDirMode);
    if (IsErr(mk, ENOENT)) return Status::Error(ENOENT, missing + " (its parent directory is missing too)");
    if (!mk.ok() && mk.code() != EEXIST) return mk.WithContext("cannot create backing directory " + backing);
    spdlog::info("created backing directory {}", backing);
    fd = env->OpenAt(AT_FDCWD, backing, O_RDONLY | O_DIRECTORY);
    if (fd.ok()) return fd;
  }
  switch (fd.status().code()) {
    case ENOENT:
      return Status::Error(ENOENT, missing);
    case ENOTDIR:
      return Status::Error(ENOTDIR, "backing path " + backing + " is not a directory");
    case EACCES:
    case EPERM:
      return fd.status().WithContext("backing directory " + backing + " is not accessible");
    default:
      return fd.status().WithContext("cannot open backing directory " + backing);
  }
}

// Whether `backing` holds nothing but what an interrupted initialisation
// can leave behind (we never adopt a directory with someone else's files).
Result<bool> IsEmptyForInit(Env* env, int root_fd) {
  ASSIGN_OR_RETURN(std::vector<DirEntry> entries, env->ListDir(root_fd));
  for (const DirEntry& e : entries) {
    // lost+found: the backing store may be the root of a dedicated volume.
    if (e.name != internal::kSuperblockTmpName && e.name != internal::kLockName && e.name != "lost+found") {
      return false;
    }
  }
  return true;
}

// LOCK holds the pid of the process that holds it, for humans and tests.
Status WritePid(Env* env, int lock_fd) {
  const std::string pid = std::to_string(::getpid()) + "\n";
  RETURN_IF_ERROR(env->Ftruncate(lock_fd, 0));
  return env->PWriteAll(lock_fd, std::span(reinterpret_cast<const uint8_t*>(pid.data()), pid.size()), 0);
}

// What a new store records: packs=rados:POOL gets a RADOS namespace of its
// own, so that stores sharing a pool never see (nor collect) each other's packs.
internal::Superblock NewSuperblock(const StoreOptions& opts) {
  internal::Superblock sb;
  sb.chunk_size = opts.chunk_size;
  if (!opts.cluster.packs.empty() && opts.cluster.packs != "dir") {
    sb.packs = opts.cluster.packs;
    sb.rados_namespace = "ckptfs-" + ObjectIdHex(NewObjectId());
  }
  return sb;
}

// Where packs live is decided when a store is created: a later packs=
// must name the same place (or be left out).
Status CheckPackLocation(const internal::Superblock& sb, const std::string& asked, const std::string& backing) {
  if (asked.empty() || asked == sb.packs) return Status::Ok();
  const std::string recorded = sb.packs == "dir" ? "its directory (packs=dir)" : sb.packs;
  return Status::InvalidArgument("store " + backing + " keeps its packs in " + recorded +
                                 ", recorded when it was created; it cannot be opened with packs=" + asked +
                                 " (leave packs= out, or pass packs=" + sb.packs + ")");
}

}  // namespace

// After a fork the daemon, not the parent that took the lock, holds it.
Status Store::RecordOwnerPid() {
  if (membership_) return membership_->StartRenewing();
  if (!lock_.valid()) return Status::Ok();
  return WritePid(env_, lock_.get());
}

namespace internal {
namespace {

Status ReadPackLocation(const nlohmann::json& j, const std::string& where, Superblock* sb) {
  if (!j.contains("packs")) return Status::Ok();
  if (!j["packs"].is_string()) return Status::Corruption(where + ": \"packs\" is not a string");
  sb->packs = j["packs"].get<std::string>();
  if (sb->packs == "dir") return Status::Ok();
  if (!sb->packs.starts_with("rados:") || sb->packs.size() == 6) {
    return Status::Corruption(where + ": \"packs\" is " + sb->packs + ", neither dir nor rados:POOL");
  }
  if (!j.contains("rados_namespace") || !j["rados_namespace"].is_string()) {
    return Status::Corruption(where + ": packs in " + sb->packs + " but no \"rados_namespace\"");
  }
  sb->rados_namespace = j["rados_namespace"].get<std::string>();
  return Status::Ok();
}

}  // namespace

Result<Superblock> ReadSuperblock(Env* env, int root_fd, const std::string& store_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, env->OpenAt(root_fd, kSuperblockName, O_RDONLY | O_NOFOLLOW));
  ASSIGN_OR_RETURN(std::string text, ReadFdToString(env, fd.get(), kMaxSuperblockBytes));
  const std::string where = "store " + store_path + ": superblock " + kSuperblockName;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(where + " is not valid JSON");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != "ckptfs") {
    return Status::Corruption(where + " does not name format \"ckptfs\"");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) {
    return Status::Corruption(where + " has no integer \"version\"");
  }
  Superblock sb;
  sb.version = j["version"].get<int>();
  if (sb.version > kStoreFormatVersion) {
    return Status::Error(ENOTSUP, "store " + store_path + " has format version " + std::to_string(sb.version) +
                                      ", newer than this ckptfs supports (" + std::to_string(kStoreFormatVersion) +
                                      "); upgrade ckptfs");
  }
  if (sb.version < 1) return Status::Corruption(where + " has invalid version " + std::to_string(sb.version));
  if (j.contains("chunk_size") && j["chunk_size"].is_number_unsigned()) sb.chunk_size = j["chunk_size"].get<uint32_t>();
  sb.shared = j.contains("shared") && j["shared"].is_boolean() && j["shared"].get<bool>();
  RETURN_IF_ERROR(ReadPackLocation(j, where, &sb));
  if ((sb.shared || sb.packs != "dir") && sb.version < 2) {
    return Status::Corruption(where + ": a shared store, or one with packs outside its directory, is version 2");
  }
  return sb;
}

Status WriteSuperblock(Env* env, int root_fd, const std::string& backing, const Superblock& sb) {
  // An older ckptfs must refuse what it would get wrong: a shared store,
  // or packs outside the directory. Other stores stay version 1.
  const bool needs_v2 = sb.shared || sb.packs != "dir";
  nlohmann::json j = {{"format", "ckptfs"},
                      {"version", needs_v2 ? kStoreFormatVersion : kSingleNodeStoreVersion},
                      {"chunk_size", sb.chunk_size}};
  if (sb.shared) j["shared"] = true;
  // A store with packs in its directory says nothing: its superblock is
  // what it always was.
  if (sb.packs != "dir") {
    j["packs"] = sb.packs;
    j["rados_namespace"] = sb.rados_namespace;
  }
  const std::string text = j.dump() + "\n";
  // tmp + fsync + rename + dir fsync: a crash leaves either no superblock
  // (an empty store, initialised again) or a complete one.
  Status written = WriteFileAtomically(env, root_fd, internal::kSuperblockName, text, kPrivateFileMode,
                                       Durability::kDataAndName);
  if (written.code() == EACCES || written.code() == EROFS || written.code() == EPERM) {
    return written.WithContext("backing directory " + backing + " is not writable");
  }
  return written.WithContext("cannot write superblock");
}

// One daemon per store: flock on LOCK (released by the kernel when the
// process dies, so a crash never leaves a stale lock), pid inside for humans
// and for tests that need the daemon's pid.
Result<UniqueFd> TakeLock(Env* env, int root_fd, const std::string& backing) {
  ASSIGN_OR_RETURN(UniqueFd fd,
                   env->OpenAt(root_fd, internal::kLockName, O_RDWR | O_CREAT | O_NOFOLLOW, kPrivateFileMode));
  if (Status locked = env->Flock(fd.get(), LOCK_EX | LOCK_NB); !locked.ok()) {
    if (locked.code() != EWOULDBLOCK) return locked.WithContext("cannot lock store " + backing);
    std::string pid = "unknown";
    if (Result<std::string> text = ReadFdToString(env, fd.get(), 32); text.ok()) {
      std::string t = *text;
      while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
      if (!t.empty()) pid = t;
    }
    return Status::Error(EBUSY, "store " + backing + " is already served by another ckptfs daemon (pid " + pid + ")");
  }
  RETURN_IF_ERROR(WritePid(env, fd.get()));
  return fd;
}

}  // namespace internal

Result<std::unique_ptr<Store>> Store::Open(Env* env, const std::string& backing, const StoreOptions& opts) {
  if (backing.empty()) return Status::InvalidArgument("no backing directory given");
  if (opts.chunk_size == 0) return Status::InvalidArgument("chunk size must be positive");
  ASSIGN_OR_RETURN(UniqueFd root, OpenBackingDir(env, backing, opts.create_if_missing));
  std::unique_ptr<Store> store(new Store(env, backing, opts));
  store->root_ = std::move(root);
  const int root_fd = store->root_.get();
  // A store we write must be one nobody else could have written (the
  // read-only tools only read, and may run as another user).
  if (opts.take_lock) RETURN_IF_ERROR(CheckStoreRootIsTrusted(env, root_fd, backing));

  Result<internal::Superblock> sb = internal::ReadSuperblock(env, root_fd, backing);
  if (!sb.ok() && sb.status().code() != ENOENT) return sb.status();
  if (!sb.ok()) {
    ASSIGN_OR_RETURN(bool empty, IsEmptyForInit(env, root_fd));
    if (!empty) {
      return Status::Error(ENOTEMPTY, "backing directory " + backing +
                                          " is not empty and has no CKPTFS superblock; refusing to use it "
                                          "(pass an empty directory or an existing ckptfs store)");
    }
    if (!opts.create_if_missing) {
      return Status::Error(ENOENT, "backing directory " + backing + " is not a ckptfs store (no CKPTFS superblock)");
    }
    sb = NewSuperblock(opts);
    RETURN_IF_ERROR(internal::WriteSuperblock(env, root_fd, backing, *sb));
    spdlog::info("initialised ckptfs store in {}", backing);
  }
  RETURN_IF_ERROR(CheckPackLocation(*sb, opts.cluster.packs, backing));
  const bool shared = sb->shared;
  if (shared) store->opts_.cluster.enabled = true;

  if (opts.take_lock && !store->cluster()) {
    ASSIGN_OR_RETURN(store->lock_, internal::TakeLock(env, root_fd, backing));
  }
  RETURN_IF_ERROR(store->InitLayout());
  RETURN_IF_ERROR(store->OpenPackObjects(sb->packs, sb->rados_namespace));
  if (store->cluster()) RETURN_IF_ERROR(store->OpenCluster(shared));
  if (opts.take_lock) {
    ASSIGN_OR_RETURN(store->made_private_, MakeStorePrivate(env, root_fd, backing));
  }
  return store;
}

// The layout directories are (re)created on every writable open, after the
// superblock: a crash during initialisation is finished by the next open.
Status Store::InitLayout() {
  bool created = false;
  for (const char* name : kLayoutDirs) {
    if (!opts_.create_if_missing) break;
    const bool ns = std::string_view(name) == "ns";
    Status s = env_->MkdirAt(root_.get(), name, ns ? kNamespaceRootMode : kPrivateDirMode);
    // The daemon's umask (077) would make the mount root 0700: other users
    // could not use the mount at all.
    if (s.ok() && ns) s = env_->FchmodAt(root_.get(), name, kNamespaceRootMode, AT_SYMLINK_NOFOLLOW);
    if (s.ok()) created = true;
    if (!s.ok() && s.code() != EEXIST) return s.WithContext("initialising store " + path_);
  }
  if (created) RETURN_IF_ERROR(env_->Fsync(root_.get()));
  UniqueFd* fds[] = {&ns_, &packs_, &staging_, &tmp_};
  for (size_t i = 0; i < std::size(kLayoutDirs); ++i) {
    Result<UniqueFd> fd = env_->OpenAt(root_.get(), kLayoutDirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (!fd.ok()) {
      return fd.status().WithContext("store " + path_ + " is missing or cannot open " + kLayoutDirs[i] + "/");
    }
    *fds[i] = std::move(fd).value();
  }
  return Status::Ok();
}

void Store::ClosePackConnection() {
  if (opts_.cluster.packs == "dir") return;
  {
    std::lock_guard lk(readers_mu_);
    readers_.clear();
  }
  pack_objects_.reset();
}

Status Store::OpenPackConnection() {
  if (opts_.cluster.packs == "dir") return Status::Ok();
  return OpenPackObjects(opts_.cluster.packs, rados_namespace_);
}

Status Store::OpenPackObjects(const std::string& packs, const std::string& rados_namespace) {
  opts_.cluster.packs = packs;  // what the store recorded, also when the mount left it out
  rados_namespace_ = rados_namespace;
  if (packs == "dir") {
    pack_objects_ = std::make_unique<DirPackObjects>(env_, packs_.get(), opts_.direct_pack_reads);
    return Status::Ok();
  }
  const std::string pool = packs.substr(std::string_view("rados:").size());
  const RadosConnector& connect = opts_.connect_rados ? opts_.connect_rados : RadosConnector(ConnectLibrados);
  Result<std::unique_ptr<RadosClient>> client = connect(opts_.cluster.ceph_conf, pool, rados_namespace);
  if (!client.ok()) return client.status().WithContext("store " + path_ + " keeps its packs in " + packs);
  pack_objects_ = std::make_unique<RadosPackObjects>(env_, std::move(client).value(), packs);
  spdlog::debug("store {}: packs in RADOS pool {} (namespace {})", path_, pool, rados_namespace);
  return Status::Ok();
}

}  // namespace ckptfs
