// An in-memory SiblingSource whose files can arrive while a lookup waits.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "codec/formats/layout.h"
#include "codec/lossy/siblings.h"

namespace ckptfs::test {

class MemSiblings : public SiblingSource {
 public:
  explicit MemSiblings(std::string own) : own_(std::move(own)) {}
  void Put(const std::string& name, std::vector<uint8_t> b) {
    std::lock_guard<std::mutex> lock(mu_);
    files_[name] = std::make_shared<std::vector<uint8_t>>(std::move(b));
  }
  std::vector<std::string> Candidates() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++rounds;
    looked_.notify_all();
    std::vector<std::string> out;
    for (const auto& [name, b] : files_) out.push_back(name);
    return out;
  }
  // Blocks until the caller has listed the siblings `n` times: a test puts
  // a file only once the code under test has looked and not found it.
  void WaitForRounds(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    looked_.wait(lock, [&] { return rounds.load() >= n; });
  }
  Result<std::shared_ptr<const ByteSource>> Open(const std::string& name) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(name);
    if (it == files_.end()) return Status::Error(ENOENT, name);
    // Keeps the bytes alive with the source.
    struct Owning : SpanSource {
      explicit Owning(std::shared_ptr<std::vector<uint8_t>> b) : SpanSource(*b), keep(std::move(b)) {}
      std::shared_ptr<std::vector<uint8_t>> keep;
    };
    return std::shared_ptr<const ByteSource>(std::make_shared<Owning>(it->second));
  }
  std::string OwnName() override { return own_; }
  // More may come for as long as the caller waits (Put from another thread).
  bool WaitForMore() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return true;
  }
  std::atomic<int> rounds{0};

 private:
  std::condition_variable looked_;
  std::string own_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<std::vector<uint8_t>>> files_;
};

}  // namespace ckptfs::test
