// RadosClient through librados's C API, loaded at run time: the binary and
// the .deb do not depend on librados (12 MB, plus boost and ibverbs) for an
// optional backend. Only a store with packs=rados:POOL loads librados.so.2;
// without it, that store's open fails and says what to install.
#include <dlfcn.h>
#include <rados/librados.h>

#include <algorithm>
#include <cstring>

#include "store/cluster/rados_client.h"

namespace ckptfs {
namespace {

constexpr char kLibradosSoname[] = "librados.so.2";

// Every librados function this file calls, resolved with dlsym; the types
// come from librados.h, so a mismatch is a compile error, not a crash.
// clang-format off
#define CKPTFS_LIBRADOS_FUNCTIONS(X)                                                                   \
  X(rados_create) X(rados_conf_read_file) X(rados_connect) X(rados_shutdown) X(rados_ioctx_create)    \
  X(rados_ioctx_destroy) X(rados_ioctx_set_namespace) X(rados_read) X(rados_stat) X(rados_getxattr)   \
  X(rados_remove) X(rados_create_write_op) X(rados_release_write_op) X(rados_write_op_create)          \
  X(rados_write_op_write) X(rados_write_op_setxattr) X(rados_write_op_operate)                         \
  X(rados_aio_create_completion2) X(rados_aio_read) X(rados_aio_wait_for_complete)                     \
  X(rados_aio_get_return_value) X(rados_aio_release) X(rados_nobjects_list_open)                       \
  X(rados_nobjects_list_next) X(rados_nobjects_list_close)
// clang-format on

struct Librados {
#define CKPTFS_DECLARE(name) decltype(&::name) name = nullptr;
  CKPTFS_LIBRADOS_FUNCTIONS(CKPTFS_DECLARE)
#undef CKPTFS_DECLARE
};

struct LoadedLibrados {
  Librados fns;
  Status status;
};

LoadedLibrados Load() {
  LoadedLibrados l;
  // Never closed: librados starts threads that outlive any one client.
  void* so = ::dlopen(kLibradosSoname, RTLD_NOW | RTLD_LOCAL);
  if (so == nullptr) {
    const char* why = ::dlerror();
    l.status = Status::Error(ELIBACC, std::string("packs=rados:POOL needs librados, and ") + kLibradosSoname +
                                          " cannot be loaded (" + (why ? why : "unknown error") +
                                          "): install it (Debian: apt install librados2)");
    return l;
  }
#define CKPTFS_RESOLVE(name)                                                                             \
  l.fns.name = reinterpret_cast<decltype(&::name)>(::dlsym(so, #name));                                 \
  if (l.fns.name == nullptr) {                                                                           \
    l.status = Status::Error(ELIBACC, std::string(kLibradosSoname) + " has no " #name                    \
                                      " (librados too old: ckptfs needs Ceph 14 or later)");             \
    return l;                                                                                            \
  }
  CKPTFS_LIBRADOS_FUNCTIONS(CKPTFS_RESOLVE)
#undef CKPTFS_RESOLVE
  return l;
}

// Loaded once, on first use, for the process's lifetime.
const LoadedLibrados& Lib() {
  static const LoadedLibrados loaded = Load();
  return loaded;
}

// Calls through the loaded library. Only after Lib().status is Ok.
const Librados& lib() { return Lib().fns; }

// librados returns -errno.
Status RadosError(int r, const std::string& what) { return Status::Error(-r, what + ": " + std::strerror(-r)); }

// rados_read's length is an int: large reads go in pieces of this.
constexpr size_t kMaxReadBytes = 64u << 20;

class LibradosPendingRead : public RadosPendingRead {
 public:
  LibradosPendingRead(rados_ioctx_t io, const std::string& obj, uint64_t off, std::span<uint8_t> into) {
    into = into.first(std::min(into.size(), kMaxReadBytes));
    int r = lib().rados_aio_create_completion2(nullptr, nullptr, &c_);
    if (r == 0) r = lib().rados_aio_read(io, obj.c_str(), c_, reinterpret_cast<char*>(into.data()), into.size(), off);
    if (r < 0) result_ = RadosError(r, "starting a read of " + obj);
    obj_ = obj;
  }
  ~LibradosPendingRead() override {
    if (c_ == nullptr) return;
    if (!waited_) lib().rados_aio_wait_for_complete(c_);
    lib().rados_aio_release(c_);
  }
  Result<size_t> Wait() override {
    if (!result_.ok() || waited_) return result_;
    lib().rados_aio_wait_for_complete(c_);
    waited_ = true;
    const int r = lib().rados_aio_get_return_value(c_);
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
    lib().rados_ioctx_destroy(io_);
    lib().rados_shutdown(cluster_);
  }

  Status Write(const std::string& obj, uint64_t off, std::span<const uint8_t> bytes,
               const RadosWriteExtras& extras) override {
    rados_write_op_t op = lib().rados_create_write_op();
    if (extras.create_exclusive) lib().rados_write_op_create(op, LIBRADOS_CREATE_EXCLUSIVE, nullptr);
    lib().rados_write_op_write(op, reinterpret_cast<const char*>(bytes.data()), bytes.size(), off);
    if (!extras.xattr_name.empty()) {
      lib().rados_write_op_setxattr(op, extras.xattr_name.c_str(), extras.xattr_value.data(), extras.xattr_value.size());
    }
    const int r = lib().rados_write_op_operate(op, io_, obj.c_str(), nullptr, 0);
    lib().rados_release_write_op(op);
    return r < 0 ? RadosError(r, "writing " + obj) : Status::Ok();
  }

  Result<size_t> Read(const std::string& obj, uint64_t off, std::span<uint8_t> out) override {
    const size_t len = std::min(out.size(), kMaxReadBytes);
    const int r = lib().rados_read(io_, obj.c_str(), reinterpret_cast<char*>(out.data()), len, off);
    if (r < 0) return RadosError(r, "reading " + obj);
    return static_cast<size_t>(r);
  }

  std::unique_ptr<RadosPendingRead> StartRead(const std::string& obj, uint64_t off, std::span<uint8_t> into) override {
    return std::make_unique<LibradosPendingRead>(io_, obj, off, into);
  }

  Result<RadosObjectStat> Stat(const std::string& obj) override {
    uint64_t size = 0;
    time_t mtime = 0;
    const int r = lib().rados_stat(io_, obj.c_str(), &size, &mtime);
    if (r < 0) return RadosError(r, "stat of " + obj);
    return RadosObjectStat{size, static_cast<uint64_t>(mtime) * 1000000000ull};
  }

  Result<std::string> GetXattr(const std::string& obj, const std::string& name) override {
    char buf[256];
    const int r = lib().rados_getxattr(io_, obj.c_str(), name.c_str(), buf, sizeof(buf));
    if (r < 0) return RadosError(r, "reading xattr " + name + " of " + obj);
    return std::string(buf, static_cast<size_t>(r));
  }

  Status Remove(const std::string& obj) override {
    const int r = lib().rados_remove(io_, obj.c_str());
    return r < 0 ? RadosError(r, "removing " + obj) : Status::Ok();
  }

  Result<std::vector<std::string>> List() override {
    rados_list_ctx_t ctx;
    int r = lib().rados_nobjects_list_open(io_, &ctx);
    if (r < 0) return RadosError(r, "listing objects");
    std::vector<std::string> names;
    const char* entry = nullptr;
    while ((r = lib().rados_nobjects_list_next(ctx, &entry, nullptr, nullptr)) == 0) names.emplace_back(entry);
    lib().rados_nobjects_list_close(ctx);
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
  RETURN_IF_ERROR(Lib().status);
  rados_t cluster = nullptr;
  int r = lib().rados_create(&cluster, nullptr);  // client.admin, as the ceph tools default to
  if (r < 0) return RadosError(r, "cannot create a RADOS client");
  auto fail = [&](int err, const std::string& what) {
    lib().rados_shutdown(cluster);
    return RadosError(err, what);
  };
  if ((r = lib().rados_conf_read_file(cluster, ceph_conf.c_str())) < 0) {
    return fail(r, "cannot read the Ceph configuration " + ceph_conf +
                       " (mount -o ceph_conf=PATH, or --ceph-conf PATH for fsck, gc and stats)");
  }
  if ((r = lib().rados_connect(cluster)) < 0) return fail(r, "cannot connect to the Ceph cluster of " + ceph_conf);
  rados_ioctx_t io = nullptr;
  if ((r = lib().rados_ioctx_create(cluster, pool.c_str(), &io)) < 0) {
    if (r == -ENOENT) return fail(r, "RADOS pool " + pool + " does not exist (create it: ceph osd pool create " + pool + ")");
    return fail(r, "cannot open RADOS pool " + pool);
  }
  lib().rados_ioctx_set_namespace(io, ns.c_str());
  return std::unique_ptr<RadosClient>(std::make_unique<LibradosClient>(cluster, io));
}

bool BuiltWithRados() { return true; }

}  // namespace ckptfs
