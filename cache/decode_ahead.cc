#include "cache/decode_ahead.h"

#include <algorithm>
#include <utility>

namespace ckptfs {

void DecodeAhead::Start() {
  if (started_.exchange(true)) return;
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
}

DecodeAhead::~DecodeAhead() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    queue_.clear();
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void DecodeAhead::Queue(const ChunkKey& key, uint64_t bytes, Load load, uint64_t distance) {
  if (threads_ == 0 || !started_ || cache_->Contains(key)) return;
  // Into room that holds nothing still to be read (free, or spent chunks),
  // up to the budget: a chunk decoded ahead that evicts one a reader left
  // half read makes that one decode twice (torch.load's jumps leave many).
  // When there is none, still the next chunk per thread: a decode into a
  // full cache evicts such a chunk whoever does it, and without one running
  // ahead, a reader that waits for each record before it asks for the next
  // (torch.load) and the daemon take turns.
  const uint64_t unspent = cache_->UnspentBytes();
  const uint64_t room = cache_->capacity() - std::min(cache_->capacity(), unspent);
  const uint64_t threads = static_cast<uint64_t>(threads_);
  {
    std::lock_guard lk(mu_);
    if (stop_ || pending_.contains(key)) return;
    // Beyond both the reader decodes on its own thread, as without decode-ahead.
    const bool in_room = pending_bytes_ + bytes <= std::min(BudgetBytes(), room);
    const bool next_up = distance < threads && pending_bytes_ + bytes <= std::min(BudgetBytes(), bytes * threads);
    if (!in_room && !next_up) return;
    pending_.insert(key);
    pending_bytes_ += bytes;
    queue_.push_back(Job{key, bytes, std::move(load)});
  }
  wake_.notify_one();
}

void DecodeAhead::Work() {
  std::unique_lock lk(mu_);
  for (;;) {
    wake_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lk.unlock();
    // A failure is not reported here: the reader's own load repeats it and
    // returns the error to the application.
    (void)cache_->GetOrLoad(job.key, job.load);
    job.load = nullptr;  // release the pack before taking the lock
    lk.lock();
    --busy_;
    ++decoded_;
    pending_.erase(job.key);
    pending_bytes_ -= job.bytes;
    if (queue_.empty() && busy_ == 0) idle_.notify_all();
  }
}

uint64_t DecodeAhead::WindowChunks(uint64_t chunk_bytes, int depth) const {
  if (threads_ == 0 || !started_ || chunk_bytes == 0) return 0;
  int streams = 0;
  {
    std::lock_guard lk(mu_);
    streams = std::max(streams_, 1);
  }
  const uint64_t per_chunk = chunk_bytes * static_cast<uint64_t>(1 + std::max(depth, 0));
  return std::min<uint64_t>(kMaxWindow, BudgetBytes() / (per_chunk * static_cast<uint64_t>(streams)));
}

uint64_t DecodeAhead::decoded() const {
  std::lock_guard lk(mu_);
  return decoded_;
}

void DecodeAhead::WaitIdle() {
  std::unique_lock lk(mu_);
  idle_.wait(lk, [&] { return queue_.empty() && busy_ == 0; });
}

DecodeAhead::Stream::~Stream() {
  if (!counted_) return;
  std::lock_guard lk(pool_->mu_);
  --pool_->streams_;
}

bool DecodeAhead::Stream::InRun() {
  std::lock_guard lk(mu_);
  return run_start_ == 0 || next_ - run_start_ >= 3;
}

uint64_t DecodeAhead::Lookahead(uint64_t start, uint64_t run, uint64_t window) {
  if (start == 0) return window;
  if (run < 3) return 0;
  return run - 2 >= 63 ? window : std::min<uint64_t>(window, uint64_t{1} << (run - 2));
}

std::vector<uint64_t> DecodeAhead::Stream::Advance(uint64_t pack, uint64_t first, uint64_t last, uint64_t chunk_count,
                                                   uint64_t chunk_bytes, int depth) {
  std::lock_guard lk(mu_);
  if (!std::exchange(counted_, true)) {
    std::lock_guard plk(pool_->mu_);
    ++pool_->streams_;
  }
  if (pack != pack_) {  // another file, or a new version of this one
    pack_ = pack;
    next_ = 0;
    queued_to_ = 0;
    run_start_ = 0;
  }
  // The kernel's readahead sends a file's reads from several threads, a
  // little out of order: a read of the chunk before counts as in sequence.
  const bool sequential = first + 1 >= next_ && first <= std::max(queued_to_, next_ + 1);
  if (!sequential) {
    run_start_ = first;
    next_ = last + 1;
    queued_to_ = last + 1;
    return {};
  }
  next_ = std::max(next_, last + 1);
  const uint64_t ahead = Lookahead(run_start_, next_ - run_start_, pool_->WindowChunks(chunk_bytes, depth));
  const uint64_t from = std::max(queued_to_, last + 1);
  const uint64_t to = std::min(chunk_count, last + 1 + ahead);
  std::vector<uint64_t> out;
  for (uint64_t i = from; i < to; ++i) out.push_back(i);
  queued_to_ = std::max(queued_to_, to);
  return out;
}

}  // namespace ckptfs
