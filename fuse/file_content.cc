#include "fuse/file_content.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "base/log.h"
#include "base/metrics.h"
#include "seal/read_hints.h"
#include "store/env_source.h"

namespace ckptfs {

Result<std::shared_ptr<FileContent>> FileContent::Load(Store* store, ChunkCache* cache, StubFd stub, std::string label,
                                                       DecodeAhead* ahead) {
  auto rec = ReadStub(store->env(), stub.fd.get());
  if (!rec.ok()) return rec.status().WithContext("stub of " + label);
  std::shared_ptr<FileContent> fc(new FileContent(store, cache, ahead, stub.fds, std::move(label)));
  fc->stub_.Assign(stub.fds, std::move(stub.fd), std::move(stub.reopen));
  fc->rec_ = rec.value();
  if (fc->RemoteStagedLocked()) return fc;  // its bytes are on that node until it seals
  if (fc->rec_.state == StubState::kStaged) {
    // Only recovery leaves a stub staged across mounts, and it seals them
    // all; still, serve the staged bytes rather than refuse the file.
    auto fd = store->OpenStaging(fc->rec_.object);
    if (!fd.ok()) {
      // The stub names it, so a missing staging file is damage: EIO, as for a missing pack.
      const Status st = fd.status().code() == ENOENT ? Status::Error(EIO, "staging file is missing") : fd.status();
      return st.WithContext("staging file of " + fc->label_);
    }
    fc->staging_ = fc->NewStaging(fc->rec_.object, std::move(fd).value());
  }
  return fc;
}

uint32_t FileContent::owner_uid() {
  Result<FdCache::Lease> stub = Stub();
  if (!stub.ok()) return kLogAnyUid;
  Result<struct stat> st = store_->env()->Fstat(stub->get());
  return st.ok() ? st->st_uid : kLogAnyUid;
}

std::shared_ptr<FileContent::Staging> FileContent::NewStaging(ObjectId id, UniqueFd fd) {
  auto sp = std::make_shared<Staging>();
  sp->id = id;
  sp->fd.Assign(fds_, std::move(fd), [store = store_, id] { return store->OpenStaging(id); });
  return sp;
}

double FileContent::FidelityFor() {
  auto stub = Stub();
  return stub.ok() ? store_->FidelityFor(stub->get()) : 0;
}

Status FileContent::Fail(const Status& st, const char* what, uint64_t off) {
  // Name the file as the user sees it: its current path under ns/.
  auto stub = Stub();
  std::string where = stub.ok() ? FdPathForLog(stub->get()) : label_;
  const std::string ns = store_->path() + "/ns";
  if (where.rfind(ns, 0) == 0) where = where.substr(ns.size());
  if (LogAllowed(log_kind::kReadError, owner_uid()))
    spdlog::error("{} {} at offset {}: {}", what, LogSafe(where), off, LogSafe(st.message()));
  return st;
}

Result<std::shared_ptr<PackReader>> FileContent::PackLocked() {
  if (pack_) return pack_;
  auto p = store_->OpenPack(rec_.object);
  if (!p.ok()) return p.status();
  pack_ = p.value();
  pack_stored_ = pack_->stored_size();
  return pack_;
}

Status FileContent::FillStat(struct stat* st) {
  std::lock_guard lk(mu_);
  if (RemoteStagedLocked()) {
    st->st_size = static_cast<off_t>(rec_.size);  // final: only closed ones are shown
    st->st_blocks = 0;
    return Status::Ok();
  }
  if (staging_) {
    ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
    auto sst = store_->env()->Fstat(fd.get());
    if (!sst.ok()) return sst.status();
    st->st_size = sst->st_size;
    st->st_blocks = sst->st_blocks;
    st->st_mtim = sst->st_mtim;
    if (sst->st_ctim.tv_sec > st->st_ctim.tv_sec) st->st_ctim = sst->st_ctim;
    return Status::Ok();
  }
  st->st_size = static_cast<off_t>(rec_.size);
  if (rec_.object != 0 && pack_stored_ == 0) {
    auto sz = store_->PackFileSize(rec_.object);
    if (sz.ok()) pack_stored_ = sz.value();
  }
  st->st_blocks = static_cast<blkcnt_t>((pack_stored_ + 511) / 512);
  return Status::Ok();
}

namespace {

// Holes are replied from here. Never written, so it stays in .bss on the
// kernel's shared zero page and costs no memory.
alignas(4096) uint8_t zero_block[1u << 20];

void AppendZeros(uint64_t n, ReadPieces* out) {
  while (n > 0) {
    const uint64_t piece = std::min<uint64_t>(n, sizeof(zero_block));
    out->iov.push_back(iovec{zero_block, piece});
    n -= piece;
  }
}

}  // namespace

namespace {

// The file's bytes through the cache, for parsing what the file is.
class SealedSource : public BoundedSource {
 public:
  SealedSource(Store* store, ChunkCache* cache, std::shared_ptr<PackReader> pack, ObjectId id, uint64_t size)
      : BoundedSource(size, "file"), store_(store), cache_(cache), pack_(std::move(pack)), id_(id) {}

