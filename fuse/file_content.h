// FileContent: the bytes of one regular file, whichever state they are in.
//   sealed: a pack, read through the decoded-chunk cache;
//   staged: a plain staging file that writes go to and reads come from.
// The first write (or size change) to a sealed file stages it; the seal
// queue turns it back into a pack once no writer has it open.
// One FileContent per backing inode, so hard links share it.
#pragma once

#include <sys/stat.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "cache/chunk_cache.h"
#include "cache/decode_ahead.h"
#include "cache/read_order.h"
#include "fuse/fd_cache.h"
#include "fuse/seal_queue.h"
#include "store/pack.h"
#include "store/store.h"
#include "store/stub.h"

namespace ckptfs {

// The bytes of one read, for fuse_reply_iov: pieces of decoded chunks in the
// cache, which `held` keeps alive until the reply is sent, of a static
// block of zeros for holes, or of the caller's buffer for a staged file.
struct ReadPieces {
  std::vector<iovec> iov;
  std::vector<ChunkBytes> held;
  size_t size = 0;
};

class FileContent : public SealTarget, public std::enable_shared_from_this<FileContent> {
 public:
  // Keeps new page pushes (BeginPagePush) out of the file while it lives,
  // for a request that must not be answered before the pushes in flight
  // have landed: a page pushed after a write or a truncate would put old
  // bytes back, and one pushed after an open dropped the kernel's pages of
  // an old version would bring them back. Such a request waits (Wait) off
  // the FUSE threads (fuse/deferred_ops.h): a push may wait for a read in
  // flight, which needs a FUSE thread to be answered.
  class PushHold {
   public:
    PushHold() = default;  // holds nothing
    PushHold(PushHold&& o) noexcept
        : content_(std::exchange(o.content_, nullptr)), must_wait_(std::exchange(o.must_wait_, false)) {}
    PushHold& operator=(PushHold&& o) noexcept;
    ~PushHold() { Drop(); }
    // Pushes were in flight when it was taken.
    bool must_wait() const { return must_wait_; }
    // Blocks until no push of the file is in flight; none can start meanwhile.
    void Wait();

   private:
    friend class FileContent;
    PushHold(std::shared_ptr<FileContent> content, bool must_wait)
        : content_(std::move(content)), must_wait_(must_wait) {}
    void Drop();
    std::shared_ptr<FileContent> content_;  // null: holds nothing
    bool must_wait_ = false;
  };

  // The stub opened O_RDWR, kept in `fds` while idle and reopened with
  // `reopen` once evicted (null: kept open while the content lives).
  struct StubFd {
    FdCache* fds = nullptr;
    UniqueFd fd;
    FdCache::Reopen reopen;
  };
  // label: how log lines name the file.
  // ahead: decodes chunks ahead of sequential readers (null: none).
  static Result<std::shared_ptr<FileContent>> Load(Store* store, ChunkCache* cache, StubFd stub, std::string label,
                                                   DecodeAhead* ahead = nullptr);

  // Fills size, blocks and (when staged) mtime/ctime into a stat of the stub.
  Status FillStat(struct stat* st);
  Result<size_t> Read(uint64_t off, std::span<uint8_t> out);
  // A read of up to `size` bytes without copying decoded chunks. `stream`
  // (may be null) is the handle's, for decode-ahead; a staged file is read
  // into staged_buffer(), which must give at least `size` bytes.
  Result<ReadPieces> ReadForReply(uint64_t off, size_t size, DecodeAhead::Stream* stream,
                                  const std::function<std::span<uint8_t>()>& staged_buffer);
  // A write, in two halves, because libfuse moves the bytes itself (spliced
  // from /dev/fuse when it can): BeginWrite stages the file and leases the
  // staging fd, to be dropped before EndWrite.
  Result<FdCache::Lease> BeginWrite();
  void EndWrite();
  // EFBIG when a write would end past Store::max_file_size().
  Status CheckWriteEnd(uint64_t off, uint64_t len) const;
  // Never waits: the caller keeps page pushes out and waits for those in
  // flight first (HoldPagePushes, or the writable open's OnOpen); EAGAIN if
  // one is still in flight.
  Status Truncate(uint64_t size);
  // Makes everything written so far durable (fsync/fdatasync semantics),
  // and, for a file created by this daemon, its directory entry too.
  Status Sync();
  // The file was created through this mount: the first Sync also fsyncs
  // its directory, as a new file's name is not durable before that.
  void MarkCreated();
  // Applies times to the stub and, while staged, to the staging file too,
  // because a staged file reports the staging file's mtime.
  Status SetTimes(const struct timespec times[2]);

