// Decodes chunks ahead of sequential readers on a pool of threads, into the
// decoded-chunk cache, so that a restore uses every core instead of the one
// FUSE thread that missed. Bounded by the cache's budget: the window each
// reader gets shrinks as more readers stream at once, so chunks decoded
// ahead are not evicted by other readers' before they are read.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <vector>

#include "cache/chunk_cache.h"

namespace ckptfs {

class DecodeAhead {
 public:
  using Load = std::function<Result<ChunkBytes>()>;

  // threads: decoding threads (0: none, Queue does nothing), from Start on.
  DecodeAhead(ChunkCache* cache, int threads) : cache_(cache), threads_(threads) {}
  ~DecodeAhead();
  DecodeAhead(const DecodeAhead&) = delete;
  DecodeAhead& operator=(const DecodeAhead&) = delete;
  // Starts the threads. Not part of the constructor: the daemon forks after
  // its Filesystem exists, and threads do not survive a fork (a mutex one of
  // them held would stay locked in the child). Until then nothing is queued.
  void Start();

  // A reader streaming through a file (one per open handle): counted from
  // its first read until it is closed, as the cache is shared by all.
  class Stream {
   public:
    explicit Stream(DecodeAhead* pool) : pool_(pool) {}
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    // A read of chunks [first, last] of the pack `pack`: returns the chunks
    // to decode ahead now (none unless the reads are sequential).
    // chunk_bytes: their decoded size; depth: the longest delta chain a
    // chunk reads through (each base chunk also takes cache space).
    // A read that skips forward by a chunk, or into what was already
    // queued, is still sequential: torch.load reads a zip's records in the
    // numeric order of their names, which skips the records whose names
    // sort between ("11" lies between "109" and "110"). After any other
    // jump the lookahead starts at nothing and doubles with each chunk the
    // reader goes on through: a reader that jumps from record to record
    // gets no chunk decoded that it skips over.
    std::vector<uint64_t> Advance(uint64_t pack, uint64_t first, uint64_t last, uint64_t chunk_count,
                                  uint64_t chunk_bytes, int depth);

    // Whether the reader goes on through the file (from its start, or for
    // three chunks since its last jump) rather than jumping around.
    bool InRun();

   private:
    DecodeAhead* const pool_;
    std::mutex mu_;         // a handle's reads arrive on several FUSE threads
    bool counted_ = false;  // among the pool's streams since its first read
    uint64_t pack_ = 0;
    uint64_t next_ = 0;       // the chunk a sequential read would reach next
    uint64_t queued_to_ = 0;  // chunks below this were already queued
    uint64_t run_start_ = 0;  // the chunk this sequential run began at
  };
  // Chunks to decode ahead of a sequential run of `run` chunks that began
  // at chunk `start`, with `window` the most allowed: the whole window for
  // a reader that started at the file's beginning, else 2, 4, 8...
  // from the run's third chunk on.
  static uint64_t Lookahead(uint64_t start, uint64_t run, uint64_t window);

  // Decodes `key` with `load` on a pool thread unless the cache has it, is
  // loading it or it is queued already. Drops it when the queue is full,
  // or when decoding it would evict a chunk that still has bytes to give,
  // unless it is among the next `threads` chunks the reader needs and each
  // thread has at most one: `distance` counts the chunks the reader needs
  // before this one (0: the next).
  // bytes: its decoded size, counted against the budget until decoded.
  void Queue(const ChunkKey& key, uint64_t bytes, Load load, uint64_t distance = UINT64_MAX);
  // Chunks one stream may have decoded ahead of its reads.
  uint64_t WindowChunks(uint64_t chunk_bytes, int depth) const;
  int threads() const { return threads_; }
  // Decodes finished and queued so far (tests and stats).
  uint64_t decoded() const;
  // Waits until nothing is queued or decoding (tests).
  void WaitIdle();

  // The most chunks a single reader decodes ahead, when the cache allows it.
  static constexpr uint64_t kMaxWindow = 16;

 private:
  struct Job {
    ChunkKey key;
    uint64_t bytes = 0;
    Load load;
  };
  // Half the cache: the other half keeps what readers are reading now.
  uint64_t BudgetBytes() const { return cache_->capacity() / 2; }
  struct KeyHash {
    size_t operator()(const ChunkKey& k) const { return std::hash<uint64_t>()(k.pack * 1000003u ^ k.index); }
  };
  void Work();

  ChunkCache* const cache_;
  const int threads_;
  std::atomic<bool> started_{false};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable idle_;
  std::deque<Job> queue_;
  std::unordered_set<ChunkKey, KeyHash> pending_;  // queued or decoding
  int streams_ = 0;
  int busy_ = 0;
  uint64_t pending_bytes_ = 0;  // of the jobs queued or decoding
  uint64_t decoded_ = 0;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace ckptfs