 private:
  Status ReadWithin(uint64_t off, std::span<uint8_t> out) const override {
    // The reader comes for these bytes too: they stay unread in the cache.
    return store_->CopyPackBytes(*pack_, id_, off, out, cache_, /*note_read=*/false);
  }
  Store* const store_;
  ChunkCache* const cache_;
  const std::shared_ptr<PackReader> pack_;
  const ObjectId id_;
};

}  // namespace

void FileContent::DecodeAheadOf(const SealedRange& file, uint64_t off, uint64_t first, uint64_t last,
                                DecodeAhead::Stream* stream) {
  if (ahead_ == nullptr || stream == nullptr) return;
  const PackReader& pack = *file.pack;
  const uint64_t cs = pack.header().chunk_size;
  const int depth = pack.meta().max_depth();
  const uint64_t count = pack.chunks().size();
  // (chunk, how many chunks the reader needs before it); Queue skips what
  // is cached or queued, so chunks listed twice cost nothing.
  std::vector<std::pair<uint64_t, uint64_t>> next;
  for (uint64_t c : stream->Advance(file.id, first, last, count, cs, depth)) next.emplace_back(c, c - last - 1);
  // A reader going through the file in its order (cat, or a loader's
  // last sweep) is served by the stream's window, and its next chunks are
  // offered again each time, for when the cache has no room to spare; one
  // that jumps is expected to go where the file's loader goes next
  // (seal/read_hints.h).
  if (file.order && !stream->InRun()) {
    const uint64_t window = ahead_->WindowChunks(cs, depth);
    uint64_t distance = 0;
    for (uint64_t c : file.order->ChunksAfter(off, cs, count, window)) next.emplace_back(c, distance++);
  } else if (stream->InRun()) {
    for (uint64_t c = last + 1; c < std::min(count, last + 1 + ahead_->threads()); ++c)
      next.emplace_back(c, c - last - 1);
  }
  if (!next.empty()) {
    std::lock_guard lk(mu_);
    std::erase_if(next, [&](const auto& n) { return HandedLocked(file.id, n.first); });
  }
  for (const auto& [index, distance] : next) {
    const ChunkEntry& e = pack.chunks()[index];
    if (e.codec == ChunkCodec::kZero) continue;
    // The pool's load goes around the cache: it runs inside the cache's own
    // load of this key, which waits for nothing but the decode.
    ahead_->Queue(
        ChunkKey{file.id, index}, e.raw_len,
        [store = store_, file, index] {
          Result<ChunkBytes> chunk = store->LoadChunk(*file.pack, file.id, index, nullptr);
          if (chunk.ok()) GlobalMetrics().chunk_decodes_ahead.Add();
          return chunk;
        },
        distance);
  }
}

Status FileContent::ReadSealed(const SealedRange& file, uint64_t off, size_t len, DecodeAhead::Stream* stream,
                               ReadPieces* out) {
  if (off >= file.size || len == 0) return Status::Ok();
  const uint64_t end = std::min<uint64_t>(file.size, off + len);
  const uint64_t cs = file.pack->header().chunk_size;
  DecodeAheadOf(file, off, off / cs, (end - 1) / cs, stream);
  for (uint64_t pos = off; pos < end;) {
    const uint64_t index = pos / cs;
    const uint64_t within = pos - index * cs;
    const ChunkEntry& e = file.pack->chunks().at(index);
    const uint64_t n = std::min<uint64_t>(end - pos, e.raw_len - within);
    if (e.codec == ChunkCodec::kZero) {
      AppendZeros(n, out);  // holes need no decode and no cache space
    } else {
      auto chunk = store_->LoadChunk(*file.pack, file.id, index, cache_);
      if (!chunk.ok()) return Fail(chunk.status(), "read", index * cs);
      if (cache_->NoteRead(ChunkKey{file.id, index}, within, within + n)) {
        std::lock_guard lk(mu_);
        NoteHandedLocked(file.id, index);
      }
      out->iov.push_back(iovec{const_cast<uint8_t*>(chunk.value()->data() + within), n});
      out->held.push_back(std::move(chunk).value());
    }
    pos += n;
  }
  out->size = static_cast<size_t>(end - off);
  return Status::Ok();
}

Result<ReadPieces> FileContent::ReadForReply(uint64_t off, size_t size, DecodeAhead::Stream* stream,
                                             const std::function<std::span<uint8_t>()>& staged_buffer) {
  ReadPieces out;
  std::unique_lock lk(mu_);
  if (RemoteStagedLocked()) return Status::Error(ESTALE, "file is being written on another node");
  if (staging_) {
    // Leased under mu_: a seal may delete the staging file once mu_ is
    // released, and an evicted fd could then not be reopened.
    ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
    lk.unlock();
    const std::span<uint8_t> buf = staged_buffer().first(size);
    ASSIGN_OR_RETURN(out.size, store_->env()->PRead(fd.get(), buf, off));
    out.iov.push_back(iovec{buf.data(), out.size});
    return out;
  }
  if (rec_.object == 0 || off >= rec_.size) return out;
  auto pack = PackLocked();
  if (!pack.ok()) return Fail(pack.status(), "open pack of", off);
  // The read order is looked for on the first read at offset 0 of a new
  // pack, where a loader starts and the chunk is needed anyway.
  const bool find_order = ahead_ != nullptr && stream != nullptr && off == 0 && order_for_ != rec_.object;
  if (find_order) {
    order_for_ = rec_.object;
    order_.reset();
  }
  const SealedRange file{.pack = pack.value(),
                         .id = rec_.object,
                         .size = rec_.size,
                         .order = order_for_ == rec_.object ? order_ : nullptr};
  lk.unlock();
  RETURN_IF_ERROR(ReadSealed(file, off, size, stream, &out));
  if (find_order) FindReadOrder(file);
  return out;
}

void FileContent::FindReadOrder(const SealedRange& file) {
  std::shared_ptr<const ReadOrder> order = LoaderReadOrder(SealedSource(store_, cache_, file.pack, file.id, file.size));
  if (!order) return;
  spdlog::debug("{}: decode-ahead follows the loader's order of {} records", label_, order->size());
  std::lock_guard lk(mu_);
  if (order_for_ == file.id) order_ = std::move(order);
}

Result<size_t> FileContent::Read(uint64_t off, std::span<uint8_t> out) {
  ASSIGN_OR_RETURN(ReadPieces pieces, ReadForReply(off, out.size(), nullptr, [out] { return out; }));
  uint8_t* dst = out.data();
  for (const iovec& v : pieces.iov) {
    if (v.iov_base != dst) std::memcpy(dst, v.iov_base, v.iov_len);
    dst += v.iov_len;
  }
  return pieces.size;
}

Status FileContent::EnsureStagedLocked(uint64_t keep_bytes) {
  if (staging_) return ReopenStubLocked();
  if (RemoteStagedLocked()) return Status::Error(EBUSY, "file is being written on another node");
  Result<Store::Staged> staged = Status::Ok();
  {
    ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
    staged = store_->StageStub(stub.get(), rec_, keep_bytes);
  }
  if (!staged.ok()) return Fail(staged.status(), "stage", 0);
  const StubRecord old = rec_;
  rec_ = staged->rec;
  staging_ = NewStaging(rec_.object, std::move(staged->fd));
  stub_synced_ = staged->stub_synced;
  if (staged->retired != 0) {
    if (retired_ != 0) (void)store_->ReleaseRetired(retired_);
    retired_ = staged->retired;
  }
  if (old.object != 0) cache_->ErasePack(old.object);
  pack_.reset();
  pack_stored_ = 0;
  return Status::Ok();
}

Status FileContent::TooBig(uint64_t end) const {
  return Status::Error(EFBIG, label_ + ": " + std::to_string(end) + " bytes is past the largest file this store seals (" +
                                  std::to_string(store_->max_file_size()) + " bytes)");
}

Status FileContent::CheckWriteEnd(uint64_t off, uint64_t len) const {
  const uint64_t max = store_->max_file_size();
  if (off > max || len > max - off) return TooBig(off + len);
  return Status::Ok();
}

Result<FdCache::Lease> FileContent::BeginWrite() {
  std::lock_guard lk(mu_);
  RETURN_IF_ERROR(EnsureStagedLocked(UINT64_MAX));
  ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
  ++change_gen_;
  ++writes_in_flight_;
  return fd;
}

void FileContent::EndWrite() {
  std::lock_guard lk(mu_);
  --writes_in_flight_;
}

Status FileContent::Truncate(uint64_t size) {
  if (size > store_->max_file_size()) return TooBig(size);
  std::lock_guard lk(mu_);
  if (!staging_ && size == rec_.size) return Status::Ok();
  // Once staged, nothing more is pushed; a push in flight would land after.
  if (page_pushes_ > 0) return Status::Error(EAGAIN, "truncate while pages of the file are being pushed");
  RETURN_IF_ERROR(EnsureStagedLocked(size));
  ++change_gen_;
  ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
  return store_->env()->Ftruncate(fd.get(), size);
}

Status FileContent::Sync() {
  RETURN_IF_ERROR(SyncContent());
  return SyncNewDirEntry();
}

Status FileContent::SyncContent() {
  std::shared_ptr<Staging> sp;
  bool sync_stub = false;
  FdCache::Lease fd;  // taken under mu_, before a seal may delete the file
  {
    std::lock_guard lk(mu_);
    if (!staging_) return Status::Ok();  // a sealed record is fsync'd when sealed
    sp = staging_;
    ASSIGN_OR_RETURN(fd, StagingFd(sp));
    sync_stub = !stub_synced_;
  }
  Env* env = store_->env();
  RETURN_IF_ERROR(env->Fdatasync(fd.get()));
  if (!sync_stub) return Status::Ok();
  // The staging file's name first: a durable stub naming a staging file
  // that a power cut takes away would lose the file's previous content too.
  RETURN_IF_ERROR(store_->SyncStagingDir());
  {
    ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
    RETURN_IF_ERROR(env->Fsync(stub.get()));
  }
  std::lock_guard lk(mu_);
  if (staging_ == sp) stub_synced_ = true;
  return Status::Ok();
}

void FileContent::MarkCreated() {
  std::lock_guard lk(mu_);
  dir_entry_synced_ = false;
}

Status FileContent::SyncNewDirEntry() {
  {
    std::lock_guard lk(mu_);
    if (dir_entry_synced_) return Status::Ok();
  }
  // The directory it is in now (it may have been renamed since creation).
  {
    ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
    RETURN_IF_ERROR(store_->SyncDirectoryOf(stub.get()));
  }
  std::lock_guard lk(mu_);
  dir_entry_synced_ = true;
  return Status::Ok();
}

Status FileContent::SetTimes(const struct timespec times[2]) {
  std::lock_guard lk(mu_);
  Env* env = store_->env();
  {
    ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
    RETURN_IF_ERROR(env->Futimens(stub.get(), times));
  }
  if (!staging_) return Status::Ok();
  ++change_gen_;  // a seal in progress copied the old mtime: make it retry
  ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
  return env->Futimens(fd.get(), times);
}

FileContent::PushHold FileContent::OnOpen(bool writable) {
  std::lock_guard lk(mu_);
  ++open_handles_;
  if (writable) ++open_writers_;  // no new page push from here on
  // A readable open waits only when it drops the kernel's pages: a push of
  // the old version landing after the drop would bring them back.
  if (page_pushes_ == 0 || !(writable || drop_cache_)) return PushHold();
  ++push_holds_;
  return PushHold(shared_from_this(), true);
}

FileContent::PushHold FileContent::HoldPagePushes() {
  std::lock_guard lk(mu_);
  ++push_holds_;
  return PushHold(shared_from_this(), page_pushes_ > 0);
}

FileContent::PushHold& FileContent::PushHold::operator=(PushHold&& o) noexcept {
  if (this != &o) {
    Drop();
    content_ = std::exchange(o.content_, nullptr);
    must_wait_ = std::exchange(o.must_wait_, false);
  }
  return *this;
}

void FileContent::PushHold::Wait() {
  if (!content_) return;
  std::unique_lock lk(content_->mu_);
  content_->pushed_cv_.wait(lk, [&] { return content_->page_pushes_ == 0; });
  must_wait_ = false;
}

void FileContent::PushHold::Drop() {
  if (!content_) return;
  {
    std::lock_guard lk(content_->mu_);
    --content_->push_holds_;
  }
  content_.reset();
  must_wait_ = false;
}

uint64_t FileContent::BeginPagePush(ObjectId pack) {
  std::lock_guard lk(mu_);
  if (staging_ || !pack_ || rec_.object != pack || open_writers_ > 0 || writes_in_flight_ > 0 || push_holds_ > 0)
    return 0;
  ++page_pushes_;
  return pack_->header().chunk_size;
}

void FileContent::EndPagePush(ObjectId pack, uint64_t index, bool whole) {
  std::lock_guard lk(mu_);
  if (whole) NoteHandedLocked(pack, index);
  if (--page_pushes_ == 0) pushed_cv_.notify_all();
}

void FileContent::NoteHandedLocked(ObjectId pack, uint64_t index) {
  if (!pack_ || rec_.object != pack || index >= pack_->chunks().size()) return;
  if (handed_for_ != pack) {
    handed_for_ = pack;
    handed_.assign((pack_->chunks().size() + 63) / 64, 0);
  }
  handed_[index / 64] |= uint64_t{1} << (index % 64);
}

bool FileContent::HandedLocked(ObjectId pack, uint64_t index) const {
  return handed_for_ == pack && index / 64 < handed_.size() && (handed_[index / 64] >> (index % 64) & 1);
}

bool FileContent::OnRelease(bool writable) {
  std::lock_guard lk(mu_);
  --open_handles_;
  if (writable) --open_writers_;
  released_cv_.notify_all();
  // An idle file holds no pack fds (a read in flight keeps its own reference).
  if (open_handles_ == 0) pack_.reset();
  MaybeReleaseObjectsLocked();
  return NeedsSealLocked();
}

SealTarget::SealClass FileContent::ClassForSeal() {
  SealClass cls;
  Env* env = store_->env();
  cls.owner = owner_uid();
  std::shared_ptr<Staging> sp;
  {
    std::lock_guard lk(mu_);
    sp = staging_;
  }
  if (!sp) return cls;  // nothing to seal: done at once
  // Data bytes, not the size: holes cost a seal nothing (store/pack.h).
  Result<FdCache::Lease> fd = StagingFd(sp);
  if (!fd.ok()) return cls;
  if (Result<struct stat> st = env->Fstat(fd->get()); st.ok()) {
    const uint64_t data = static_cast<uint64_t>(st->st_blocks) * 512;
    cls.small = data <= kSmallSealBytes && static_cast<uint64_t>(st->st_size) <= kSmallSealSize;
  }
  return cls;
}

bool FileContent::NeedsSeal() {
  std::lock_guard lk(mu_);
  return NeedsSealLocked();
}

Status FileContent::SealForLossyRead() {
  {
    std::lock_guard lk(mu_);
    if (!staging_ || unlinked_) return Status::Ok();
  }
  if (FidelityFor() <= 0) return Status::Ok();
  {
    // close() returns before the kernel's RELEASE of the writer's handle
    // reaches the daemon: give a writer that just closed the file time to
    // be counted out, or this reader would see the bytes as written.
    std::unique_lock lk(mu_);
    released_cv_.wait_for(lk, kReleaseGrace, [&] { return open_writers_ == 0 || !staging_ || unlinked_; });
    if (!staging_ || open_writers_ > 0 || unlinked_) return Status::Ok();
  }
  Status s = SealIfIdle(/*reader_waits=*/true);
  // EAGAIN: a writer came back meanwhile; the reader sees the file as written.
  return s.code() == EAGAIN ? Status::Ok() : s;
}

bool FileContent::ReadableBeforeLossySeal(uint64_t off, uint64_t length) {
  std::shared_ptr<Staging> sp;
  Result<FdCache::Lease> fd = Status::Error(EBADF, "not staged");
  uint64_t gen = 0;
  std::optional<uint64_t> tail;  // known for this generation
  {
    // As in SealForLossyRead: the writer's RELEASE may trail its close().
    std::unique_lock lk(mu_);
    released_cv_.wait_for(lk, kReleaseGrace, [&] { return open_writers_ == 0 || !staging_ || unlinked_; });
    if (!staging_ || unlinked_ || open_writers_ > 0 || writes_in_flight_ > 0) return false;
    if (tail_gen_ == change_gen_) {
      if (off >= tail_start_) return true;
      tail = tail_start_;
    }
    sp = staging_;
    gen = change_gen_;
    fd = StagingFd(sp);  // under mu_, before a seal may delete the file
  }
  if (!fd.ok()) return false;
  Env* env = store_->env();
  Result<struct stat> st = env->Fstat(fd->get());
  if (!st.ok()) return false;
  const EnvSource staged(env, fd->get(), static_cast<uint64_t>(st->st_size));
  const bool known = tail.has_value();
  if (!known) tail = ReadableBeforeSealFrom(staged).value_or(UINT64_MAX);
  const bool readable = off >= *tail || PagesReadableBeforeSeal(staged, off, length);
  std::lock_guard lk(mu_);
  // A write since the look may have changed the nodes: the next read looks again.
  if (change_gen_ != gen || staging_ != sp || open_writers_ > 0 || writes_in_flight_ > 0) return false;
  if (!known) {
    tail_gen_ = gen;
    tail_start_ = *tail;
  }
  return readable;
}

bool FileContent::TakeCacheDrop() {
  std::lock_guard lk(mu_);
  return std::exchange(drop_cache_, false);
}

bool FileContent::LossySealPending() {
  {
    std::lock_guard lk(mu_);
    if (!staging_ || unlinked_) return false;
  }
  return FidelityFor() > 0;
}

Status FileContent::SealIfIdle(bool reader_waits, bool may_postpone) {
  std::lock_guard seal(seal_mu_);
  std::unique_lock lk(mu_);
  if (!staging_ || open_writers_ > 0 || unlinked_) return Status::Ok();
  const uint64_t gen = change_gen_;
  const StubRecord staged = rec_;
  const std::shared_ptr<Staging> sp = staging_;
  // Under mu_: once it is released, an unlink may free the staging file.
  auto stub = Stub();
  auto staging = StagingFd(sp);
  lk.unlock();
  if (!stub.ok() || !staging.ok()) return Fail(stub.ok() ? staging.status() : stub.status(), "seal", 0);
  if (postponed_gen_ != gen) postponed_since_.reset();  // a new version waits afresh
  if (!postponed_since_ || reader_waits)
    spdlog::debug("sealing {}{}", label_, reader_waits ? " (a reader waits for it)" : "");
  const SealWait wait{.may_postpone = may_postpone && !reader_waits,
                      .since = postponed_since_.value_or(std::chrono::steady_clock::now())};

  // still_current takes the lock and keeps it when it answers yes, so no
  // write can slip in between that check and the switch of the stub.
  std::unique_lock commit(mu_, std::defer_lock);
  auto still_current = [&] {
    commit.lock();
    if (change_gen_ == gen && writes_in_flight_ == 0 && open_writers_ == 0 && !unlinked_ && staging_ == sp) return true;
    commit.unlock();
    return false;
  };
  auto sealed = store_->SealStub(stub->get(), staged, staging->get(), still_current, wait, &seal_cancel_);
  if (!sealed.ok() && sealed.status().code() == ECANCELED && seal_cancel_.load()) {
    spdlog::debug("seal of {} cancelled: the file was deleted", label_);
    return Status::Ok();
  }
  if (!sealed.ok() && sealed.status().code() == kSealPostponed && !commit.owns_lock()) {
    postponed_since_ = wait.since;
    postponed_gen_ = gen;
    return sealed.status();
  }
  if (!commit.owns_lock()) {
    if (sealed.ok() || sealed.status().code() == EAGAIN) return sealed.ok() ? Status::Ok() : sealed.status();
    return Fail(sealed.status(), "seal", 0);
  }
  if (sealed.ok()) {
    rec_ = sealed.value();
  } else {
    // Failed after the commit point: trust what the stub on disk says.
    auto now = ReadStub(store_->env(), stub->get());
    if (!now.ok() || now->state == StubState::kStaged) return Fail(sealed.status(), "seal", 0);
    rec_ = now.value();
  }
  if (retired_ != 0) {
    (void)store_->ReleaseRetired(retired_);
    retired_ = 0;
  }
  staging_.reset();
  pack_.reset();
  pack_stored_ = 0;
  stub_synced_ = true;
  drop_cache_ = true;
  return Status::Ok();
}

void FileContent::MarkUnlinked() {
  stub_.KeepOpen();
  std::lock_guard lk(mu_);
  unlinked_ = true;
  seal_cancel_.store(true);
  MaybeReleaseObjectsLocked();
}

void FileContent::MarkForgotten() {
  std::lock_guard lk(mu_);
  if (inodes_ > 0) --inodes_;
  MaybeReleaseObjectsLocked();
}

bool FileContent::Reattach(dev_t dev, ino_t ino) {
  std::lock_guard lk(mu_);
  if (unlinked_ || released_) return false;
  auto stub = Stub();
  if (!stub.ok()) return false;
  auto st = store_->env()->Fstat(stub->get());
  if (!st.ok() || st->st_nlink == 0 || st->st_dev != dev || st->st_ino != ino) return false;
  ++inodes_;
  return true;
}

void FileContent::MaybeReleaseObjectsLocked() {
  // An open racing a rename or unlink may hold the inode from its LOOKUP
  // and not yet have sent its OPEN: only the kernel's FORGET says that no
  // such open can come any more.
  if (!unlinked_ || inodes_ > 0 || open_handles_ > 0 || released_) return;
  released_ = true;
  if (retired_ != 0) {
    (void)store_->ReleaseRetired(retired_);
    retired_ = 0;
  }
  Status st = store_->ReleaseStubObjects(rec_);
  if (!st.ok()) {
    spdlog::warn("freeing objects of deleted {}: {} (recovery will collect them)", label_, LogSafe(st.message()));
  }
  if (rec_.state == StubState::kSealed && rec_.object != 0) cache_->ErasePack(rec_.object);
  staging_.reset();
  pack_.reset();
}

}  // namespace ckptfs

