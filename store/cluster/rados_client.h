// The few librados calls the store makes, behind an interface of their own
// so that tests can fake a RADOS pool in memory (tests/unit/fake_rados.h).
// One client serves one pool and one RADOS namespace, and is safe to call
// from several threads at once, as librados's io context is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"

namespace ckptfs {

struct RadosObjectStat {
  uint64_t size = 0;
  uint64_t mtime_ns = 0;
};

// What else one write does, in the same atomic operation as the write.
struct RadosWriteExtras {
  bool create_exclusive = false;  // EEXIST when the object exists already
  std::string xattr_name;         // set when not empty
  std::string xattr_value;
};

// A read started by RadosClient::StartRead, into a buffer the caller keeps
// until this is destroyed (which waits for the read when it is in flight).
class RadosPendingRead {
 public:
  virtual ~RadosPendingRead() = default;
  // Waits for the read: the bytes read, fewer than asked at the object's end.
  virtual Result<size_t> Wait() = 0;
};

class RadosClient {
 public:
  virtual ~RadosClient() = default;
  // Errors carry the errno librados returned.
  virtual Status Write(const std::string& obj, uint64_t off, std::span<const uint8_t> bytes,
                       const RadosWriteExtras& extras) = 0;
  // The bytes read, fewer than asked at the object's end.
  virtual Result<size_t> Read(const std::string& obj, uint64_t off, std::span<uint8_t> out) = 0;
  virtual std::unique_ptr<RadosPendingRead> StartRead(const std::string& obj, uint64_t off, std::span<uint8_t> into) = 0;
  virtual Result<RadosObjectStat> Stat(const std::string& obj) = 0;  // ENOENT when absent
  virtual Result<std::string> GetXattr(const std::string& obj, const std::string& name) = 0;  // ENODATA when unset
  virtual Status Remove(const std::string& obj) = 0;                                          // ENOENT when absent
  virtual Result<std::vector<std::string>> List() = 0;  // every object of the namespace
};

// Makes a client for `pool`, objects in RADOS namespace `ns`, of the
// cluster `ceph_conf` describes. StoreOptions::connect_rados can replace it.
using RadosConnector = std::function<Result<std::unique_ptr<RadosClient>>(
    const std::string& ceph_conf, const std::string& pool, const std::string& ns)>;

// The real one, through librados (store/cluster/librados_client.cc), which
// loads librados.so.2 on first use and fails with what to install when it
// is absent. Built with -DCKPTFS_WITH_RADOS=OFF (librados_client_none.cc),
// it always fails, saying so.
Result<std::unique_ptr<RadosClient>> ConnectLibrados(const std::string& ceph_conf, const std::string& pool,
                                                     const std::string& ns);

// Whether this build has the RADOS client (ckptfs --version lists "rados").
bool BuiltWithRados();

}  // namespace ckptfs
