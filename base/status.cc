#include "base/status.h"

#include <cstring>

namespace ckptfs {

Status Status::FromErrno(std::string what) { return FromErrno(errno, std::move(what)); }

Status Status::FromErrno(int err, std::string what) {
  if (err == 0) err = EIO;
  return Status(err, std::move(what) + ": " + std::strerror(err));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return message_;
}

Status Status::WithContext(const std::string& ctx) const {
  if (ok()) return *this;
  return Status(code_, ctx + ": " + message_);
}

}  // namespace ckptfs
