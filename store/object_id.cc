#include "store/object_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>

namespace ckptfs {

// getrandom draws from the kernel CSPRNG: no seeding, no shared state, and
// a restarted daemon cannot replay an earlier sequence of names.
ObjectId NewObjectId() {
  for (;;) {
    ObjectId id = 0;
    ssize_t n = ::getrandom(&id, sizeof(id), 0);
    if (n == static_cast<ssize_t>(sizeof(id)) && id != 0) return id;
    // EINTR or a (practically impossible) zero draw: try again.
  }
}

std::string ObjectIdHex(ObjectId id) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(id));
  return std::string(buf, 16);
}

// Strict: exactly 16 lowercase hex digits and non-zero, so a stray file in
// packs/ or staging/ is never mistaken for an object.
std::optional<ObjectId> ParseObjectIdHex(const std::string& s) {
  if (s.size() != 16) return std::nullopt;
  ObjectId id = 0;
  for (char c : s) {
    int v;
    if (c >= '0' && c <= '9') {
      v = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      v = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    id = (id << 4) | static_cast<ObjectId>(v);
  }
  if (id == 0) return std::nullopt;
  return id;
}

}  // namespace ckptfs
