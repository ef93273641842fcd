// Helpers composed of Env calls only, so FaultEnv reaches every step of
// them. Each replaced copies that differed in their bounds and syncing.
#include <fcntl.h>

#include <cerrno>

#include "base/env.h"

namespace ckptfs {

namespace {

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

Result<std::string> ReadFdToString(Env* env, int fd, size_t max_bytes) {
  // One byte past the bound tells "exactly max" from "more than max".
  std::string text(max_bytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    std::span<uint8_t> rest(reinterpret_cast<uint8_t*>(text.data()) + got, text.size() - got);
    ASSIGN_OR_RETURN(size_t n, env->PRead(fd, rest, got));
    if (n == 0) break;
    got += n;
  }
  if (got > max_bytes) {
    return Status::Error(EFBIG, FdPathForLog(fd) + " is larger than the " + std::to_string(max_bytes) +
                                    " bytes such a file holds; it is damaged or not ckptfs's");
  }
  text.resize(got);
  return text;
}

Result<std::string> ReadFileToString(Env* env, int dir_fd, const std::string& name, size_t max_bytes) {
  ASSIGN_OR_RETURN(UniqueFd fd, env->OpenAt(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  return ReadFdToString(env, fd.get(), max_bytes);
}

Status WriteNewFile(Env* env, int dir_fd, const std::string& name, std::string_view data, mode_t mode,
                    Durability durability) {
  {
    ASSIGN_OR_RETURN(UniqueFd fd, env->OpenAt(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, mode));
    RETURN_IF_ERROR(env->PWriteAll(fd.get(), Bytes(data), 0));
    if (durability != Durability::kNone) RETURN_IF_ERROR(env->Fdatasync(fd.get()));
  }
  if (durability == Durability::kDataAndName) return env->Fsync(dir_fd);
  return Status::Ok();
}

Status WriteFileAtomically(Env* env, int dir_fd, const std::string& name, std::string_view data, mode_t mode,
                           Durability durability, const std::string& tmp_name) {
  const std::string tmp = tmp_name.empty() ? name + ".tmp" : tmp_name;
  // The directory is synced once, after the rename.
  const Durability file_durability = durability == Durability::kNone ? Durability::kNone : Durability::kData;
  RETURN_IF_ERROR(WriteNewFile(env, dir_fd, tmp, data, mode, file_durability));
  RETURN_IF_ERROR(env->RenameAt(dir_fd, tmp, dir_fd, name));
  if (durability == Durability::kDataAndName) return env->Fsync(dir_fd);
  return Status::Ok();
}

Result<UniqueFd> EnsureDir(Env* env, int parent, const std::string& name, mode_t mode, Durability durability) {
  Status made = env->MkdirAt(parent, name, mode);
  if (!made.ok() && made.code() != EEXIST) return made.WithContext("creating directory " + name + "/");
  if (made.ok() && durability == Durability::kDataAndName) RETURN_IF_ERROR(env->Fsync(parent));
  return env->OpenAt(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

}  // namespace ckptfs
