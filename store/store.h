// Store: the backing directory. Layout (docs/FORMAT.md, "Store layout"):
//   BACKING/CKPTFS        superblock: JSON with format name and version
//   BACKING/LOCK          flock'd by the one daemon that serves the store
//   BACKING/ns/           namespace mirror: dirs, symlinks, stubs (store/stub.h)
//   BACKING/packs/XX/ID.pack   sealed file versions, XX = first 2 hex digits of ID
//                         (or objects ID.pack in a RADOS pool: store/pack_objects.h)
//   BACKING/staging/ID.stage   bytes of files being written (plain sparse files)
//   BACKING/tmp/          packs being written; emptied by recovery
// Publishing a pack: write tmp/ID.pack.tmp, fdatasync, rename into packs/XX/,
// fsync packs/XX/ (in RADOS: write the object, marked complete last). A
// stub is switched to the pack only after that.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "cache/chunk_cache.h"
#include "codec/chunk_codec.h"
#include "codec/lossy/lossy_info.h"
#include "codec/lossy/policy.h"
#include "codec/lossy/siblings.h"
#include "store/cluster_options.h"
#include "base/env.h"
#include "store/cluster/membership.h"
#include "store/object_id.h"
#include "store/pack.h"
#include "store/pack_index.h"
#include "store/pack_objects.h"
#include "store/cluster/rados_client.h"
#include "store/same_input.h"
#include "store/seal_plan.h"
#include "store/stub.h"

namespace ckptfs {

// The newest store format this build reads. Version 2 is a store shared by
// several nodes (cluster mode); single-node stores are still written as 1.
inline constexpr int kStoreFormatVersion = 2;
inline constexpr int kSingleNodeStoreVersion = 1;

struct StoreOptions {
  bool create_if_missing = true;  // initialise an empty (or absent) directory
  bool take_lock = true;          // false for read-only tools (stats, fsck)
  uint32_t chunk_size = kDefaultChunkSize;
  ChunkEncoderOptions encoder;
  // Says how each sealed file is coded (store/seal_plan.h); null seals
  // every file as generic bytes. A mount, import and recode pass
  // seal/seal_planner.h's FormatSealPlanner(); it must outlive the store.
  const SealPlanner* planner = nullptr;
  // Store chunks against live packs: identical chunks as references, and
  // checkpoints as deltas against their predecessor (store/delta_planner.h).
  bool delta = true;
  // Longest delta chain; the next version of a chunk is a keyframe (0: no
  // deltas, dedup only).
  uint32_t keyframe_every = 8;
  // Threads that code one file's chunks at the same time when it is sealed
  // (a lossy zip's CRC pass runs before, on one). Each holds a chunk in, a
  // chunk out and its codec buffers: about 5 chunk sizes.
  unsigned seal_workers = 1;
  // Delete unneeded packs on a background thread (the daemon), so that an
  // unlink never waits for a cascade of pack deletions; otherwise inline.
  bool background_gc = false;
  // Read packs' chunks with O_DIRECT (store/direct_read.h) where the file
  // system allows it; false: through the page cache.
  bool direct_pack_reads = true;
  // Lossy mode (codec/lossy/policy.h): the fidelity files get unless a
  // directory's user.ckptfs.policy says otherwise; 0 is lossless.
  double lossy = 0;
  // With it, the one-step measure's budget C (LossyPolicy::step_budget); 0: relative error only.
  double lossy_steps = 0;
  // What it may quantize (codec/lossy/roles.h).
  lossy::LossyScope lossy_scope = lossy::LossyScope::kModels;
  // Longest chain of lossy chunks, each predicted from the last one's
  // reconstruction; the next is a keyframe.
  uint32_t lossy_keyframe_every = 32;
  // Several nodes' daemons on one store (store/cluster_options.h).
  ClusterOptions cluster;
  // How a store with packs in RADOS reaches its pool; empty: librados
  // (ConnectLibrados). Tests put a fake pool here.
  RadosConnector connect_rados;
  // A testing aid (-o seal_hold=PATH): a seal, once it has picked and
  // pinned its bases and coded the pack, waits while PATH exists before it
  // publishes, so a test can run cluster GC against a seal in flight.
  std::string seal_hold;
};

class BaseAdmission;
class ByteSource;
class SealPin;

// How a seal may wait for other files of its save (codec/lossy/siblings.h).
struct SealWait {
  // Give the seal slot back instead of waiting: the seal fails with
  // kSealPostponed while more of the save can come, and is tried again.
  bool may_postpone = false;
  // When the first try began: the bounds on the waits span the tries.
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};
struct ClusterGcReport;
struct ClusterGcOptions;

struct RecoveryReport {
  uint64_t stubs_scanned = 0;
  uint64_t staged_resealed = 0;       // STAGED stubs whose staging file was sealed
  uint64_t tmp_files_removed = 0;     // unpublished packs from an interrupted seal
  uint64_t orphan_packs_removed = 0;  // packs no file needs, directly or as a base
  uint64_t orphan_staging_removed = 0;
  uint64_t broken_stubs = 0;         // unreadable stubs (left in place, fsck reports)
  std::vector<std::string> actions;  // one human line per thing done
  // Objects whose references could not be established, each "where: what
  // is wrong" (a stub, a pack's header, table or meta block, a missing pack
  // or base, a directory that cannot be listed). When there are any,
  // nothing was swept: no pack and no staging file was deleted.
  std::vector<std::string> unreadable;
  bool swept() const { return unreadable.empty(); }
};

struct FsckReport {
  uint64_t files_checked = 0;
  uint64_t packs_checked = 0;
  uint64_t chunks_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<std::string> errors;    // each names the path and what is wrong
  std::vector<std::string> warnings;  // not corruption (e.g. orphan packs)
  bool clean() const { return errors.empty(); }
};

// The chunks of one codec in a file's own pack.
struct CodecUsage {
  ChunkCodec codec = ChunkCodec::kRaw;
  uint64_t chunks = 0;
  uint64_t raw = 0;     // logical bytes they hold
  uint64_t stored = 0;  // their payloads in the pack
};

struct FileUsage {
  std::string path;  // relative to the namespace root
  uint64_t logical = 0;
  uint64_t stored = 0;  // the file's own pack: what it added to the store
  bool staged = false;
  ObjectId pack = 0;
  ObjectId base = 0;               // the pack most of its stored-against chunks name (0: none)
  uint8_t depth = 0;               // longest delta chain a read of it decodes
  std::optional<LossyInfo> lossy;  // sealed under a lossy policy: what it did
  std::vector<CodecUsage> codecs;  // sealed files: per codec, in ChunkCodec order
};

// A model file and its optimizer file belong to the same save when their
// last writes are at most this far apart (Store::SiblingsOf). A
// trainer writes them back to back, so the gap is the time to write one of
// them (about 140 s for 140 GB at 1 GB/s); successive saves into one
// directory are usually further apart, and an optimizer file left from an
// earlier save holds another step's moments.
inline constexpr int64_t kSaveWindowSeconds = 300;

class Store : public BaseSource {
 public:
  ~Store() override;
  static Result<std::unique_ptr<Store>> Open(Env* env, const std::string& backing, const StoreOptions& opts);