  // Handle bookkeeping (the pack's fds are held while a handle is open,
  // and closed after the last one goes). OnOpen counts the handle at once and never waits;
  // a writable handle keeps page pushes out until it is released. The open
  // must not be answered before the pushes in flight have landed when it is
  // writable, or when it will drop the kernel's pages (TakeCacheDrop): the
  // hold returned then says must_wait, and keeps pushes out until then.
  // OnRelease returns true when the caller should queue a seal.
  [[nodiscard]] PushHold OnOpen(bool writable);
  bool OnRelease(bool writable);
  // For a truncate without a writable handle: keeps pushes out while the
  // hold lives; must_wait if some are in flight.
  [[nodiscard]] PushHold HoldPagePushes();
  // Seals if staged and idle. Called from the seal queue. Returns EAGAIN
  // when the file changed meanwhile (a later release will queue it again).
  // `reader_waits`: a reader is blocked on it (it jumped the seal queue).
  // `may_postpone`: a seal that would wait for more of its save returns
  // kSealPostponed instead (store/store.h, SealWait); its waits' bounds
  // count from its first try.
  // A seal of a file whose last link is gone is cancelled (MarkUnlinked)
  // and returns Ok, as if there was nothing to seal.
  Status SealIfIdle(bool reader_waits = false, bool may_postpone = false) override;
  bool NeedsSeal() override;
  // The stub's owner, and whether the staging file is small (seal_queue.h).
  SealClass ClassForSeal() override;
  // Whether a lossy policy will rewrite this staged file's bytes when it is
  // sealed: a handle opened for reading then seals it before its first read.
  bool LossySealPending();
  // Under a lossy policy, a handle opened for reading seals an idle staged
  // file before its first read (on the reader's thread, ahead of the seal
  // queue), so that no reader sees the raw bytes and later the
  // reconstruction. The open itself does not wait: an open to fsync, or to
  // read nothing, never waits for a lossy seal.
  Status SealForLossyRead();
  // Whether a read of [off, off + length) may be served before that seal:
  // the file is closed and the range lies within bytes its seal leaves as
  // they are (seal/read_hints.h says which). A writer may read its closed
  // file back before it writes what the seal waits for.
  bool ReadableBeforeLossySeal(uint64_t off, uint64_t length);
  // A seal may have changed the bytes (lossy mode) behind pages the kernel
  // cached while the file was written: true once after each seal, telling
  // the next open to drop them.
  bool TakeCacheDrop();
  // For PagePush: whether bytes of pack `pack` may go into the kernel's
  // page cache of this file now, i.e. they are its sealed content and no
  // handle may write it, and no PushHold keeps pushes out. If so, returns
  // the pack's chunk size and counts a push in flight until EndPagePush;
  // else 0.
  uint64_t BeginPagePush(ObjectId pack);
  // `whole`: every byte of chunk `index` not replied before is now in the
  // kernel's page cache.
  void EndPagePush(ObjectId pack, uint64_t index, bool whole);
  // The objects (pack, staging file) are freed once all three hold: the
  // last link is gone (MarkUnlinked), the kernel forgot the inode and no
  // handle is left on it (MarkForgotten, from InodeTable), and no handle is
  // open here. Until then the file reads and writes as before, like an
  // open, unlinked file on a local file system.
  // MarkUnlinked also keeps the stub's fd open from then on: with no name
  // left, the file may not be reachable by handle again.
  void MarkUnlinked();
  void MarkForgotten();
  // A new Inode of the same file takes over this content, which the seal
  // queue kept alive after the previous Inode was forgotten: one
  // FileContent per file, always. False when the content cannot be reused
  // (its file is gone, or the backing inode is not `dev`/`ino`).
  bool Reattach(dev_t dev, ino_t ino);

  // Cluster mode (docs/SEMANTICS.md "Cluster mode"). Another node may
  // have changed the stub: Refresh re-reads it when nothing here holds the
  // content (no handle, no staging), so an open sees the newest close.
  // It does not wait for the old version's page pushes in flight: the next
  // open drops the kernel's pages, and OnOpen makes it wait for them first.
  Status Refresh();
  // Staged on another node and not yet closed there: not visible here.
  bool HiddenHere();
  // An open: refreshes, and for a file another node closed but has not
  // sealed yet, waits for the seal (up to kRemoteSealWait, failing early if
  // that node's lease runs out). ENOENT for a file still being written there.
  Status WaitUntilServable();
  // The close of a writable handle (FLUSH): marks a staged stub closed with
  // its final size, so other nodes wait for its seal instead of hiding it.
  Status OnFlush();

  const std::string& label() const override { return label_; }
  // The file's owner, whose uid keys the rate limit of its log lines
  // (kLogAnyUid when the stub cannot be read).
  uint32_t owner_uid();

 private:
  struct Staging {
    ObjectId id = 0;
    FdCache::Slot fd;  // O_RDWR, reopened by id once evicted
  };

  FileContent(Store* store, ChunkCache* cache, DecodeAhead* ahead, FdCache* fds, std::string label)
      : store_(store), cache_(cache), ahead_(ahead), fds_(fds), label_(std::move(label)) {}

