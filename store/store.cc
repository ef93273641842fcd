#include "store/store.h"

#include <fcntl.h>
#include <unistd.h>

#include "base/log.h"
#include "base/metrics.h"
#include "cache/chunk_buffers.h"
#include "store/cluster/seal_pin.h"
#include "store/lossy_xattrs.h"
#include "store/private_store.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

using internal::StagingFileName;

// Open base packs kept for reads through references and deltas.
constexpr size_t kMaxOpenBasePacks = 32;
// Reads through base references nest at most this deep: deeper means a
// corrupt store with a reference cycle, never a real chain.
constexpr int kMaxBaseNesting = 64;

bool IsErr(const Status& s, int code) { return !s.ok() && s.code() == code; }

}  // namespace

Status Store::DeleteDeadPacks(const std::vector<ObjectId>& dead) {
  // Cluster mode: another node's stub or seal may need what this node's
  // index thinks dead; only cluster GC, which sees them all, deletes.
  if (dead.empty() || opts_.cluster.enabled) return Status::Ok();
  if (deletion_blocked()) {
    // The index says nothing needs them, but it does not know what the
    // objects recovery could not read refer to (ARCHITECTURE.md, Recovery).
    for (ObjectId id : dead) {
      spdlog::warn(
          "keeping pack {} although no file needs it: recovery found unreadable objects "
          "(see `ckptfs fsck`); `ckptfs gc` deletes it once they are repaired",
          pack_objects_->Where(id));
    }
    return Status::Ok();
  }
  {
    std::lock_guard lk(readers_mu_);
    readers_.remove_if([&](const auto& r) { return std::find(dead.begin(), dead.end(), r.first) != dead.end(); });
  }
  if (base_cache_ != nullptr) {
    for (ObjectId id : dead) base_cache_->ErasePack(id);
  }
  if (opts_.background_gc) {
    std::lock_guard lk(gc_mu_);
    if (!gc_thread_.joinable()) gc_thread_ = std::thread([this] { GcLoop(); });
    gc_queue_.insert(gc_queue_.end(), dead.begin(), dead.end());
    gc_cv_.notify_one();
    return Status::Ok();
  }
  RETURN_IF_ERROR(SyncBeforeDeleting());
  Status first = Status::Ok();
  for (ObjectId id : dead) {
    Status s = DeletePack(id);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status Store::SyncBeforeDeleting() {
  return env_->SyncFs(root_.get()).WithContext("making the namespace durable before deleting unreferenced objects");
}

void Store::GcLoop() {
  std::unique_lock lk(gc_mu_);
  for (;;) {
    gc_cv_.wait(lk, [&] { return gc_stop_ || !gc_queue_.empty(); });
    if (gc_queue_.empty()) return;  // stopping, and everything is done
    std::vector<ObjectId> batch;
    batch.swap(gc_queue_);
    lk.unlock();
    if (Status s = SyncBeforeDeleting(); !s.ok()) {
      spdlog::warn("gc: keeping {} pack(s) for recovery to delete: {}", batch.size(), s.message());
      batch.clear();
    }
    for (ObjectId id : batch) {
      if (Status s = DeletePack(id); !s.ok()) {
        spdlog::warn("gc: cannot delete pack {} (recovery will): {}", ObjectIdHex(id), s.message());
      }
    }
    lk.lock();
  }
}

Store::~Store() {
  {
    std::lock_guard lk(gc_mu_);
    gc_stop_ = true;
    gc_cv_.notify_one();
  }
  if (gc_thread_.joinable()) gc_thread_.join();
}

Status Store::ReleasePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  // Without the index (a store opened without recovery) nothing says which
  // packs use this one as a base: keep it; recovery's sweep decides.
  if (!index_loaded_) return Status::Ok();
  return DeleteDeadPacks(index_.DropRoot(id));
}

void Store::DiscardNewPack(ObjectId id) {
  if (id == 0 || opts_.cluster.enabled) return;  // cluster GC deletes it (DeleteDeadPacks says why)
  std::vector<ObjectId> dead = index_loaded_ ? index_.DropRoot(id) : std::vector<ObjectId>{};
  std::erase(dead, id);
  if (cluster()) return;  // another node may have picked it as a base already: cluster GC decides
  if (Status s = DeletePack(id); !s.ok()) {
    spdlog::warn("cannot remove abandoned pack {} (recovery will): {}", ObjectIdHex(id), s.message());
  }
  (void)DeleteDeadPacks(dead);
}

Status Store::RetirePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  if (!index_loaded_ || !index_.Contains(id)) return ReleasePack(id);
  index_.Retire(id);
  PinRetired(id);
  return Status::Ok();
}

