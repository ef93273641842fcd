#include <unistd.h>

#include <string>

#include "store/store.h"

namespace ckptfs {

Status Store::RecordOwnerPid() {
  if (!lock_.valid()) return Status::Ok();
  const std::string pid = std::to_string(::getpid()) + "\n";
  RETURN_IF_ERROR(env_->Ftruncate(lock_.get(), 0));
  return env_->PWriteAll(lock_.get(), std::span(reinterpret_cast<const uint8_t*>(pid.data()), pid.size()), 0);
}

}  // namespace ckptfs