  Env* env() const { return env_; }
  const std::string& path() const { return path_; }
  const StoreOptions& options() const { return opts_; }
  int ns_fd() const { return ns_.get(); }
  // The largest file a pack of this store holds (kMaxPackChunks chunks):
  // a write or truncate past it fails with EFBIG.
  uint64_t max_file_size() const { return uint64_t{opts_.chunk_size} * kMaxPackChunks; }
  int root_fd() const { return root_.get(); }
  // What Open tightened to make the store private (store/private_store.h),
  // one line each, for the daemon's log.
  const std::vector<std::string>& made_private() const { return made_private_; }
  // Writes this process's pid into LOCK (after the daemon forks); in
  // cluster mode, into the membership record, and starts renewing it.
  Status RecordOwnerPid();
  // Cluster mode: the store is shared by several nodes' daemons.
  bool cluster() const { return opts_.cluster.enabled; }
  // What stubs staged here record (0 in a single-node store).
  uint64_t node_id() const { return node_id_; }
  const std::string& node_name() const { return opts_.cluster.node; }
  // Writes `rec` with `closed` set (cluster mode: the writer closed the file,
  // its size is final) and makes it visible to other nodes.
  Result<StubRecord> MarkStubClosed(int stub_fd, const StubRecord& rec, uint64_t size);
  // Writes `rec` with `closed` cleared (a write after a close).
  Result<StubRecord> MarkStubOpen(int stub_fd, const StubRecord& rec);
  // Cluster mode: adds to the pack index the packs other nodes published
  // since the last look (at most once a second), so that a file finds its
  // predecessor whichever node wrote it.
  void RefreshIndexFromOtherNodes();
  // Cluster mode: whether the stub `name` in `dir_fd` is staged on another
  // node and not yet closed there (not shown here). False when unreadable:
  // opening it then reports why.
  bool HiddenOnThisNode(int dir_fd, const std::string& name);
  // Whether the node with this id holds a live membership lease (the
  // records are read at most once a second).
  bool NodeAlive(uint64_t node_id);
  // Cluster mode: the directory under which a file is created before it is
  // linked into ns/ with a staged record, so that other nodes never see it
  // empty (this node's nodes/NODE/tmp/); -1 in a single-node store.
  int creation_dir_fd() const { return cluster() ? tmp_.get() : -1; }
  // Where packs published from now on run the encoder's data-parallel
  // steps (codec/compute_device.h). Set before sealing starts: the daemon
  // opens a GPU only after it forks, since CUDA does not survive a fork.
  void SetComputeDevice(std::shared_ptr<const ComputeDevice> device) {
    device_ = std::move(device);
    opts_.encoder.planes.device = device_.get();
  }

