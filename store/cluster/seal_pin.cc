#include "store/cluster/seal_pin.h"

#include <fcntl.h>

#include <chrono>
#include <thread>
#include <unordered_set>

#include "base/log.h"
#include "store/private_store.h"

namespace ckptfs {

Result<std::unique_ptr<SealPin>> SealPin::Create(Env* env, int pins_dir_fd) {
  const std::string name = ObjectIdHex(NewObjectId()) + kPinSuffix;
  Result<UniqueFd> fd = env->OpenAt(pins_dir_fd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, kPrivateFileMode);
  if (!fd.ok()) return fd.status().WithContext("creating the seal's pin file pins/" + name);
  return std::unique_ptr<SealPin>(new SealPin(env, pins_dir_fd, name, std::move(fd).value()));
}

SealPin::~SealPin() {
  fd_.reset();
  if (Status s = env_->UnlinkAt(dir_fd_, name_); !s.ok() && s.code() != ENOENT) {
    // A leftover pin keeps its packs until this node's lease ends and GC
    // collects the pins of dead nodes.
    spdlog::warn("cannot remove pin file pins/{}: {}", name_, s.message());
  }
}

Status SealPin::Add(std::span<const ObjectId> ids) {
  if (ids.empty()) return Status::Ok();
  std::string lines;
  for (ObjectId id : ids) lines += ObjectIdHex(id) + "\n";
  std::lock_guard lk(mu_);
  const std::span bytes(reinterpret_cast<const uint8_t*>(lines.data()), lines.size());
  RETURN_IF_ERROR(env_->PWriteAll(fd_.get(), bytes, end_).WithContext("writing pin file pins/" + name_));
  end_ += lines.size();
  return env_->Fdatasync(fd_.get()).WithContext("writing pin file pins/" + name_);
}

std::vector<ObjectId> ParsePinFile(const std::string& text) {
  std::vector<ObjectId> ids;
  size_t pos = 0;
  for (size_t nl = text.find('\n'); nl != std::string::npos; pos = nl + 1, nl = text.find('\n', pos)) {
    if (std::optional<ObjectId> id = ParseObjectIdHex(text.substr(pos, nl - pos)); id && *id != 0) ids.push_back(*id);
  }
  return ids;
}

bool PinnedBases::Admit(ObjectId pack) {
  std::lock_guard lk(mu_);
  return AdmitLocked(pack);
}

bool PinnedBases::AdmitLocked(ObjectId pack) {
  if (auto it = decided_.find(pack); it != decided_.end()) return it->second;
  // Everything a read of `pack` decodes, so that none of it can go while
  // the new pack, which will need it too, is being written.
  std::vector<ObjectId> closure;
  std::unordered_set<ObjectId> seen;
  std::vector<ObjectId> todo{pack};
  bool ok = true;
  while (ok && !todo.empty()) {
    const ObjectId id = todo.back();
    todo.pop_back();
    if (!seen.insert(id).second) continue;
    closure.push_back(id);
    Result<std::vector<ObjectId>> bases = probe_.bases_of(id);
    ok = bases.ok();
    if (ok) todo.insert(todo.end(), bases->begin(), bases->end());
  }
  if (ok) {
    if (Status s = pin_->Add(closure); !s.ok()) {
      spdlog::warn("sealing without base pack {}: {}", ObjectIdHex(pack), s.message());
      ok = false;
    }
  }
  for (size_t i = 0; ok && i < closure.size(); ++i) ok = probe_.usable(closure[i]);
  if (ok) {
    for (ObjectId id : closure) decided_.emplace(id, true);
  } else {
    spdlog::debug("not using pack {} as a base: it or one of its bases is doomed, gone or unreadable",
                  ObjectIdHex(pack));
  }
  decided_[pack] = ok;
  return ok;
}

void WaitWhileExists(Env* env, const std::string& path, const std::atomic<bool>* cancel) {
  if (path.empty()) return;
  bool logged = false;
  while (env->FstatAt(AT_FDCWD, path, 0).ok() && (cancel == nullptr || !cancel->load())) {
    if (!logged) spdlog::info("seal_hold: a seal waits while {} exists", path);
    logged = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace ckptfs