Status Store::ReleaseRetired(ObjectId id) {
  if (id == 0 || !index_loaded_) return Status::Ok();
  {
    std::lock_guard lk(retired_pins_mu_);
    if (auto it = retired_pins_.find(id); it != retired_pins_.end() && --it->second.count == 0) retired_pins_.erase(it);
  }
  return DeleteDeadPacks(index_.Unretire(id));
}

// Cluster mode: no stub names a retired pack while its file is rewritten,
// and cluster GC would mark it doomed, costing the next version its delta.
// A pin keeps it live until the next seal (whose own pin then takes over).
void Store::PinRetired(ObjectId id) {
  if (!pins_.valid()) return;
  std::lock_guard lk(retired_pins_mu_);
  RetiredPin& held = retired_pins_[id];
  if (held.count++ > 0) return;
  Result<std::unique_ptr<SealPin>> pin = SealPin::Create(env_, pins_.get());
  const ObjectId ids[] = {id};
  Status added = pin.ok() ? (*pin)->Add(ids) : pin.status();
  if (!added.ok()) {
    spdlog::warn("cannot pin retired pack {} (its successor may be stored without it): {}", ObjectIdHex(id),
                 added.message());
  }
  if (pin.ok()) held.pin = std::move(pin).value();
}

Result<std::shared_ptr<PackReader>> Store::CachedPack(ObjectId id) {
  {
    std::lock_guard lk(readers_mu_);
    for (auto it = readers_.begin(); it != readers_.end(); ++it) {
      if (it->first != id) continue;
      readers_.splice(readers_.begin(), readers_, it);
      return readers_.front().second;
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, OpenPack(id));
  std::lock_guard lk(readers_mu_);
  readers_.emplace_front(id, reader);
  if (readers_.size() > kMaxOpenBasePacks) readers_.pop_back();
  return reader;
}

std::optional<std::pair<ObjectId, uint64_t>> Store::BaseOfChunk(ObjectId pack, uint64_t offset, uint64_t len) {
  Result<std::shared_ptr<PackReader>> reader = CachedPack(pack);
  if (!reader.ok()) return std::nullopt;
  const PackReader& r = **reader;
  const uint64_t lead = BaseWindowLead(offset);
  const uint64_t start = offset + lead, end = offset + len;  // the window's bytes in the pack (wraps for a lead)
  if (lead >= len || end > r.header().logical_size) return std::nullopt;
  // After a file's tensors moved, windows straddle two chunks (or start
  // before the first): they map to one window of a base only when every
  // chunk they touch has the same base pack and the same shift against it.
  const uint64_t cs = r.header().chunk_size;
  std::optional<std::pair<ObjectId, uint64_t>> shift;  // base pack, base offset - chunk offset
  for (uint64_t i = start / cs; i * cs < end; ++i) {
    Result<std::pair<ObjectId, uint64_t>> base = r.ChunkBase(i);
    if (!base.ok()) return std::nullopt;
    const std::pair<ObjectId, uint64_t> s{base->first, base->second - i * cs};
    if (shift && *shift != s) return std::nullopt;
    shift = s;
  }
  return std::make_pair(shift->first, shift->second + offset);
}

Result<ChunkBytes> Store::LoadChunk(const PackReader& pack, ObjectId id, uint64_t index, ChunkCache* cache) {
  auto load = [&]() -> Result<ChunkBytes> {
    pack.Prefetch(index + 1);
    if (index >= pack.chunks().size()) return pack.ReadChunkInto(index, {}, this);  // its out-of-range error
    std::shared_ptr<ChunkBuffer> bytes = ChunkBuffers::Default().Acquire(pack.chunks()[index].raw_len);
    RETURN_IF_ERROR(pack.ReadChunkInto(index, *bytes, this));
    GlobalMetrics().chunk_decodes.Add();
    GlobalMetrics().chunk_decoded_bytes.Add(bytes->size());
    return ChunkBytes(std::move(bytes));
  };
  return cache != nullptr ? cache->GetOrLoad(ChunkKey{id, index}, load) : load();
}

namespace {

// Bounds the recursion of bases reading their own bases on this thread.
class BaseNesting {
 public:
  BaseNesting() { ++depth(); }
  ~BaseNesting() { --depth(); }
  static Status Check(ObjectId pack) {
    if (depth() < kMaxBaseNesting) return Status::Ok();
    return Status::Corruption("base references nest deeper than " + std::to_string(kMaxBaseNesting) +
                              " packs at pack " + ObjectIdHex(pack) + " (a reference cycle?)");
  }

 private:
  static int& depth() {
    thread_local int d = 0;
    return d;
  }
};

}  // namespace

Result<std::shared_ptr<PackReader>> Store::BaseRangeReader(ObjectId pack, uint64_t offset, uint64_t len) {
  Result<std::shared_ptr<PackReader>> reader = CachedPack(pack);
  if (!reader.ok()) return reader.status().WithContext("base pack " + ObjectIdHex(pack));
  const PackHeader& h = (*reader)->header();
  if (offset > h.logical_size || h.logical_size - offset < len) {
    return Status::Corruption("range " + std::to_string(offset) + "+" + std::to_string(len) +
                              " is outside base pack " + ObjectIdHex(pack));
  }
  return reader;
}

// A delta's base usually lines up with one chunk of its base pack: the
// decoder then reads that cached chunk in place, no copy and no buffer.
Status Store::UsePackRange(ObjectId pack, uint64_t offset, uint64_t len,
                           const std::function<Status(std::span<const uint8_t>)>& use) {
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, len));
  const uint64_t cs = reader->header().chunk_size;
  const uint64_t index = offset / cs, within = offset - index * cs;
  if (len == 0 || within + len > reader->chunks()[index].raw_len) return BaseSource::UsePackRange(pack, offset, len, use);
  ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(*reader, pack, index, base_cache_));
  if (base_cache_ != nullptr) base_cache_->NoteRead(ChunkKey{pack, index}, within, within + len);
  return use(std::span<const uint8_t>(chunk->data() + within, len));
}