  // --- packs ---
  // Encodes [0,size) of src_fd and publishes it as a new pack; under a
  // lossy policy, lossily (codec/lossy/file_coder.h), asking `siblings`
  // for the optimizer file of a file of weights alone.
  // In cluster mode the seal's pin (store/cluster/seal_pin.h) lists the new pack
  // and its bases; it is handed to `keep_pin` when given (the caller drops
  // it once a stub names the pack), else removed on return.
  // Under a lossy policy, the seal holds the file's input digest
  // (store/same_input.h) until `keep_input` goes, when given (the caller
  // drops it once a stub names the pack or the pack is discarded).
  Result<ObjectId> PublishPack(int src_fd, uint64_t size, const std::atomic<bool>* cancel = nullptr,
                               const LossyPolicy& policy = {}, SiblingSource* siblings = nullptr,
                               std::unique_ptr<SealPin>* keep_pin = nullptr,
                               std::unique_ptr<SameInputSeals::Hold>* keep_input = nullptr);
  // The files that may hold the Adam second moments of the model file
  // whose stub is `stub_fd`, last written at `written`, read as they are
  // when the coder asks: other files of the same directory with the same
  // owner whose last write is within kSaveWindowSeconds of it, nearest in
  // time first. The coder still checks their names and shapes.
  std::unique_ptr<SiblingSource> SiblingsOf(int stub_fd, const struct timespec& written, const SealWait& wait = {});
  // Where the stub `stub_fd` is now, relative to ns/ ("a/b/model.pt"):
  // found through /proc/self/fd, as a file can be renamed while open, and
  // checked to name that very inode under ns/. An error for a stub that is
  // unlinked, outside ns/, or moved meanwhile.
  Result<std::string> NamespacePathOf(int stub_fd);
  // fsyncs the ns/ directory the stub `stub_fd` is in now, so that its name
  // is durable. Nothing to do for a stub with no link left.
  Status SyncDirectoryOf(int stub_fd);
  // The lossy policy for the file whose stub is `stub_fd`: the nearest
  // directory's user.ckptfs.policy, else the mount's. A policy that cannot
  // be read or parsed counts as lossless, and is logged; so does that of a
  // file no longer in the namespace (NamespacePathOf fails), whose
  // directories are unknown.
  LossyPolicy PolicyFor(int stub_fd);
  double FidelityFor(int stub_fd);  // PolicyFor(stub_fd).fidelity
  // What lossy mode did to the file whose stub is at `stub_path` (through
  // /proc/self/fd), from its pack's meta block; nothing for a file that is
  // staged, empty or was sealed losslessly.
  Result<std::optional<LossyInfo>> LossyInfoOf(const std::string& stub_path);
  Result<std::shared_ptr<PackReader>> OpenPack(ObjectId id);
  Status DeletePack(ObjectId id);  // missing is fine; the caller knows nothing needs it
  // A stub stopped naming `id`: deletes it, and bases only it kept, unless
  // other packs still need them (invariant 4: deleting a file never breaks
  // another). Without a loaded index (read-only tools) nothing is deleted,
  // nor while deletion_blocked(): the packs stay for `ckptfs gc`.
  Status ReleasePack(ObjectId id);
  // A sealed file starts being rewritten: its stub no longer names `id`, but
  // the pack stays as the predecessor candidate of the new version until
  // ReleaseRetired (after the next seal, or when the file goes away). A
  // crash in between leaves it unreferenced, and recovery deletes it.
  Status RetirePack(ObjectId id);
  Status ReleaseRetired(ObjectId id);
  // Bytes [offset, offset+out.size()) of a pack's logical content, through
  // `base_cache` when set. Chunks stored against other packs use this.
  Status ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) override;
  Status ReadPackRangeOnce(ObjectId pack, uint64_t offset, std::span<uint8_t> out) override;
  Status UsePackRange(ObjectId pack, uint64_t offset, uint64_t len,
                      const std::function<Status(std::span<const uint8_t>)>& use) override;
  std::optional<std::pair<ObjectId, uint64_t>> BaseOfChunk(ObjectId pack, uint64_t offset, uint64_t len) override;
  void SetBaseCache(ChunkCache* cache) { base_cache_ = cache; }
  // Chunk `index` of pack `id` decoded, through `cache` when not null (one
  // decode for concurrent misses). Reads are mostly sequential, so the next
  // chunk's disk read is started to overlap this decode.
  Result<ChunkBytes> LoadChunk(const PackReader& pack, ObjectId id, uint64_t index, ChunkCache* cache);
  // Copies bytes [offset, offset+out.size()) of pack `id`'s logical content
  // through `cache` (may be null). note_read: tell the cache the bytes were
  // handed on (ChunkCache::NoteRead), as for a delta's base; not for a look
  // at bytes a reader still comes for (a file parsed for its layout).
  Status CopyPackBytes(const PackReader& pack, ObjectId id, uint64_t offset, std::span<uint8_t> out, ChunkCache* cache,
                       bool note_read);
  const PackIndex& index() const { return index_; }
  // Set by a recovery that found objects it could not read: any pack might
  // then be needed by one of them, so until a later recovery (the next mount
  // or `ckptfs gc`) reads everything, no pack is deleted.
  bool deletion_blocked() const { return deletion_blocked_.load(); }
  Result<uint64_t> PackFileSize(ObjectId id);
  // Every pack in the store, with its size and the time it was last
  // written (cluster GC's grace period counts from it). Unparseable names
  // are skipped; a pack directory that cannot be listed is an error.
  struct PackStat {
    ObjectId id = 0;
    uint64_t bytes = 0;
    uint64_t mtime_ns = 0;
    // False for a RADOS object whose publish never finished (a crash, or a
    // seal still writing it): no stub names it, and it is no readable pack.
    bool complete = true;
  };
  Result<std::vector<PackStat>> ListPacks();
  // Bytes of every pack in the store: with deltas, packs of deleted files
  // can stay as bases of others, so this can exceed the files' own packs.
  Result<uint64_t> AllPackBytes();
  // Where the packs are: the store directory or a RADOS pool (recorded in
  // the superblock when the store was created).
  PackObjects& pack_objects() { return *pack_objects_; }
  // librados's threads do not survive fork(2): a process that opened a
  // store with packs in RADOS and then forks (the daemon) closes the
  // connection before the fork, dropping the packs it holds open, and
  // opens a new one after it in the child. Nothing may use packs in
  // between. No-ops for packs in the store directory.
  void ClosePackConnection();
  Status OpenPackConnection();

