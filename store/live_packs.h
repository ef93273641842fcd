// The mark of garbage collection, shared by recovery's sweep (one node) and
// cluster GC: packs that something names, and, transitively, the bases they
// store chunks against. Where the packs and their bases come from (a
// directory listing, a pack store) is the caller's.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/object_id.h"

namespace ckptfs::internal {

// What the mark learns of one pack.
struct PackBases {
  bool exists = false;
  // nullopt: the pack exists but its references cannot be read (the lookup
  // reports why); its bases stay unmarked, and the caller must not sweep.
  std::optional<std::vector<ObjectId>> bases;
  std::string where;  // names the pack as the one needing its bases
};
using PackBasesLookup = std::function<PackBases(ObjectId id)>;
// A pack that is needed (by `needer`) but does not exist.
using MissingPack = std::function<void(ObjectId id, const std::string& needer)>;

// Marks each root (pack, who needs it) and, transitively, its bases.
std::unordered_set<ObjectId> MarkLive(std::vector<std::pair<ObjectId, std::string>> roots,
                                      const PackBasesLookup& lookup, const MissingPack& missing);

}  // namespace ckptfs::internal