Status Store::ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, out.size()));
  return CopyPackBytes(*reader, pack, offset, out, base_cache_, /*note_read=*/true);
}

Status Store::CopyPackBytes(const PackReader& pack, ObjectId id, uint64_t offset, std::span<uint8_t> out,
                            ChunkCache* cache, bool note_read) {
  const uint64_t cs = pack.header().chunk_size;
  if (offset > pack.header().logical_size || out.size() > pack.header().logical_size - offset) {
    return Status::InvalidArgument("range " + std::to_string(offset) + "+" + std::to_string(out.size()) +
                                   " is outside pack " + ObjectIdHex(id));
  }
  for (uint64_t pos = offset; pos < offset + out.size();) {
    const uint64_t index = pos / cs, within = pos - index * cs;
    ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(pack, id, index, cache));
    const uint64_t n = std::min<uint64_t>(offset + out.size() - pos, chunk->size() - std::min(chunk->size(), within));
    if (n == 0)
      return Status::Corruption("pack " + ObjectIdHex(id) + ": chunk " + std::to_string(index) +
                                " is shorter than the chunk size");
    std::memcpy(out.data() + (pos - offset), chunk->data() + within, n);
    if (cache != nullptr && note_read) cache->NoteRead(ChunkKey{id, index}, within, within + n);
    pos += n;
  }
  return Status::Ok();
}

Status Store::ReadPackRangeOnce(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> reader, BaseRangeReader(pack, offset, out.size()));
  const uint64_t cs = reader->header().chunk_size;
  const uint64_t index = offset / cs;
  const bool whole_chunk = offset % cs == 0 && !out.empty() && reader->chunks()[index].raw_len == out.size();
  if (!whole_chunk || (base_cache_ != nullptr && base_cache_->Contains(ChunkKey{pack, index}))) {
    return ReadPackRange(pack, offset, out);
  }
  RETURN_IF_ERROR(BaseNesting::Check(pack));
  BaseNesting nested;
  // The next chunks' bases are read while this one decodes (the seal's
  // workers code chunks in about file order).
  for (uint64_t ahead = 1; ahead <= ChunkReadAhead::kMaxHeld; ++ahead) reader->ReadAhead(index + ahead);
  RETURN_IF_ERROR(reader->ReadChunkInto(index, out, this));
  GlobalMetrics().chunk_decodes.Add();
  GlobalMetrics().chunk_decoded_bytes.Add(out.size());
  return Status::Ok();
}

