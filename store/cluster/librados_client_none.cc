// The build without RADOS (-DCKPTFS_WITH_RADOS=OFF, or no librados-dev when
// it was configured): a store with packs=rados:POOL cannot be opened, and
// says why. Directory and CephFS cluster mode need no RADOS and still work.
#include <cerrno>

#include "store/cluster/rados_client.h"

namespace ckptfs {

Result<std::unique_ptr<RadosClient>> ConnectLibrados(const std::string&, const std::string& pool, const std::string&) {
  return Status::Error(ENOTSUP,
                       "this ckptfs was built without RADOS support (-DCKPTFS_WITH_RADOS=OFF); packs=rados:" + pool +
                           " needs a build with it (install librados-dev, configure with "
                           "-DCKPTFS_WITH_RADOS=ON and build again), or a store with packs in a directory");
}

bool BuiltWithRados() { return false; }

}  // namespace ckptfs
