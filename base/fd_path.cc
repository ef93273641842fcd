#include <unistd.h>

#include "base/env.h"

namespace ckptfs {

std::string FdPathForLog(int fd) {
  char buf[4096];
  const ssize_t n = ::readlink(ProcFdPath(fd).c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : ProcFdPath(fd);
}

}  // namespace ckptfs
