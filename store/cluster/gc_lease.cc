#include "store/cluster/gc_lease.h"

#include <fcntl.h>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "store/object_id.h"
#include "store/private_store.h"

namespace ckptfs {
namespace {

constexpr size_t kMaxLeaseBytes = 4096;
constexpr int kAcquireAttempts = 3;

std::string Encode(const GcLeaseRecord& r) {
  return nlohmann::json{{"holder", r.holder}, {"token", r.token}, {"expires_ns", r.expires_ns}}.dump() + "\n";
}

std::optional<GcLeaseRecord> Decode(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    return GcLeaseRecord{j.at("holder").get<std::string>(), j.at("token").get<std::string>(),
                         j.at("expires_ns").get<uint64_t>()};
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// A lease larger than any lease reads as empty text: unparseable, so
// treated as torn (below), not as an error that would stop every GC.
Result<std::string> ReadText(Env* env, int dir_fd, const std::string& name) {
  Result<std::string> text = ReadFileToString(env, dir_fd, name, kMaxLeaseBytes);
  if (!text.ok() && text.status().code() == EFBIG) return std::string();
  return text;
}

Status WriteFile(Env* env, int dir_fd, const std::string& name, const std::string& text) {
  return WriteNewFile(env, dir_fd, name, text, kPrivateFileMode, Durability::kData);
}

// A lease that cannot be parsed (torn by a crash mid-write: it is written
// whole before it is linked, so only damage tears it) counts as expired
// once it is older than a term.
bool Expired(Env* env, int dir_fd, const std::string& text, uint64_t now, uint64_t term_ns) {
  if (std::optional<GcLeaseRecord> r = Decode(text)) return now >= r->expires_ns;
  Result<struct stat> st = env->FstatAt(dir_fd, kGcLeaseName, AT_SYMLINK_NOFOLLOW);
  if (!st.ok()) return false;
  const uint64_t mtime = uint64_t(st->st_mtim.tv_sec) * 1000000000ull + uint64_t(st->st_mtim.tv_nsec);
  return now >= mtime + term_ns;
}

std::string HeldMessage(const std::string& text) {
  std::optional<GcLeaseRecord> r = Decode(text);
  if (!r) return "the GC lease gc/lease is held (unreadable record, not yet expired)";
  return "the GC lease gc/lease is held by " + r->holder + " for " +
         std::to_string((r->expires_ns > 0 ? r->expires_ns : 0) / 1000000000ull) +
         " (expiry, seconds since the epoch); another collection is running";
}

// Moves an expired lease away. Ok(true) when the one judged stale (`seen`)
// was removed; Ok(false) when the name changed meanwhile (what was moved is
// put back when it is someone's fresh lease).
Result<bool> TakeOverStale(Env* env, int dir_fd, const std::string& seen, const std::string& token) {
  const std::string aside = std::string(kGcLeaseName) + ".stale." + token;
  Status moved = env->RenameAt(dir_fd, kGcLeaseName, dir_fd, aside);
  if (!moved.ok()) return moved.code() == ENOENT ? Result<bool>(false) : Result<bool>(moved);
  Result<std::string> got = ReadText(env, dir_fd, aside);
  const bool stale = got.ok() && *got == seen;
  if (!stale) {
    Status back = env->LinkAt(dir_fd, aside, dir_fd, kGcLeaseName, 0);
    if (!back.ok() && back.code() != EEXIST) return back.WithContext("putting back gc/lease");
  }
  RETURN_IF_ERROR(env->UnlinkAt(dir_fd, aside));
  return stale;
}

}  // namespace

Result<GcLeaseRecord> ReadGcLease(Env* env, int gc_dir_fd) {
  ASSIGN_OR_RETURN(std::string text, ReadText(env, gc_dir_fd, kGcLeaseName));
  std::optional<GcLeaseRecord> r = Decode(text);
  if (!r) return Status::Corruption("gc/lease is not a lease record");
  return *r;
}

Result<std::unique_ptr<GcLease>> GcLease::Acquire(Env* env, int gc_dir_fd, const std::string& holder,
                                                  uint64_t term_ns) {
  ASSIGN_OR_RETURN(UniqueFd dir, env->OpenAt(gc_dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  GcLeaseRecord mine{holder, ObjectIdHex(NewObjectId()), env->WallTimeNs() + term_ns};
  const std::string tmp = std::string(kGcLeaseName) + "." + mine.token + ".tmp";
  RETURN_IF_ERROR(WriteFile(env, dir.get(), tmp, Encode(mine)).WithContext("writing gc/" + tmp));
  Status result = Status::Error(EBUSY, "the GC lease gc/lease keeps changing hands; try again");
  for (int attempt = 0; attempt < kAcquireAttempts; ++attempt) {
    Status linked = env->LinkAt(dir.get(), tmp, dir.get(), kGcLeaseName, 0);
    if (linked.ok()) {
      result = Status::Ok();
      break;
    }
    if (linked.code() != EEXIST) {
      result = linked.WithContext("taking the GC lease gc/lease");
      break;
    }
    Result<std::string> seen = ReadText(env, dir.get(), kGcLeaseName);
    if (!seen.ok() && seen.status().code() == ENOENT) continue;  // released meanwhile
    if (!seen.ok()) {
      result = seen.status().WithContext("reading gc/lease");
      break;
    }
    if (!Expired(env, dir.get(), *seen, env->WallTimeNs(), term_ns)) {
      result = Status::Error(EBUSY, HeldMessage(*seen));
      break;
    }
    Result<bool> taken = TakeOverStale(env, dir.get(), *seen, mine.token);
    if (!taken.ok()) {
      result = taken.status();
      break;
    }
    if (*taken) spdlog::info("gc: took over the expired GC lease ({})", *seen);
  }
  (void)env->UnlinkAt(dir.get(), tmp);
  if (!result.ok()) return result;
  return std::unique_ptr<GcLease>(new GcLease(env, std::move(dir), std::move(mine), term_ns));
}

Status GcLease::Hold() {
  if (!held_) return Status::Error(ENOLCK, "the GC lease was lost earlier");
  Result<std::string> text = ReadText(env_, dir_.get(), kGcLeaseName);
  std::optional<GcLeaseRecord> now_there = text.ok() ? Decode(*text) : std::nullopt;
  const uint64_t now = env_->WallTimeNs();
  if (!now_there || now_there->token != mine_.token || now >= mine_.expires_ns) {
    held_ = false;
    return Status::Error(ENOLCK, "lost the GC lease gc/lease" +
                                     (now_there && now_there->token != mine_.token
                                          ? " to " + now_there->holder
                                          : std::string(now >= mine_.expires_ns ? " (it expired)" : "")) +
                                     "; stopped deleting");
  }
  // Renewing is a rename over the record, safe only while nobody may take
  // it over: not in the last moments of the term, whatever the clocks say.
  if (mine_.expires_ns - now < term_ns_ / 8) {
    held_ = false;
    return Status::Error(ENOLCK, "the GC lease gc/lease was about to expire before it was renewed; stopped deleting");
  }
  if (mine_.expires_ns - now < term_ns_ / 2) return Renew();
  return Status::Ok();
}

// Replaces the record by rename, which is safe because it is unexpired and
// ours: nobody takes over a lease before it expires.
Status GcLease::Renew() {
  GcLeaseRecord next = mine_;
  next.expires_ns = env_->WallTimeNs() + term_ns_;
  const std::string tmp = std::string(kGcLeaseName) + "." + mine_.token + ".tmp";
  RETURN_IF_ERROR(WriteFileAtomically(env_, dir_.get(), kGcLeaseName, Encode(next), kPrivateFileMode,
                                      Durability::kDataAndName, tmp)
                      .WithContext("renewing the GC lease"));
  mine_ = next;
  return Status::Ok();
}

Status GcLease::Release() {
  if (!held_) return Status::Ok();
  held_ = false;
  Result<std::string> text = ReadText(env_, dir_.get(), kGcLeaseName);
  std::optional<GcLeaseRecord> there = text.ok() ? Decode(*text) : std::nullopt;
  // An expired lease may be another's by now; it is left for the next taker.
  if (!there || there->token != mine_.token || env_->WallTimeNs() >= mine_.expires_ns) return Status::Ok();
  Status s = env_->UnlinkAt(dir_.get(), kGcLeaseName);
  return s.ok() || s.code() == ENOENT ? Status::Ok() : s.WithContext("releasing the GC lease");
}

GcLease::~GcLease() {
  if (Status s = Release(); !s.ok()) spdlog::warn("gc: {} (it expires on its own)", s.message());
}

}  // namespace ckptfs