Result<std::shared_ptr<PackReader>> Store::OpenPack(ObjectId id) {
  // A pack that a stub or another pack names is never missing in a healthy
  // store, so its absence is damage: EIO for readers (invariant 3), not a
  // file "not found" that exists in the namespace.
  auto missing = [&](const Status& s) {
    const std::string where = pack_objects_->Where(id);
    return s.code() == ENOENT ? Status::Error(EIO, "pack " + where + " is missing") : s.WithContext(where);
  };
  Result<std::unique_ptr<PackBytes>> source = pack_objects_->Open(id);
  if (!source.ok()) return missing(source.status());
  return PackReader::Open(std::move(source).value(), ObjectIdHex(id));
}

Status Store::DeletePack(ObjectId id) {
  if (id == 0) return Status::Ok();
  return pack_objects_->Delete(id);
}

Result<uint64_t> Store::PackFileSize(ObjectId id) { return pack_objects_->Size(id); }

Result<std::vector<Store::PackStat>> Store::ListPacks() {
  ASSIGN_OR_RETURN(PackListing listing, pack_objects_->List(ListDetail::kSizes));
  if (!listing.unlisted.empty()) {
    return listing.unlisted.front().status.WithContext("listing " + listing.unlisted.front().where);
  }
  std::vector<PackStat> out;
  for (const PackObjectEntry& e : listing.packs) {
    out.push_back({.id = e.id, .bytes = e.bytes, .mtime_ns = e.mtime_ns, .complete = e.complete});
  }
  return out;
}

Result<uint64_t> Store::AllPackBytes() {
  ASSIGN_OR_RETURN(PackListing listing, pack_objects_->List(ListDetail::kSizes));
  uint64_t total = 0;
  for (const PackObjectEntry& e : listing.packs) total += e.bytes;
  return total;
}

Result<UniqueFd> Store::CreateStaging(ObjectId* id) {
  const ObjectId new_id = NewObjectId();
  ASSIGN_OR_RETURN(UniqueFd fd,
                   env_->OpenAt(staging_.get(), StagingFileName(new_id), O_CREAT | O_EXCL | O_RDWR, kPrivateFileMode));
  *id = new_id;
  return fd;
}

Result<UniqueFd> Store::OpenStaging(ObjectId id) {
  return env_->OpenAt(staging_.get(), StagingFileName(id), O_RDWR | O_NOFOLLOW);
}

Status Store::DeleteStaging(ObjectId id) {
  if (id == 0) return Status::Ok();
  Status s = env_->UnlinkAt(staging_.get(), StagingFileName(id));
  return IsErr(s, ENOENT) ? Status::Ok() : s;
}

Status Store::SyncStagingDir() { return env_->Fsync(staging_.get()); }

// Chunks come through the decoded-chunk cache when there is one (the daemon
// reads files through the same one), so rewriting a file just read decodes
// nothing twice.
Status Store::DecodePackInto(ObjectId id, uint64_t keep_bytes, int dst_fd) {
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> pack, OpenPack(id));
  const uint64_t cs = pack->header().chunk_size;
  for (uint64_t i = 0; i < pack->chunks().size() && i * cs < keep_bytes; ++i) {
    if (pack->chunks()[i].codec == ChunkCodec::kZero) continue;  // stays a hole
    ASSIGN_OR_RETURN(ChunkBytes chunk, LoadChunk(*pack, id, i, base_cache_));
    const uint64_t n = std::min<uint64_t>(chunk->size(), keep_bytes - i * cs);
    RETURN_IF_ERROR(env_->PWriteAll(dst_fd, std::span(chunk->data(), n), i * cs));
  }
  return Status::Ok();
}

Result<Store::Staged> Store::StageStub(int stub_fd, const StubRecord& sealed, uint64_t keep_bytes) {
  if (sealed.state != StubState::kSealed) return Status::InvalidArgument("StageStub: stub is not sealed");
  const uint64_t keep = std::min(keep_bytes, sealed.size);
  ObjectId id = 0;
  ASSIGN_OR_RETURN(UniqueFd fd, CreateStaging(&id));
  Status st = Status::Ok();
  if (keep > 0) {
    st = DecodePackInto(sealed.object, keep, fd.get());
    if (st.ok()) st = env_->Ftruncate(fd.get(), keep);
    if (st.ok()) st = env_->Fdatasync(fd.get());
  }
  // Even an empty staging file must not vanish from under a durable stub.
  if (st.ok() && sealed.object != 0) st = SyncStagingDir();
  StubRecord next{.gen = 0, .state = StubState::kStaged, .size = keep, .object = id, .node = node_id_};
  Result<StubRecord> written = st.ok() ? WriteStub(env_, stub_fd, sealed, next) : Result<StubRecord>(st);
  if (!written.ok()) {
    (void)DeleteStaging(id);
    return written.status();
  }
  // Other nodes must read the record (it hides the file) before anything else.
  if (cluster()) {
    if (Status s = env_->Fdatasync(stub_fd); !s.ok())
      spdlog::warn("staged stub not yet visible to other nodes: {}", LogSafe(s.message()));
  }
  Staged staged{.rec = *written, .fd = std::move(fd)};
  // Drop the old pack only once no durable record can point at it.
  if (sealed.object != 0 && env_->Fsync(stub_fd).ok()) {
    staged.stub_synced = true;
    staged.retired = sealed.object;
    (void)RetirePack(sealed.object);
  }
  return staged;
}