  std::shared_ptr<Staging> NewStaging(ObjectId id, UniqueFd fd);
  // Leases of the stub's and a staging file's fds (the latter keeps `sp` alive).
  Result<FdCache::Lease> Stub() { return stub_.Take(); }
  static Result<FdCache::Lease> StagingFd(const std::shared_ptr<Staging>& sp) { return sp->fd.Take(sp); }
  // The fidelity the policy over the stub asks for (0: lossless, also when
  // the stub cannot be reached).
  double FidelityFor();

  Status EnsureStagedLocked(uint64_t keep_bytes);
  Status SyncContent();
  Status SyncNewDirEntry();
  Result<std::shared_ptr<PackReader>> PackLocked();
  struct SealedRange {
    std::shared_ptr<PackReader> pack;
    ObjectId id = 0;
    uint64_t size = 0;                       // of the file
    std::shared_ptr<const ReadOrder> order;  // how readers visit it, if not in file order
  };
  Status ReadSealed(const SealedRange& file, uint64_t off, size_t len, DecodeAhead::Stream* stream, ReadPieces* out);
  void DecodeAheadOf(const SealedRange& file, uint64_t off, uint64_t first, uint64_t last, DecodeAhead::Stream* stream);
  // Looks, once per pack, for the order the file's loader reads it in.
  void FindReadOrder(const SealedRange& file);
  void MaybeReleaseObjectsLocked();
  bool NeedsSealLocked() const { return open_writers_ == 0 && staging_ && !unlinked_; }
  bool RemoteStagedLocked() const { return rec_.state == StubState::kStaged && rec_.node != store_->node_id(); }
  // A write or size change after a FLUSH marked the stub closed.
  Status ReopenStubLocked();

  Status Fail(const Status& st, const char* what, uint64_t off);
  Status TooBig(uint64_t end) const;

  Store* const store_;
  ChunkCache* const cache_;
  DecodeAhead* const ahead_;
  FdCache* const fds_;
  FdCache::Slot stub_;
  const std::string label_;

  // How long a lossy read waits for a writer's pending RELEASE.
  static constexpr std::chrono::seconds kReleaseGrace{2};
  // How long an open waits for another node's seal of a closed file.
  static constexpr std::chrono::seconds kRemoteSealWait{600};

  std::mutex seal_mu_;  // one seal at a time (seal queue, lossy reads)
  // Under seal_mu_: when the first postponed try of this version began.
  std::optional<std::chrono::steady_clock::time_point> postponed_since_;
  uint64_t postponed_gen_ = 0;
  std::condition_variable released_cv_;  // a handle was released (mu_)
  std::condition_variable pushed_cv_;    // a page push ended (mu_)
  std::mutex mu_;
  StubRecord rec_;
  std::shared_ptr<Staging> staging_;  // set iff rec_.state == kStaged
  std::shared_ptr<PackReader> pack_;  // opened lazily when sealed
  // The read order of pack order_for_ (0: not looked for yet), null if the
  // file is read in file order (FindReadOrder).
  std::shared_ptr<const ReadOrder> order_;
  ObjectId order_for_ = 0;
  uint64_t pack_stored_ = 0;  // stored bytes of the pack, 0 if unknown
  uint64_t change_gen_ = 0;   // bumped by every write/truncate
  int writes_in_flight_ = 0;
  int open_handles_ = 0;
  int open_writers_ = 0;
  int page_pushes_ = 0;  // BeginPagePush without its EndPagePush
  int push_holds_ = 0;   // PushHolds alive
  // A bit per chunk of pack handed_for_ whose every byte the kernel got,
  // replied or pushed: decode-ahead skips those, as the kernel serves them
  // (unless it drops them, and then the reader's own read decodes).
  std::vector<uint64_t> handed_;
  ObjectId handed_for_ = 0;
  void NoteHandedLocked(ObjectId pack, uint64_t index);
  bool HandedLocked(ObjectId pack, uint64_t index) const;
  bool stub_synced_ = false;      // stub record durable since last staging
  bool dir_entry_synced_ = true;  // false from creation until the first Sync
  bool unlinked_ = false;
  // Set with unlinked_: a seal in progress stops at its next chunk, since
  // an unlinked file is never sealed (its result would be thrown away).
  std::atomic<bool> seal_cancel_{false};
  int inodes_ = 1;  // Inodes holding this content that the kernel has not forgotten
  bool released_ = false;
  bool drop_cache_ = false;  // sealed since the kernel last cached pages
  // ReadableBeforeLossySeal's look at the staged bytes as of change_gen_
  // tail_gen_: where a B+tree node ending them starts (UINT64_MAX: none).
  uint64_t tail_gen_ = UINT64_MAX;
  uint64_t tail_start_ = UINT64_MAX;
  ObjectId retired_ = 0;  // the previous version while this one is rewritten (Store::RetirePack)
};

}  // namespace ckptfs
