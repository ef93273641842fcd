// Names of stored objects (packs, staging files). Ids are random 64-bit
// values so that a crash can never make a new object reuse an old name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ckptfs {

using ObjectId = uint64_t;  // 0 means "no object"

ObjectId NewObjectId();
std::string ObjectIdHex(ObjectId id);                            // 16 lowercase hex digits
std::optional<ObjectId> ParseObjectIdHex(const std::string& s);  // inverse; nullopt if malformed

}  // namespace ckptfs