Result<StubRecord> Store::SealStub(int stub_fd, const StubRecord& staged, int staging_fd,
                                   const std::function<bool()>& still_current, const SealWait& wait,
                                   const std::atomic<bool>* cancel) {
  if (staged.state != StubState::kStaged) return Status::InvalidArgument("SealStub: stub is not staged");
  ASSIGN_OR_RETURN(struct stat sst, env_->Fstat(staging_fd));
  const uint64_t size = static_cast<uint64_t>(sst.st_size);
  // An empty file needs no pack: object 0 already means "no bytes".
  ObjectId pack = 0;
  // Cluster mode: holds the new pack and its bases until the stub names it
  // durably (or the seal is abandoned), on every path out of here.
  std::unique_ptr<SealPin> pin;
  // Until the stub names the pack (AddRoot), or it is discarded: then a
  // seal of the same input finds it (store/same_input.h).
  std::unique_ptr<SameInputSeals::Hold> input_hold;
  if (size > 0) {
    const std::unique_ptr<SiblingSource> siblings = SiblingsOf(stub_fd, sst.st_mtim, wait);
    ASSIGN_OR_RETURN(pack,
                     PublishPack(staging_fd, size, cancel, PolicyFor(stub_fd), siblings.get(), &pin, &input_hold));
  }

  if (still_current && !still_current()) {
    DiscardNewPack(pack);
    return Status::Error(EAGAIN, "file changed while sealing");
  }

  StubRecord sealed{.state = StubState::kSealed, .size = size, .object = pack};
  Result<StubRecord> written = WriteStub(env_, stub_fd, staged, sealed);
  if (!written.ok()) {
    // A failed write leaves the slot invalid (checksummed), so the stub
    // still names the staging file, unless the bytes landed after all.
    Result<StubRecord> now = ReadStub(env_, stub_fd);
    if (now.ok() && now->object != pack) {
      DiscardNewPack(pack);
    } else if (index_loaded_) {
      index_.AddRoot(pack);
    }
    return written.status().WithContext("sealing stub");
  }
  if (index_loaded_) index_.AddRoot(pack);
  // mtime first, then one fsync covers record and times. The stub write
  // itself bumped mtime; the user's mtime is the staging file's.
  const struct timespec times[2] = {{0, UTIME_OMIT}, sst.st_mtim};
  RETURN_IF_ERROR(env_->Futimens(stub_fd, times).WithContext("sealing stub"));
  // From here the pack may be referenced on disk: never delete it on error.
  RETURN_IF_ERROR(env_->Fsync(stub_fd).WithContext("sealing stub"));

  if (Status s = DeleteStaging(staged.object); !s.ok()) {
    spdlog::warn("sealed, but cannot remove staging file {} (recovery will): {}", StagingFileName(staged.object),
                 s.message());
  }
  return *written;
}

double Store::FidelityFor(int stub_fd) { return PolicyFor(stub_fd).fidelity; }

Result<std::string> Store::NamespacePathOf(int stub_fd) {
  ASSIGN_OR_RETURN(const std::string root, env_->ReadlinkAt(AT_FDCWD, ProcFdPath(ns_.get())));
  ASSIGN_OR_RETURN(const std::string where, env_->ReadlinkAt(AT_FDCWD, ProcFdPath(stub_fd)));
  if (!where.starts_with(root + "/")) return Status::Error(ENOENT, where + " is not under " + root);
  const std::string path = where.substr(root.size() + 1);
  ASSIGN_OR_RETURN(struct stat self, env_->Fstat(stub_fd));
  Result<struct stat> there = env_->FstatAt(ns_.get(), path, AT_SYMLINK_NOFOLLOW);
  if (!there.ok() || there->st_dev != self.st_dev || there->st_ino != self.st_ino) {
    return Status::Error(ENOENT, where + " was unlinked or moved while it was looked up");
  }
  return path;
}

