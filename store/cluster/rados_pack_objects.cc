#include "store/cluster/rados_pack_objects.h"

#include <algorithm>
#include <atomic>
#include <list>
#include <map>
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
  // [off, off+len) of the pack, at `obj_off` in object `obj`.
  ReadAhead(RadosClient* client, const std::string& obj, uint64_t off, uint64_t obj_off, uint64_t len)
      : off_(off), buf_(len) {
    read_ahead_bytes += len;
    pending_ = client->StartRead(obj, obj_off, buf_);
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

std::string StripeName(ObjectId id, uint64_t stripe) {
  return stripe == 0 ? internal::PackFileName(id) : internal::PackFileName(id) + "." + std::to_string(stripe);
}

uint64_t StripeCount(uint64_t size, uint64_t stripe_bytes) {
  return std::max<uint64_t>(1, (size + stripe_bytes - 1) / stripe_bytes);
}

// "ID.pack.K" (K >= 1) -> (ID, K).
std::optional<std::pair<ObjectId, uint64_t>> ParseTailName(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot + 1 == name.size() || name[dot + 1] == '0') return std::nullopt;
  if (name.find_first_not_of("0123456789", dot + 1) != std::string::npos || name.size() - dot > 10) return std::nullopt;
  std::optional<ObjectId> id = internal::ParseObjectFileName(name.substr(0, dot), internal::kPackSuffix);
  if (!id) return std::nullopt;
  return std::make_pair(*id, std::stoull(name.substr(dot + 1)));
}

// The size the completion mark records.
Result<uint64_t> ParseMark(const std::string& value, const std::string& where) {
  if (value.empty() || value.size() > 19 || value.find_first_not_of("0123456789") != std::string::npos) {
    return Status::Corruption(where + ": completion mark " + kCompleteXattr + " is \"" + value + "\", not a size");
  }
  return std::stoull(value);
}

// A pack's bytes, `size` of them, striped over objects ID.pack, ID.pack.1, ...
class RadosPackBytes : public PackBytes {
 public:
  RadosPackBytes(RadosClient* client, ObjectId id, uint64_t size, uint64_t stripe_bytes)
      : client_(client), id_(id), size_(size), stripe_bytes_(stripe_bytes) {}

  Result<uint64_t> Size() override { return size_; }

  Status ReadExact(std::span<uint8_t> out, uint64_t off) const override {
    if (std::shared_ptr<ReadAhead> ahead = TakeAhead(off, out.size()); ahead && ahead->CopyOut(out, off)) {
      return Status::Ok();
    }
    // No read ahead covers it, or that one failed: read it now.
    if (off > size_ || size_ - off < out.size()) return Status::Error(EIO, "short read");
    uint64_t done = 0;
    while (done < out.size()) {
      const uint64_t pos = off + done, stripe = pos / stripe_bytes_, within = pos % stripe_bytes_;
      const size_t want = static_cast<size_t>(std::min<uint64_t>(out.size() - done, stripe_bytes_ - within));
      Result<size_t> n = client_->Read(StripeName(id_, stripe), within, out.subspan(done, want));
      // A missing object of a published pack is damage (EIO), not a missing file.
      if (!n.ok()) return n.status().code() == ENOENT ? Status::Error(EIO, n.status().message()) : n.status();
      if (*n == 0) return Status::Error(EIO, "short read");
      done += *n;
    }
    return Status::Ok();
  }

  // Within one object only: a range across two is read when it is needed.
  void Prefetch(uint64_t off, uint64_t len) const override {
    if (off >= size_ || len == 0) return;
    len = std::min(len, size_ - off);
    const uint64_t stripe = off / stripe_bytes_;
    if ((off + len - 1) / stripe_bytes_ != stripe) return;
    if (read_ahead_bytes.load() + len > kReadAheadBudget) return;
    std::shared_ptr<ReadAhead> evicted;  // waited for outside the lock
    std::lock_guard lk(mu_);
    for (const auto& a : ahead_) {
      if (a->Covers(off, len)) return;
    }
    ahead_.push_front(std::make_shared<ReadAhead>(client_, StripeName(id_, stripe), off, off % stripe_bytes_, len));
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
  ObjectId id_;
  uint64_t size_;
  uint64_t stripe_bytes_;
  mutable std::mutex mu_;
  mutable std::list<std::shared_ptr<ReadAhead>> ahead_;
};

}  // namespace

