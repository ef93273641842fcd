#include "store/rados_pack_objects.h"

#include <algorithm>
#include <atomic>
#include <list>
#include <mutex>
#include <optional>
#include <vector>

#include "base/log.h"
#include "store/store_internal.h"

namespace ckptfs {
namespace {

// Reads ahead kept per open pack: the chunk after the one being read, and
// the one after that while the first is still waited for. Each holds at
// most one chunk's stored bytes (or a small pack's payload, up to 8 MiB).
constexpr size_t kMaxReadsAhead = 2;
// Bytes all open packs together may hold read ahead (the store keeps up to
// 32 base packs open, besides the files being read); past it, Prefetch
// does nothing and reads wait for their bytes.
constexpr uint64_t kReadAheadBudget = 64u << 20;
std::atomic<uint64_t> read_ahead_bytes{0};

// A range of the object read asynchronously; the first to need it waits.
class ReadAhead {
 public:
  ReadAhead(RadosClient* client, const std::string& obj, uint64_t off, uint64_t len) : off_(off), buf_(len) {
    read_ahead_bytes += len;
    pending_ = client->StartRead(obj, off, buf_);
  }
  ~ReadAhead() {
    pending_.reset();  // waits for the read before its buffer goes
    read_ahead_bytes -= buf_.size();
  }
  uint64_t off() const { return off_; }
  uint64_t end() const { return off_ + buf_.size(); }
  bool Covers(uint64_t off, uint64_t len) const { return off >= off_ && off + len <= end(); }
  // Copies [off, off+out.size()) once the read is done; false when it failed or came back short.
  bool CopyOut(std::span<uint8_t> out, uint64_t off) {
    std::lock_guard lk(mu_);
    if (!done_) done_ = pending_->Wait();
    if (!done_->ok() || off + out.size() > off_ + **done_) return false;
    std::copy_n(buf_.begin() + (off - off_), out.size(), out.begin());
    return true;
  }

 private:
  std::mutex mu_;
  uint64_t off_;
  std::vector<uint8_t> buf_;
  std::unique_ptr<RadosPendingRead> pending_;  // declared after buf_: waits before buf_ goes
  std::optional<Result<size_t>> done_;
};

class RadosPackBytes : public PackBytes {
 public:
  RadosPackBytes(RadosClient* client, std::string obj, uint64_t size)
      : client_(client), obj_(std::move(obj)), size_(size) {}

  Result<uint64_t> Size() override { return size_; }

  Status ReadExact(std::span<uint8_t> out, uint64_t off) const override {
    if (std::shared_ptr<ReadAhead> ahead = TakeAhead(off, out.size()); ahead && ahead->CopyOut(out, off)) {
      return Status::Ok();
    }
    // No read ahead covers it, or that one failed: read it now.
    uint64_t done = 0;
    while (done < out.size()) {
      ASSIGN_OR_RETURN(size_t n, client_->Read(obj_, off + done, out.subspan(done)));
      if (n == 0) return Status::Error(EIO, "short read");
      done += n;
    }
    return Status::Ok();
  }

  void Prefetch(uint64_t off, uint64_t len) const override {
    if (off >= size_ || len == 0) return;
    len = std::min(len, size_ - off);
    if (read_ahead_bytes.load() + len > kReadAheadBudget) return;
    std::shared_ptr<ReadAhead> evicted;  // waited for outside the lock
    std::lock_guard lk(mu_);
    for (const auto& a : ahead_) {
      if (a->Covers(off, len)) return;
    }
    ahead_.push_front(std::make_shared<ReadAhead>(client_, obj_, off, len));
    if (ahead_.size() > kMaxReadsAhead) {
      evicted = std::move(ahead_.back());
      ahead_.pop_back();
    }
  }

 private:
  // The read ahead covering [off, off+len); it is dropped once a read
  // reaches its end, since sequential readers do not come back.
  std::shared_ptr<ReadAhead> TakeAhead(uint64_t off, uint64_t len) const {
    std::lock_guard lk(mu_);
    for (auto it = ahead_.begin(); it != ahead_.end(); ++it) {
      if (!(*it)->Covers(off, len)) continue;
      std::shared_ptr<ReadAhead> a = *it;
      if (off + len == a->end()) ahead_.erase(it);
      return a;
    }
    return nullptr;
  }