Status Store::SyncDirectoryOf(int stub_fd) {
  // A rename racing with the lookup makes NamespacePathOf fail once: look
  // again, the stub is then in its new directory.
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Result<std::string> path = NamespacePathOf(stub_fd);
    if (path.ok()) {
      const size_t slash = path->rfind('/');
      const std::string dir = slash == std::string::npos ? "." : path->substr(0, slash);
      ASSIGN_OR_RETURN(UniqueFd fd, env_->OpenAt(ns_.get(), dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
      return env_->Fsync(fd.get());
    }
    ASSIGN_OR_RETURN(struct stat st, env_->Fstat(stub_fd));
    if (st.st_nlink == 0) return Status::Ok();
    last = path.status();
  }
  return Status::Error(EIO, "cannot find the directory to fsync: " + last.message());
}

LossyPolicy Store::PolicyFor(int stub_fd) {
  // A rename racing with the lookup (a checkpoint written as NAME.tmp and
  // renamed to NAME as soon as it is closed) makes NamespacePathOf fail
  // once: look again, rather than seal a file of a lossy directory exactly.
  Result<std::string> path = NamespacePathOf(stub_fd);
  for (int attempt = 1; attempt < 3 && !path.ok(); ++attempt) path = NamespacePathOf(stub_fd);
  if (!path.ok()) {
    spdlog::debug("no lossy policy for {}: {}", LogSafe(FdPathForLog(stub_fd)), LogSafe(path.status().message()));
    return {};
  }
  return PolicyAbove(*path);
}

LossyPolicy Store::PolicyOfDirectory(int dir_fd) {
  Result<struct stat> self = env_->Fstat(dir_fd);
  Result<struct stat> ns = env_->Fstat(ns_.get());
  if (self.ok() && ns.ok() && self->st_dev == ns->st_dev && self->st_ino == ns->st_ino) return PolicyAbove("/");
  Result<std::string> path = NamespacePathOf(dir_fd);
  if (!path.ok()) {
    spdlog::debug("no lossy policy for {}: {}", LogSafe(FdPathForLog(dir_fd)), LogSafe(path.status().message()));
    return {};
  }
  // As for a file in it: the search starts at the directory itself.
  return PolicyAbove(*path + "/");
}

// A policy that cannot be used is logged at each seal and each read of the
// effective policy below it: limited per the directory owner's uid.
bool Store::PolicyLogAllowed(const std::string& dir) {
  Result<struct stat> st = env_->FstatAt(AT_FDCWD, dir, AT_SYMLINK_NOFOLLOW);
  return LogAllowed(log_kind::kPolicy, st.ok() ? st->st_uid : kLogAnyUid);
}

LossyPolicy Store::PolicyAbove(const std::string& path) {
  // From the entry's directory up to ns/ itself, through ns_.
  std::string dir = path;
  std::vector<uint8_t> buf(64);
  while (!dir.empty()) {
    const size_t slash = dir.rfind('/');
    dir.resize(slash == std::string::npos ? 0 : slash);
    const std::string at = dir.empty() ? "" : "/" + dir;
    const std::string shown = path_ + "/ns" + at;
    const std::string where = ProcFdPath(ns_.get()) + at;
    Result<size_t> n = env_->GetXattr(where, kPolicyXattr, buf);
    if (!n.ok()) {
      if (n.status().code() == ENODATA || n.status().code() == ENOTSUP) continue;
      if (PolicyLogAllowed(where))
        spdlog::warn("cannot read {} of {}: {}; sealing losslessly", kPolicyXattr, LogSafe(shown),
                     LogSafe(n.status().message()));
      return {};
    }
    Result<LossyPolicy> p = ParseLossyPolicy(std::string_view(reinterpret_cast<const char*>(buf.data()), *n));
    if (!p.ok()) {
      if (PolicyLogAllowed(where))
        spdlog::warn("{} of {}: {}; sealing losslessly", kPolicyXattr, LogSafe(shown), LogSafe(p.status().message()));
      return {};
    }
    return *p;
  }
  return LossyPolicy{opts_.lossy, opts_.lossy_scope, opts_.lossy_steps};
}

Status Store::ReleaseStubObjects(const StubRecord& rec) {
  if (rec.object == 0) return Status::Ok();
  if (rec.state == StubState::kSealed) return ReleasePack(rec.object);
  RETURN_IF_ERROR(SyncBeforeDeleting());
  return DeleteStaging(rec.object);
}

}  // namespace ckptfs