std::string RadosPackObjects::Where(ObjectId id) const { return location_ + "/" + internal::PackFileName(id); }

// Bytes [begin, end) of the pack into its object `stripe`, a piece at a
// time; the head's last piece also sets the completion mark.
Status RadosPackObjects::WriteStripe(ObjectId id, uint64_t stripe, int tmp_fd, uint64_t size,
                                     std::vector<uint8_t>* piece) {
  const std::string obj = StripeName(id, stripe);
  const uint64_t begin = stripe * stripe_bytes_, end = std::min(size, begin + stripe_bytes_);
  for (uint64_t off = begin; off < end; off += piece->size()) {
    const std::span<uint8_t> bytes(piece->data(), std::min<uint64_t>(piece->size(), end - off));
    RETURN_IF_ERROR(env_->PReadExact(tmp_fd, bytes, off).WithContext("reading the finished pack"));
    const bool mark = stripe == 0 && off + bytes.size() == end;
    const RadosWriteExtras extras{.create_exclusive = off == begin,
                                  .xattr_name = mark ? kCompleteXattr : "",
                                  .xattr_value = mark ? std::to_string(size) : ""};
    Status w = client_->Write(obj, off - begin, bytes, extras);
    if (w.ok()) continue;
    if (off == begin && w.code() == EEXIST) return w.WithContext(obj + " exists already");
    return w.WithContext("writing bytes " + std::to_string(off) + ".." + std::to_string(off + bytes.size()) + " to " +
                         obj);
  }
  return Status::Ok();
}

// The head goes last: once it is complete, every other object is.
Status RadosPackObjects::WriteStripes(ObjectId id, int tmp_fd, uint64_t size, uint64_t* created) {
  std::vector<uint8_t> piece(std::min(size, kRadosPieceBytes));
  const uint64_t stripes = StripeCount(size, stripe_bytes_);
  for (uint64_t k = 1; k < stripes; ++k) {
    RETURN_IF_ERROR(WriteStripe(id, k, tmp_fd, size, &piece));
    *created = k;
  }
  return WriteStripe(id, 0, tmp_fd, size, &piece);
}

Status RadosPackObjects::Publish(ObjectId id, int tmp_dir_fd, const std::string& tmp_name, int tmp_fd) {
  ASSIGN_OR_RETURN(struct stat st, env_->Fstat(tmp_fd));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint64_t tails = 0;
  if (Status s = WriteStripes(id, tmp_fd, size, &tails); !s.ok()) {
    // Without the completion mark nothing takes them for a pack; removed
    // now when possible, else by gc. An object that existed (EEXIST) is
    // not ours: then only the ones written before it go.
    Status r = s.code() == EEXIST ? RemoveStripes(id, tails + 1, false)
                                  : RemoveStripes(id, StripeCount(size, stripe_bytes_), true);
    if (!r.ok()) spdlog::warn("cannot remove the unfinished {} (gc will): {}", Where(id), r.message());
    return s.WithContext(Where(id));
  }
  if (Status u = env_->UnlinkAt(tmp_dir_fd, tmp_name); !u.ok()) {
    spdlog::warn("published {}, but cannot remove its tmp file {} (recovery will): {}", Where(id), tmp_name,
                 u.message());
  }
  return Status::Ok();
}

Result<uint64_t> RadosPackObjects::MarkedSize(ObjectId id) {
  Result<std::string> mark = client_->GetXattr(StripeName(id, 0), kCompleteXattr);
  if (!mark.ok() && mark.status().code() == ENODATA) {
    return Status::Corruption(Where(id) + " was never completely published (no " + kCompleteXattr + " mark)");
  }
  if (!mark.ok()) return mark.status();
  return ParseMark(*mark, Where(id));
}