namespace ckptfs {

Status FileContent::Refresh() {
  if (!store_->cluster()) return Status::Ok();
  std::lock_guard lk(mu_);
  // No wait for this version's pushes in flight (it may run on a FUSE
  // thread): none start after the switch (pack_ is reset), and the open
  // that drops the old pages (drop_cache_) waits for them (OnOpen).
  if (staging_ || open_handles_ > 0 || writes_in_flight_ > 0 || unlinked_) return Status::Ok();
  StubRecord now;
  {
    ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
    ASSIGN_OR_RETURN(now, ReadStub(store_->env(), stub.get()));
  }
  if (now == rec_) return Status::Ok();
  if (now.state == StubState::kStaged && now.node == store_->node_id()) {
    // Ours: only recovery leaves one, and it seals them. Serve it as Load does.
    ASSIGN_OR_RETURN(UniqueFd fd, store_->OpenStaging(now.object));
    staging_ = NewStaging(now.object, std::move(fd));
  }
  rec_ = now;
  pack_.reset();
  pack_stored_ = 0;
  drop_cache_ = true;  // the kernel's pages are of the old version
  return Status::Ok();
}

bool FileContent::HiddenHere() {
  uint64_t node = 0;
  {
    std::lock_guard lk(mu_);
    if (!RemoteStagedLocked()) return false;
    if (!rec_.closed) return true;
    node = rec_.node;
  }
  // Closed on a node that died before sealing it: its bytes are on that
  // node's disk until it remounts, so the file is not there yet.
  return !store_->NodeAlive(node);
}

Status FileContent::WaitUntilServable() {
  if (!store_->cluster()) return Status::Ok();
  const auto deadline = std::chrono::steady_clock::now() + kRemoteSealWait;
  for (;;) {
    RETURN_IF_ERROR(Refresh());
    uint64_t node = 0;
    {
      std::lock_guard lk(mu_);
      if (!RemoteStagedLocked()) return Status::Ok();
      if (!rec_.closed) return Status::Error(ENOENT, "file is being written on another node");
      node = rec_.node;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Error(EAGAIN, "another node closed this file but has not sealed it yet");
    }
    // NodeAlive reads the membership records at most once a second.
    if (!store_->NodeAlive(node)) {
      return Status::Error(ENOENT,
                           "the node that wrote this file went down before sealing it; the file comes "
                           "back when that node mounts again");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Status FileContent::OnFlush() {
  if (!store_->cluster()) return Status::Ok();
  std::lock_guard lk(mu_);
  if (!staging_ || rec_.closed) return Status::Ok();
  ASSIGN_OR_RETURN(FdCache::Lease fd, StagingFd(staging_));
  ASSIGN_OR_RETURN(struct stat st, store_->env()->Fstat(fd.get()));
  ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
  ASSIGN_OR_RETURN(rec_, store_->MarkStubClosed(stub.get(), rec_, static_cast<uint64_t>(st.st_size)));
  return Status::Ok();
}

Status FileContent::ReopenStubLocked() {
  if (!rec_.closed) return Status::Ok();
  ASSIGN_OR_RETURN(FdCache::Lease stub, Stub());
  ASSIGN_OR_RETURN(rec_, store_->MarkStubOpen(stub.get(), rec_));
  return Status::Ok();
}

}  // namespace ckptfs