  // --- staging ---
  Result<UniqueFd> CreateStaging(ObjectId* id);  // new empty file, O_RDWR
  Result<UniqueFd> OpenStaging(ObjectId id);
  Status DeleteStaging(ObjectId id);  // missing is fine
  Status SyncStagingDir();

  // --- whole-file transitions on a stub (caller serialises per stub) ---
  // What StageStub made of a sealed file.
  struct Staged {
    StubRecord rec;            // the stub as written: STAGED, naming the staging file
    UniqueFd fd;               // the staging file, O_RDWR
    bool stub_synced = false;  // the switch is durable
    ObjectId retired = 0;      // the pack it replaced, now retired (RetirePack); 0: none
  };
  // Stages a SEALED stub, for the first write or size change of a sealed
  // file: a new staging file gets the first `keep_bytes` of the content
  // (decoded from the pack, holes kept), then the stub is switched to
  // STAGED: the commit point. When that replaces a pack, the staging file
  // and its directory entry are made durable before the switch and the stub
  // is fsync'd after it, so no durable stub can name a staging file that a
  // power cut takes away; only then is the pack retired, kept as the new
  // version's predecessor until the next seal (a file overwritten in place,
  // like last.ckpt, is its own lineage). An error before the switch leaves
  // the stub as it was; a failed fsync after it returns the staged file
  // with stub_synced false and the pack still referenced.
  Result<Staged> StageStub(int stub_fd, const StubRecord& sealed, uint64_t keep_bytes);
  // Seals a STAGED stub: pack from the staging file, stub -> SEALED (fsync'd,
  // mtime taken from the staging file), staging file deleted. (The pack a
  // file had before it was staged was released when it was staged.)
  // `still_current` is asked right before the stub is switched; returning
  // false abandons the new pack (the file changed meanwhile).
  // With `wait.may_postpone`, a seal that would wait for more of its save
  // (the seal planner says so, store/seal_plan.h) fails with kSealPostponed instead,
  // leaving the stub staged, for the caller to try again later.
  // `cancel`, when set and true, stops the seal at its next chunk
  // (ECANCELED), leaving the stub staged: the file was deleted.
  Result<StubRecord> SealStub(int stub_fd, const StubRecord& staged, int staging_fd,
                              const std::function<bool()>& still_current = {}, const SealWait& wait = {},
                              const std::atomic<bool>* cancel = nullptr);
  // Deletes the objects a stub refers to (after its last link is gone).
  Status ReleaseStubObjects(const StubRecord& rec);