Result<std::unique_ptr<PackBytes>> RadosPackObjects::Open(ObjectId id) {
  ASSIGN_OR_RETURN(uint64_t size, MarkedSize(id));
  return std::unique_ptr<PackBytes>(std::make_unique<RadosPackBytes>(client_.get(), id, size, stripe_bytes_));
}

// The head first: a crash in between leaves objects without a head, which
// list as an unfinished pack, never a complete pack with missing bytes.
// `stripes` 0: as many as there are (counted until one is missing).
Status RadosPackObjects::RemoveStripes(ObjectId id, uint64_t stripes, bool with_head) {
  if (with_head) {
    if (Status s = client_->Remove(StripeName(id, 0)); !s.ok() && s.code() != ENOENT) return s;
  }
  for (uint64_t k = 1; stripes == 0 || k < stripes; ++k) {
    Status s = client_->Remove(StripeName(id, k));
    if (!s.ok() && s.code() != ENOENT) return s;
    if (!s.ok() && stripes == 0) break;
  }
  return Status::Ok();
}

Status RadosPackObjects::Delete(ObjectId id) {
  Result<uint64_t> size = MarkedSize(id);
  return RemoveStripes(id, size.ok() ? StripeCount(*size, stripe_bytes_) : 0, true);
}

Result<uint64_t> RadosPackObjects::Size(ObjectId id) { return MarkedSize(id); }

// One pack of the listing: its head and the other objects found for it.
void RadosPackObjects::ListPack(ObjectId id, const std::vector<std::string>& objects, bool head, ListDetail detail,
                                PackListing* out) {
  PackObjectEntry e{.id = id, .where = Where(id), .complete = false};
  if (head) {
    Result<std::string> mark = client_->GetXattr(StripeName(id, 0), kCompleteXattr);
    Result<uint64_t> size = mark.ok() ? ParseMark(*mark, e.where) : Result<uint64_t>(mark.status());
    if (!size.ok() && size.status().code() != ENODATA) {
      if (size.status().code() != ENOENT) out->unlisted.push_back({e.where, size.status(), false});  // ENOENT: deleted meanwhile
      return;
    }
    e.complete = size.ok();
    if (e.complete) e.bytes = *size;
  }
  if (detail == ListDetail::kSizes) {
    // mtime: the last write of any of its objects; bytes, for an unfinished one: what it holds.
    for (const std::string& obj : objects) {
      Result<RadosObjectStat> st = client_->Stat(obj);
      if (!st.ok()) {
        if (st.status().code() != ENOENT) out->unlisted.push_back({location_ + "/" + obj, st.status(), false});
        continue;
      }
      if (!e.complete) e.bytes += st->size;
      e.mtime_ns = std::max(e.mtime_ns, st->mtime_ns);
    }
  }
  out->packs.push_back(std::move(e));
}

Result<PackListing> RadosPackObjects::List(ListDetail detail) {
  Result<std::vector<std::string>> names = client_->List();
  if (!names.ok()) return names.status().WithContext("listing " + location_);
  PackListing out;
  std::map<ObjectId, std::pair<bool, std::vector<std::string>>> packs;  // head seen, its objects
  for (const std::string& name : *names) {
    if (std::optional<ObjectId> id = internal::ParseObjectFileName(name, internal::kPackSuffix)) {
      packs[*id].first = true;
      packs[*id].second.push_back(name);
    } else if (std::optional<std::pair<ObjectId, uint64_t>> tail = ParseTailName(name)) {
      packs[tail->first].second.push_back(name);
    } else {
      out.unexpected.push_back(location_ + "/" + name);
    }
  }
  for (const auto& [id, p] : packs) ListPack(id, p.second, p.first, detail, &out);
  return out;
}

}  // namespace ckptfs
