#include "store/live_packs.h"

namespace ckptfs::internal {

std::unordered_set<ObjectId> MarkLive(std::vector<std::pair<ObjectId, std::string>> roots,
                                      const PackBasesLookup& lookup, const MissingPack& missing) {
  std::unordered_set<ObjectId> live;
  std::vector<std::pair<ObjectId, std::string>> todo = std::move(roots);  // pack, who needs it
  while (!todo.empty()) {
    const auto [id, needer] = todo.back();
    todo.pop_back();
    if (!live.insert(id).second) continue;
    const PackBases pack = lookup(id);
    if (!pack.exists) {
      missing(id, needer);
      continue;
    }
    if (!pack.bases) continue;
    for (ObjectId b : *pack.bases) todo.emplace_back(b, pack.where);
  }
  return live;
}

}  // namespace ckptfs::internal
