// A RADOS pool in memory, for tests of packs in RADOS without a cluster:
// objects by namespace and name, their bytes, xattrs and mtimes, and
// faults to inject (a failing write or remove).
#pragma once

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "store/cluster/rados_client.h"

namespace ckptfs::test {

struct FakeRadosPool {
  struct Object {
    std::vector<uint8_t> bytes;
    std::map<std::string, std::string> xattrs;
    uint64_t mtime_ns = 0;
  };
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, Object> objects;  // (namespace, name)
  uint64_t clock_ns = 1'000'000'000;
  // Faults: the write with this index (counted from 0 over the pool's
  // life) fails with write_errno without writing; removes fail with
  // remove_errno when it is set.
  int fail_write_index = -1;
  int write_errno = EIO;
  int remove_errno = 0;
  // What happened.
  int writes = 0;
  std::vector<std::string> written;  // the object of each write that succeeded, in order
  int started_reads = 0;
  std::vector<std::string> connected_namespaces;

  Object* Find(const std::string& ns, const std::string& name) {
    auto it = objects.find({ns, name});
    return it == objects.end() ? nullptr : &it->second;
  }
};

class FakePendingRead : public RadosPendingRead {
 public:
  explicit FakePendingRead(Result<size_t> r) : r_(std::move(r)) {}
  Result<size_t> Wait() override { return r_; }

 private:
  Result<size_t> r_;
};

class FakeRadosClient : public RadosClient {
 public:
  FakeRadosClient(std::shared_ptr<FakeRadosPool> pool, std::string ns) : pool_(std::move(pool)), ns_(std::move(ns)) {}

  Status Write(const std::string& obj, uint64_t off, std::span<const uint8_t> bytes,
               const RadosWriteExtras& extras) override {
    std::lock_guard lk(pool_->mu);
    if (pool_->writes++ == pool_->fail_write_index) return Status::Error(pool_->write_errno, "injected write fault");
    FakeRadosPool::Object* o = pool_->Find(ns_, obj);
    if (o != nullptr && extras.create_exclusive) return Status::Error(EEXIST, "object exists");
    if (o == nullptr) o = &pool_->objects[{ns_, obj}];
    if (o->bytes.size() < off + bytes.size()) o->bytes.resize(off + bytes.size());
    std::copy(bytes.begin(), bytes.end(), o->bytes.begin() + off);
    if (!extras.xattr_name.empty()) o->xattrs[extras.xattr_name] = extras.xattr_value;
    o->mtime_ns = pool_->clock_ns++;
    pool_->written.push_back(obj);
    return Status::Ok();
  }
  Result<size_t> Read(const std::string& obj, uint64_t off, std::span<uint8_t> out) override {
    std::lock_guard lk(pool_->mu);
    FakeRadosPool::Object* o = pool_->Find(ns_, obj);
    if (o == nullptr) return Status::Error(ENOENT, "no object " + obj);
    if (off >= o->bytes.size()) return size_t{0};
    const size_t n = std::min<size_t>(out.size(), o->bytes.size() - off);
    std::copy_n(o->bytes.begin() + off, n, out.begin());
    return n;
  }
  std::unique_ptr<RadosPendingRead> StartRead(const std::string& obj, uint64_t off, std::span<uint8_t> into) override {
    {
      std::lock_guard lk(pool_->mu);
      ++pool_->started_reads;
    }
    return std::make_unique<FakePendingRead>(Read(obj, off, into));
  }
  Result<RadosObjectStat> Stat(const std::string& obj) override {
    std::lock_guard lk(pool_->mu);
    FakeRadosPool::Object* o = pool_->Find(ns_, obj);
    if (o == nullptr) return Status::Error(ENOENT, "no object " + obj);
    return RadosObjectStat{o->bytes.size(), o->mtime_ns};
  }
  Result<std::string> GetXattr(const std::string& obj, const std::string& name) override {
    std::lock_guard lk(pool_->mu);
    FakeRadosPool::Object* o = pool_->Find(ns_, obj);
    if (o == nullptr) return Status::Error(ENOENT, "no object " + obj);
    auto it = o->xattrs.find(name);
    if (it == o->xattrs.end()) return Status::Error(ENODATA, "no xattr " + name);
    return it->second;
  }
  Status Remove(const std::string& obj) override {
    std::lock_guard lk(pool_->mu);
    if (pool_->remove_errno != 0) return Status::Error(pool_->remove_errno, "injected remove fault");
    return pool_->objects.erase({ns_, obj}) ? Status::Ok() : Status::Error(ENOENT, "no object " + obj);
  }
  Result<std::vector<std::string>> List() override {
    std::lock_guard lk(pool_->mu);
    std::vector<std::string> names;
    for (const auto& [key, o] : pool_->objects) {
      if (key.first == ns_) names.push_back(key.second);
    }
    return names;
  }

 private:
  std::shared_ptr<FakeRadosPool> pool_;
  std::string ns_;
};

// A connector for StoreOptions::connect_rados that serves `pool`.
inline RadosConnector FakeRadosConnector(std::shared_ptr<FakeRadosPool> pool) {
  return [pool](const std::string&, const std::string&, const std::string& ns) -> Result<std::unique_ptr<RadosClient>> {
    {
      std::lock_guard lk(pool->mu);
      pool->connected_namespaces.push_back(ns);
    }
    return std::unique_ptr<RadosClient>(std::make_unique<FakeRadosClient>(pool, ns));
  };
}

}  // namespace ckptfs::test
