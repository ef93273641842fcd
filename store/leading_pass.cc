#include "store/leading_pass.h"

#include <algorithm>

namespace ckptfs {

LeadingPass::LeadingPass(uint64_t size, uint32_t chunk_size)
    : size_(size), chunk_size_(chunk_size), chunks_(chunk_size == 0 ? 0 : (size + chunk_size - 1) / chunk_size) {}

void LeadingPass::MarkDone(uint64_t chunk) {
  done_.insert(chunk);
  while (!done_.empty() && *done_.begin() == done_through_) {
    done_.erase(done_.begin());
    ++done_through_;
  }
}

Status LeadingPass::RunThrough(uint64_t end, const ChunkFn& run) {
  if (chunk_size_ == 0) return Status::Ok();
  const uint64_t target = std::min(chunks_, end / chunk_size_ + (end % chunk_size_ != 0 ? 1 : 0));
  std::unique_lock lock(mu_);
  wanted_ = std::max(wanted_, target);
  for (;;) {
    if (!failure_.ok()) return failure_;
    if (next_ < wanted_) {
      const uint64_t c = next_++;
      lock.unlock();
      const uint64_t off = c * chunk_size_;
      Status st = run(off, std::min<uint64_t>(chunk_size_, size_ - off));
      lock.lock();
      if (!st.ok()) {
        if (failure_.ok()) failure_ = std::move(st);
        next_ = chunks_;  // nobody starts another chunk
      } else {
        MarkDone(c);
      }
      done_cv_.notify_all();
      continue;
    }
    if (done_through_ >= target) return Status::Ok();
    done_cv_.wait(lock);
  }
}

}  // namespace ckptfs