  // --- maintenance ---
  // Completes or rolls back interrupted work: clears tmp/, seals STAGED
  // stubs, deletes packs no file needs (directly or as a base) and staging
  // files no stub refers to, and loads the pack index. This is also the
  // full garbage collection (`ckptfs gc`). It deletes a pack or staging
  // file only when every stub, pack and base could be read: otherwise it
  // lists them in RecoveryReport::unreadable, deletes nothing, and blocks
  // the daemon's deletions (deletion_blocked) until a later Recover reads
  // everything.
  // `progress`, if given, hears how many of the store's packs have been
  // read so far, of how many (for `ckptfs gc`'s progress line).
  using PackProgress = std::function<void(uint64_t packs_read, uint64_t packs_total)>;
  Result<RecoveryReport> Recover(const PackProgress& progress = {});
  // `progress`, if given, hears the logical bytes verified so far after
  // each pack (for a progress line).
  Result<FsckReport> Fsck(const std::function<void(uint64_t bytes_checked)>& progress = {});
  // Cluster GC (store/cluster_gc.h), under the GC lease: deletes packs that
  // no stub on any node, no pin of a live node and no live pack's bases
  // need, once they have been marked doomed for the grace period.
  Result<ClusterGcReport> CollectClusterGarbage(const ClusterGcOptions& gc);
  // nodes/NODE/pins/ of this node (cluster mode; -1 otherwise).
  int pins_dir_fd() const { return pins_.get(); }
  Result<std::vector<FileUsage>> Usage(const std::string& subpath = "");
  // The same for the one file whose stub is at `stub_path` (through
  // /proc/self/fd; the mount's usage attributes); `path` stays empty.
  Result<FileUsage> UsageOf(const std::string& stub_path);
  // The policy a file sealed in the directory `dir_fd` (under ns/) would get.
  LossyPolicy PolicyOfDirectory(int dir_fd);

