// What a seal does in cluster mode so that cluster GC never deletes a pack
// it uses (docs/ARCHITECTURE.md, "Cluster mode: GC"). A pin file,
// nodes/NODE/pins/<random>.pin, lists the id of the seal's new pack and of
// every pack it stores chunks against, one hex id a line, each made visible
// (fdatasync) before the pack is used. A base is used only if, after it is
// pinned, gc/doomed/<ID> does not exist and the pack still does: GC deletes
// only packs it marked doomed in an earlier run, before it read the pins.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "base/unique_fd.h"
#include "store/delta_planner.h"
#include "base/env.h"
#include "store/object_id.h"

namespace ckptfs {

inline constexpr char kGcDirName[] = "gc";
inline constexpr char kGcDoomedDirName[] = "doomed";  // gc/doomed/<16 hex digits>
inline constexpr char kPinSuffix[] = ".pin";

// One seal's pin file; removed when the SealPin is destroyed (the seal is
// over: its stub names the new pack durably, or the seal was abandoned).
class SealPin {
 public:
  // A new pin file in `pins_dir_fd`, which must outlive the pin.
  static Result<std::unique_ptr<SealPin>> Create(Env* env, int pins_dir_fd);
  SealPin(const SealPin&) = delete;
  SealPin& operator=(const SealPin&) = delete;
  ~SealPin();
  // Appends `ids`; they are visible to other nodes when this returns.
  Status Add(std::span<const ObjectId> ids);
  const std::string& name() const { return name_; }

 private:
  SealPin(Env* env, int dir_fd, std::string name, UniqueFd fd)
      : env_(env), dir_fd_(dir_fd), name_(std::move(name)), fd_(std::move(fd)) {}

  Env* env_;
  int dir_fd_;
  std::string name_;
  UniqueFd fd_;
  std::mutex mu_;
  uint64_t end_ = 0;
};

// The pack ids a pin file lists. A last line without its newline is one
// being appended: its pack is not used yet (the seal checks it first), so
// it is skipped, as are lines that are not ids.
std::vector<ObjectId> ParsePinFile(const std::string& text);

// Admits the bases of one seal, shared by its planners (thread-safe): a
// pack is admitted when it and every pack it depends on (its bases,
// transitively) are pinned, then found not doomed and present. A pack that
// is not admitted is not used; the chunk is coded without it.
class PinnedBases : public BaseAdmission {
 public:
  struct Probe {
    // The packs `id` stores chunks against (its meta block's bases).
    std::function<Result<std::vector<ObjectId>>(ObjectId id)> bases_of;
    // Not doomed and present: usable as a base from now on.
    std::function<bool(ObjectId id)> usable;
  };
  PinnedBases(SealPin* pin, Probe probe) : pin_(pin), probe_(std::move(probe)) {}
  bool Admit(ObjectId pack) override;

 private:
  bool AdmitLocked(ObjectId pack);

  SealPin* pin_;
  Probe probe_;
  std::mutex mu_;
  std::unordered_map<ObjectId, bool> decided_;
};

// A testing aid (-o seal_hold=PATH): returns once `path` does not exist,
// or `cancel` is set (a seal of a deleted file).
void WaitWhileExists(Env* env, const std::string& path, const std::atomic<bool>* cancel = nullptr);

}  // namespace ckptfs