  RadosClient* client_;
  std::string obj_;
  uint64_t size_;
  mutable std::mutex mu_;
  mutable std::list<std::shared_ptr<ReadAhead>> ahead_;
};

std::string ObjectName(ObjectId id) { return internal::PackFileName(id); }

}  // namespace

std::string RadosPackObjects::Where(ObjectId id) const { return location_ + "/" + ObjectName(id); }

Status RadosPackObjects::WritePieces(const std::string& obj, int tmp_fd, uint64_t size) {
  std::vector<uint8_t> piece(std::min(size, kRadosPieceBytes));
  for (uint64_t off = 0; off < size; off += piece.size()) {
    const std::span<uint8_t> bytes(piece.data(), std::min<uint64_t>(piece.size(), size - off));
    RETURN_IF_ERROR(env_->PReadExact(tmp_fd, bytes, off).WithContext("reading the finished pack"));
    const bool last = off + bytes.size() == size;
    const RadosWriteExtras extras{.create_exclusive = off == 0,
                                  .xattr_name = last ? kCompleteXattr : "",
                                  .xattr_value = last ? std::to_string(size) : ""};
    Status w = client_->Write(obj, off, bytes, extras);
    if (w.ok()) continue;
    if (w.code() == EFBIG) {
      return w.WithContext("the pack is " + std::to_string(size) +
                           " bytes, more than the OSDs take in one object; raise osd_max_object_size "
                           "(`ceph config set osd osd_max_object_size BYTES`)");
    }
    if (off == 0 && w.code() == EEXIST) return w.WithContext("an object of that name exists already");
    return w.WithContext("writing bytes " + std::to_string(off) + ".." + std::to_string(off + bytes.size()));
  }
  return Status::Ok();
}

Status RadosPackObjects::Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) {
  const std::string obj = ObjectName(id);
  ASSIGN_OR_RETURN(struct stat st, env_->Fstat(tmp_fd));
  if (Status s = WritePieces(obj, tmp_fd, static_cast<uint64_t>(st.st_size)); !s.ok()) {
    // Without the completion mark nothing takes it for a pack; removed
    // now when possible, else by gc. (EEXIST: the object is not ours.)
    if (s.code() != EEXIST) {
      if (Status r = client_->Remove(obj); !r.ok() && r.code() != ENOENT) {
        spdlog::warn("cannot remove unfinished {} (gc will): {}", Where(id), r.message());
      }
    }
    return s.WithContext(Where(id));
  }
  if (Status u = env_->UnlinkAt(tmp_dir_fd, tmp_name); !u.ok()) {
    spdlog::warn("published {}, but cannot remove its tmp file {} (recovery will): {}", Where(id), tmp_name,
                 u.message());
  }
  return Status::Ok();
}

Result<std::unique_ptr<PackBytes>> RadosPackObjects::Open(ObjectId id) {
  ASSIGN_OR_RETURN(RadosObjectStat st, client_->Stat(ObjectName(id)));
  return std::unique_ptr<PackBytes>(std::make_unique<RadosPackBytes>(client_.get(), ObjectName(id), st.size));
}

Status RadosPackObjects::Delete(ObjectId id) {
  Status s = client_->Remove(ObjectName(id));
  return !s.ok() && s.code() == ENOENT ? Status::Ok() : s;
}

Result<uint64_t> RadosPackObjects::Size(ObjectId id) {
  ASSIGN_OR_RETURN(RadosObjectStat st, client_->Stat(ObjectName(id)));
  return st.size;
}

void RadosPackObjects::ListObject(const std::string& name, ListDetail detail, PackListing* out) {
  const std::string where = location_ + "/" + name;
  std::optional<ObjectId> id = internal::ParseObjectFileName(name, internal::kPackSuffix);
  if (!id) {
    out->unexpected.push_back(where);
    return;
  }
  PackObjectEntry e{.id = *id, .where = where};
  Result<std::string> mark = client_->GetXattr(name, kCompleteXattr);
  if (!mark.ok() && mark.status().code() != ENODATA) {
    if (mark.status().code() != ENOENT) out->unlisted.push_back({where, mark.status(), false});  // ENOENT: deleted meanwhile
    return;
  }
  e.complete = mark.ok();
  if (detail == ListDetail::kSizes) {
    Result<RadosObjectStat> st = client_->Stat(name);
    if (!st.ok()) {
      if (st.status().code() != ENOENT) out->unlisted.push_back({where, st.status(), false});
      return;
    }
    e.bytes = st->size;
    e.mtime_ns = st->mtime_ns;
  }
  out->packs.push_back(std::move(e));
}

Result<PackListing> RadosPackObjects::List(ListDetail detail) {
  Result<std::vector<std::string>> names = client_->List();
  if (!names.ok()) return names.status().WithContext("listing " + location_);
  PackListing out;
  for (const std::string& name : *names) ListObject(name, detail, &out);
  return out;
}

}  // namespace ckptfs