 private:
  Result<FileUsage> UsageOfStub(int stub_fd, std::string path);
  // The nearest policy of the directories above the namespace path `path`.
  LossyPolicy PolicyAbove(const std::string& path);
  bool PolicyLogAllowed(const std::string& dir);
  Store(Env* env, std::string path, StoreOptions opts) : env_(env), path_(std::move(path)), opts_(opts) {}
  Status InitLayout();
  // Cluster mode at open: records the store as shared, joins as a node,
  // and points tmp_ and staging_ at this node's own directories.
  Status OpenCluster(bool shared_already);
  Status OpenNodeStaging();
  Status OpenPinsWithoutJoining();
  // After InitLayout: `packs` is "dir" or "rados:POOL", `rados_namespace`
  // the store's namespace in that pool.
  Status OpenPackObjects(const std::string& packs, const std::string& rados_namespace);
  std::string rados_namespace_;
  Result<std::shared_ptr<PackReader>> CachedPack(ObjectId id);
  // The base pack of a delta or reference, once [offset, offset+len) is known to lie inside it.
  Result<std::shared_ptr<PackReader>> BaseRangeReader(ObjectId pack, uint64_t offset, uint64_t len);
  Status DecodePackInto(ObjectId id, uint64_t keep_bytes, int dst_fd);
  Status DeleteDeadPacks(const std::vector<ObjectId>& dead);
  // The input digest of a file sealed under `policy` (store/same_input.h),
  // into `digest`, and an indexed pack sealed from the same input, pinned
  // in the index and admitted, if there is one.
  // `hold` gets the digest's hold (SameInputSeals), taken before the lookup.
  Result<std::optional<SameInputPack>> SameInputFor(const ByteSource& file, const LossyPolicy& policy,
                                                    BaseAdmission* admission, const std::atomic<bool>* cancel,
                                                    Digest128* digest, std::unique_ptr<SameInputSeals::Hold>* hold);
  SameInputSeals same_input_seals_;
  // Makes every namespace change so far durable (syncfs). Called before an
  // object nothing names any more is deleted: the unlink or rename that
  // dropped the last stub naming it may not be durable yet, and after a power
  // cut that stub would come back naming a deleted object.
  Status SyncBeforeDeleting();
  // Drops a pack this process just published and no stub ever named (a
  // seal that lost its race): provably unreferenced, so deleted even while
  // deletion_blocked(); what it kept alive goes through DeleteDeadPacks.
  void DiscardNewPack(ObjectId id);
  void GcLoop();
  // Cluster mode: this node's pins directory, and the pin of a seal that
  Result<std::unique_ptr<SealPin>> StartSealPin(ObjectId new_pack);
  std::unique_ptr<BaseAdmission> AdmissionFor(SealPin* pin);
  // Whether `id` is usable as a base: no gc/doomed marker and present.
  bool UsableAsBase(ObjectId id);
  void PinRetired(ObjectId id);
  // Recovery step 3: marks what stubs need (through pack bases), deletes the
  // rest, and fills index_ with what is kept.
  // `roots` maps each pack stubs name to one stub's path (for messages).
  // Anything it cannot read goes to rep->unreadable; with any there (a stub
  // could not be read either), nothing is deleted.
  Status CollectPacks(const std::unordered_map<ObjectId, std::string>& roots, RecoveryReport* rep,
                      const PackProgress& progress);
  // Recovery's last step, once everything could be read: deletes the
  // staging files no stub names (`referenced` holds those some stub names).
  Status RemoveOrphanStaging(const std::unordered_set<ObjectId>& referenced, RecoveryReport* rep);
  // Visits every stub under ns/ (depth-first); path is relative to ns/.
  Status WalkStubs(const std::function<Status(const std::string& path, int stub_fd)>& fn);

  Env* env_;
  std::string path_;
  StoreOptions opts_;
  std::shared_ptr<const ComputeDevice> device_;  // what opts_.encoder.planes.device points at
  UniqueFd root_, ns_, packs_, staging_, tmp_, lock_, pins_;
  std::unique_ptr<Membership> membership_;
  uint64_t node_id_ = 0;
  std::mutex refresh_mu_;
  uint64_t last_refresh_ns_ = 0;
  std::mutex members_mu_;
  uint64_t members_read_ns_ = 0;
  std::unordered_set<uint64_t> alive_nodes_;
  std::unique_ptr<PackObjects> pack_objects_;  // after packs_, which the dir one uses
  std::vector<std::string> made_private_;
  PackIndex index_;
  bool index_loaded_ = false;
  std::atomic<bool> deletion_blocked_{false};
  ChunkCache* base_cache_ = nullptr;
  std::mutex readers_mu_;
  std::list<std::pair<ObjectId, std::shared_ptr<PackReader>>> readers_;  // small LRU of open base packs
  // Background deletion (StoreOptions::background_gc). A crash loses only
  // queued deletions, which recovery's sweep redoes.
  std::mutex gc_mu_;
  std::condition_variable gc_cv_;
  std::vector<ObjectId> gc_queue_;
  bool gc_stop_ = false;
  std::thread gc_thread_;
  // Cluster mode: the pins of retired packs (RetirePack), by pack, with
  // how many retirements each one holds.
  struct RetiredPin {
    std::shared_ptr<SealPin> pin;  // shared_ptr: SealPin is incomplete here
    uint32_t count = 0;
  };
  std::mutex retired_pins_mu_;
  std::unordered_map<ObjectId, RetiredPin> retired_pins_;
};

}  // namespace ckptfs
