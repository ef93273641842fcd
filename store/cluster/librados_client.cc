// RadosClient through librados's C API.
#include <rados/librados.h>

#include <algorithm>
#include <cstring>

#include "store/cluster/rados_client.h"

namespace ckptfs {
namespace {

// librados returns -errno.
Status RadosError(int r, const std::string& what) { return Status::Error(-r, what + ": " + std::strerror(-r)); }

// rados_read's length is an int: large reads go in pieces of this.
constexpr size_t kMaxReadBytes = 64u << 20;

class LibradosPendingRead : public RadosPendingRead {
 public:
  LibradosPendingRead(rados_ioctx_t io, const std::string& obj, uint64_t off, std::span<uint8_t> into) {
    into = into.first(std::min(into.size(), kMaxReadBytes));
    int r = rados_aio_create_completion2(nullptr, nullptr, &c_);
    if (r == 0) r = rados_aio_read(io, obj.c_str(), c_, reinterpret_cast<char*>(into.data()), into.size(), off);
    if (r < 0) result_ = RadosError(r, "starting a read of " + obj);
    obj_ = obj;
  }
  ~LibradosPendingRead() override {
    if (c_ == nullptr) return;
    if (!waited_) rados_aio_wait_for_complete(c_);
    rados_aio_release(c_);
  }
  Result<size_t> Wait() override {
    if (!result_.ok() || waited_) return result_;
    rados_aio_wait_for_complete(c_);
    waited_ = true;
    const int r = rados_aio_get_return_value(c_);
    result_ = r < 0 ? Result<size_t>(RadosError(r, "reading " + obj_)) : Result<size_t>(static_cast<size_t>(r));
    return result_;
  }

 private:
  rados_completion_t c_ = nullptr;
  std::string obj_;
  bool waited_ = false;
  Result<size_t> result_ = size_t{0};
};

class LibradosClient : public RadosClient {
 public:
  LibradosClient(rados_t cluster, rados_ioctx_t io) : cluster_(cluster), io_(io) {}
  ~LibradosClient() override {
    rados_ioctx_destroy(io_);
    rados_shutdown(cluster_);
  }

  Status Write(const std::string& obj, uint64_t off, std::span<const uint8_t> bytes,
               const RadosWriteExtras& extras) override {
    rados_write_op_t op = rados_create_write_op();
    if (extras.create_exclusive) rados_write_op_create(op, LIBRADOS_CREATE_EXCLUSIVE, nullptr);
    rados_write_op_write(op, reinterpret_cast<const char*>(bytes.data()), bytes.size(), off);
    if (!extras.xattr_name.empty()) {
      rados_write_op_setxattr(op, extras.xattr_name.c_str(), extras.xattr_value.data(), extras.xattr_value.size());
    }
    const int r = rados_write_op_operate(op, io_, obj.c_str(), nullptr, 0);
    rados_release_write_op(op);
    return r < 0 ? RadosError(r, "writing " + obj) : Status::Ok();
  }

  Result<size_t> Read(const std::string& obj, uint64_t off, std::span<uint8_t> out) override {
    const size_t len = std::min(out.size(), kMaxReadBytes);
    const int r = rados_read(io_, obj.c_str(), reinterpret_cast<char*>(out.data()), len, off);
    if (r < 0) return RadosError(r, "reading " + obj);
    return static_cast<size_t>(r);
  }

  std::unique_ptr<RadosPendingRead> StartRead(const std::string& obj, uint64_t off, std::span<uint8_t> into) override {
    return std::make_unique<LibradosPendingRead>(io_, obj, off, into);
  }

  Result<RadosObjectStat> Stat(const std::string& obj) override {
    uint64_t size = 0;
    time_t mtime = 0;
    const int r = rados_stat(io_, obj.c_str(), &size, &mtime);
    if (r < 0) return RadosError(r, "stat of " + obj);
    return RadosObjectStat{size, static_cast<uint64_t>(mtime) * 1000000000ull};
  }

  Result<std::string> GetXattr(const std::string& obj, const std::string& name) override {
    char buf[256];
    const int r = rados_getxattr(io_, obj.c_str(), name.c_str(), buf, sizeof(buf));
    if (r < 0) return RadosError(r, "reading xattr " + name + " of " + obj);
    return std::string(buf, static_cast<size_t>(r));
  }

  Status Remove(const std::string& obj) override {
    const int r = rados_remove(io_, obj.c_str());
    return r < 0 ? RadosError(r, "removing " + obj) : Status::Ok();
  }

  Result<std::vector<std::string>> List() override {
    rados_list_ctx_t ctx;
    int r = rados_nobjects_list_open(io_, &ctx);
    if (r < 0) return RadosError(r, "listing objects");
    std::vector<std::string> names;
    const char* entry = nullptr;
    while ((r = rados_nobjects_list_next(ctx, &entry, nullptr, nullptr)) == 0) names.emplace_back(entry);
    rados_nobjects_list_close(ctx);
    if (r != -ENOENT) return RadosError(r, "listing objects");
    return names;
  }

 private:
  rados_t cluster_;
  rados_ioctx_t io_;
};

}  // namespace

Result<std::unique_ptr<RadosClient>> ConnectLibrados(const std::string& ceph_conf, const std::string& pool,
                                                     const std::string& ns) {
  rados_t cluster = nullptr;
  int r = rados_create(&cluster, nullptr);  // client.admin, as the ceph tools default to
  if (r < 0) return RadosError(r, "cannot create a RADOS client");
  auto fail = [&](int err, const std::string& what) {
    rados_shutdown(cluster);
    return RadosError(err, what);
  };
  if ((r = rados_conf_read_file(cluster, ceph_conf.c_str())) < 0) {
    return fail(r, "cannot read the Ceph configuration " + ceph_conf +
                       " (mount -o ceph_conf=PATH, or --ceph-conf PATH for fsck, gc and stats)");
  }
  if ((r = rados_connect(cluster)) < 0) return fail(r, "cannot connect to the Ceph cluster of " + ceph_conf);
  rados_ioctx_t io = nullptr;
  if ((r = rados_ioctx_create(cluster, pool.c_str(), &io)) < 0) {
    if (r == -ENOENT) return fail(r, "RADOS pool " + pool + " does not exist (create it: ceph osd pool create " + pool + ")");
    return fail(r, "cannot open RADOS pool " + pool);
  }
  rados_ioctx_set_namespace(io, ns.c_str());
  return std::unique_ptr<RadosClient>(std::make_unique<LibradosClient>(cluster, io));
}

}  // namespace ckptfs
