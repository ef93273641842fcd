// DecodeAhead: which chunks a reader gets decoded ahead, that they land in
// the cache with the bytes their load gives, and that neither the window
// nor the cache outgrows the cache's budget, however many readers stream.
#include "cache/decode_ahead.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "cache/read_order.h"

namespace ckptfs {
namespace {

constexpr uint64_t kChunk = 1000;

DecodeAhead::Load Filled(uint64_t index, std::atomic<int>* loads = nullptr) {
  return [index, loads]() -> Result<ChunkBytes> {
    if (loads) ++*loads;
    return ChunkBytes(std::make_shared<const ChunkBuffer>(kChunk, static_cast<uint8_t>(index)));
  };
}

TEST(DecodeAheadTest, SequentialReaderGetsTheWindowAfterItsRead) {
  ChunkCache cache(16 * kChunk);  // budget: 8 chunks
  DecodeAhead pool(&cache, 2);
  pool.Start();
  DecodeAhead::Stream s(&pool);
  EXPECT_EQ(s.Advance(7, 0, 0, 100, kChunk, 0), (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  // Reads inside the chunk, or of the one before (out-of-order readahead), queue nothing new.
  EXPECT_TRUE(s.Advance(7, 0, 0, 100, kChunk, 0).empty());
  EXPECT_EQ(s.Advance(7, 1, 1, 100, kChunk, 0), (std::vector<uint64_t>{9}));
  // Never past the end of the file.
  EXPECT_EQ(s.Advance(7, 2, 95, 100, kChunk, 0), (std::vector<uint64_t>{96, 97, 98, 99}));
}

TEST(DecodeAheadTest, RandomReadsQueueNothingUntilTheyTurnSequential) {
  ChunkCache cache(16 * kChunk);
  DecodeAhead pool(&cache, 1);
  pool.Start();
  DecodeAhead::Stream s(&pool);
  EXPECT_TRUE(s.Advance(7, 50, 50, 100, kChunk, 0).empty());
  EXPECT_TRUE(s.Advance(7, 10, 10, 100, kChunk, 0).empty());
  EXPECT_TRUE(s.Advance(7, 11, 11, 100, kChunk, 0).empty());  // two chunks in: a record, maybe
  EXPECT_EQ(s.Advance(7, 12, 12, 100, kChunk, 0), (std::vector<uint64_t>{13, 14}));
  // Another pack (the file was rewritten) starts over.
  EXPECT_TRUE(s.Advance(8, 40, 40, 100, kChunk, 0).empty());
}

// torch.load's order: records of about a chunk each, read one at a time
// from far-apart places (nothing decoded ahead that the reader skips), then
// runs that skip one record now and then (still one sequential run).
TEST(DecodeAheadTest, JumpsGetNoLookaheadAndItDoublesAlongARun) {
  ChunkCache cache(64 * kChunk);  // budget: 32 chunks, window 16
  DecodeAhead pool(&cache, 2);
  pool.Start();
  DecodeAhead::Stream s(&pool);
  for (uint64_t record : {40u, 10u, 70u, 25u}) {
    EXPECT_TRUE(s.Advance(7, record, record, 100, kChunk, 0).empty()) << record;
    EXPECT_TRUE(s.Advance(7, record, record + 1, 100, kChunk, 0).empty()) << record;
  }
  // A run from chunk 50, reading a record of two chunks at a time and
  // skipping one chunk after every second record.
  EXPECT_TRUE(s.Advance(7, 50, 51, 100, kChunk, 0).empty());
  EXPECT_EQ(s.Advance(7, 52, 53, 100, kChunk, 0), (std::vector<uint64_t>{54, 55, 56, 57}));  // run of 4: 4 ahead
  // Skipped 54: a run of 7 chunks, the whole window ahead.
  const std::vector<uint64_t> more = s.Advance(7, 55, 56, 100, kChunk, 0);
  ASSERT_FALSE(more.empty());
  EXPECT_EQ(more.front(), 58u);
  EXPECT_EQ(more.back(), 56u + DecodeAhead::kMaxWindow);
  // Skipped 57, which was queued: still the same run.
  EXPECT_EQ(s.Advance(7, 58, 59, 100, kChunk, 0), (std::vector<uint64_t>{73, 74, 75}));
  // A skip past everything queued is a jump again.
  EXPECT_TRUE(s.InRun());
  EXPECT_TRUE(s.Advance(7, 90, 90, 100, kChunk, 0).empty());
  EXPECT_TRUE(s.Advance(7, 91, 91, 100, kChunk, 0).empty());
  EXPECT_FALSE(s.InRun());
}

TEST(DecodeAheadTest, WindowShrinksWithReadersAndDeltaDepth) {
  ChunkCache cache(64 * kChunk);  // budget: 32 chunks
  DecodeAhead pool(&cache, 2);
  pool.Start();
  EXPECT_EQ(pool.WindowChunks(kChunk, 0), DecodeAhead::kMaxWindow);
  EXPECT_EQ(pool.WindowChunks(kChunk, 3), 8u);  // each chunk brings three bases
  std::vector<std::unique_ptr<DecodeAhead::Stream>> streams;
  for (int i = 0; i < 8; ++i) {
    streams.push_back(std::make_unique<DecodeAhead::Stream>(&pool));
    (void)streams.back()->Advance(100 + i, 0, 0, 1, kChunk, 0);  // counted from the first read
  }
  EXPECT_EQ(pool.WindowChunks(kChunk, 0), 4u);
  EXPECT_EQ(pool.WindowChunks(kChunk, 1), 2u);
  streams.resize(2);
  EXPECT_EQ(pool.WindowChunks(kChunk, 0), 16u);
  EXPECT_EQ(pool.WindowChunks(100 * kChunk, 0), 0u);  // the cache holds no chunk to spare
}

TEST(DecodeAheadTest, QueuedChunksLandInTheCacheOnce) {
  ChunkCache cache(64 * kChunk);
  DecodeAhead pool(&cache, 2);
  pool.Start();
  std::atomic<int> loads{0};
  for (int round = 0; round < 3; ++round) {
    for (uint64_t i = 0; i < 10; ++i) pool.Queue({1, i}, kChunk, Filled(i, &loads));
  }
  pool.WaitIdle();
  EXPECT_EQ(loads.load(), 10);
  for (uint64_t i = 0; i < 10; ++i) {
    ChunkBytes b = cache.Get({1, i});
    ASSERT_NE(b, nullptr) << i;
    EXPECT_EQ(b->size(), kChunk);
    EXPECT_EQ((*b)[kChunk - 1], static_cast<uint8_t>(i));
  }
}

// Decode-ahead takes free room and spent chunks' room only: chunks a reader
// left half read stay until it comes back for them.
TEST(DecodeAheadTest, NeverEvictsChunksWithBytesStillToGive) {
  ChunkCache cache(8 * kChunk);  // budget: 4 chunks
  DecodeAhead pool(&cache, 2);
  pool.Start();
  for (uint64_t i = 0; i < 8; ++i) cache.Put({1, i}, *Filled(i)());
  std::atomic<int> loads{0};
  pool.Queue({2, 0}, kChunk, Filled(0, &loads));
  pool.WaitIdle();
  EXPECT_EQ(loads.load(), 0);
  cache.NoteRead({1, 3}, 0, kChunk);
  cache.NoteRead({1, 5}, 0, kChunk);
  for (uint64_t i = 0; i < 4; ++i) {
    pool.Queue({2, i}, kChunk, Filled(i, &loads));
    pool.WaitIdle();  // each decode lands before the next is asked for
  }
  EXPECT_EQ(loads.load(), 2);  // the room of the two spent chunks
  for (uint64_t i : {0u, 1u, 2u, 4u, 6u, 7u}) EXPECT_NE(cache.Get({1, i}), nullptr) << i;
  EXPECT_EQ(cache.UnspentBytes(), 8 * kChunk);
}

// A cache full of half-read chunks (torch.load's jumps) still gets the
// reader's next chunk per thread decoded ahead, one at a time per thread,
// and nothing further ahead.
TEST(DecodeAheadTest, HalfReadChunksLeaveTheNextChunkPerThread) {
  ChunkCache cache(8 * kChunk);
  DecodeAhead pool(&cache, 2);
  pool.Start();
  for (uint64_t i = 0; i < 8; ++i) {
    cache.Put({1, i}, *Filled(i)());
    cache.NoteRead({1, i}, 0, kChunk / 2);
  }
  std::atomic<int> loads{0};
  pool.Queue({2, 5}, kChunk, Filled(5, &loads), /*distance=*/2);  // beyond the threads
  pool.Queue({2, 6}, kChunk, Filled(6, &loads));                  // no distance given
  pool.WaitIdle();
  EXPECT_EQ(loads.load(), 0);
  for (uint64_t i = 0; i < 2; ++i) pool.Queue({2, i}, kChunk, Filled(i, &loads), i);
  pool.WaitIdle();
  EXPECT_EQ(loads.load(), 2);
  EXPECT_NE(cache.Get({2, 0}), nullptr);
  EXPECT_NE(cache.Get({2, 1}), nullptr);
  EXPECT_LE(cache.bytes(), 8 * kChunk);
}

// torch.load's order: the records after the one being read, in that order,
// each chunk once, never the current record's own chunks.
TEST(ReadOrderTest, ChunksOfTheNextRecordsInReadOrder) {
  // Records of 1.5 chunks at 0, 1500, 3000, 4500, 6000, read as 0, 3, 1, 4, 2.
  ReadOrder order({{0, 1500}, {4500, 6000}, {1500, 3000}, {6000, 7500}, {3000, 4500}});
  EXPECT_EQ(order.ChunksAfter(10, kChunk, 8, 16), (std::vector<uint64_t>{4, 5, 2, 6, 7, 3}));
  EXPECT_EQ(order.ChunksAfter(10, kChunk, 8, 3), (std::vector<uint64_t>{4, 5, 2}));
  // From record 3 (chunks 6-7), then 2 (chunks 3-4), in that order.
  EXPECT_EQ(order.ChunksAfter(6500, kChunk, 8, 16), (std::vector<uint64_t>{3, 4}));
  EXPECT_TRUE(order.ChunksAfter(4000, kChunk, 8, 16).empty());   // the last one read
  EXPECT_TRUE(order.ChunksAfter(9000, kChunk, 10, 16).empty());  // in no record
  EXPECT_TRUE(ReadOrder({{100, 200}}).ChunksAfter(50, kChunk, 1, 16).empty());
}

TEST(DecodeAheadTest, NoThreadsMeansNoDecodeAhead) {
  ChunkCache cache(64 * kChunk);
  DecodeAhead pool(&cache, 0);
  pool.Start();
  DecodeAhead::Stream s(&pool);
  EXPECT_TRUE(s.Advance(1, 0, 0, 100, kChunk, 0).empty());
  pool.Queue({1, 0}, kChunk, Filled(0));
  pool.WaitIdle();
  EXPECT_EQ(cache.Get({1, 0}), nullptr);
}

// The daemon forks after its Filesystem exists: threads start after that,
// and until then nothing is queued that no thread would ever decode.
TEST(DecodeAheadTest, NothingIsQueuedBeforeStart) {
  ChunkCache cache(64 * kChunk);
  DecodeAhead pool(&cache, 2);
  EXPECT_EQ(pool.WindowChunks(kChunk, 0), 0u);
  pool.Queue({1, 0}, kChunk, Filled(0));
  pool.WaitIdle();
  EXPECT_EQ(cache.Get({1, 0}), nullptr);
  pool.Start();
  pool.Queue({1, 0}, kChunk, Filled(0));
  pool.WaitIdle();
  EXPECT_NE(cache.Get({1, 0}), nullptr);
}

// Many readers queueing far more than fits: the cache never holds more than
// its limit, and what it holds is right.
TEST(DecodeAheadTest, ManyReadersStayWithinTheCacheLimit) {
  constexpr uint64_t kCapacity = 24 * kChunk;
  ChunkCache cache(kCapacity);
  DecodeAhead pool(&cache, 4);
  pool.Start();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> most{0};
  std::thread watch([&] {
    while (!done) {
      uint64_t b = cache.bytes();
      uint64_t m = most.load();
      while (b > m && !most.compare_exchange_weak(m, b)) {
      }
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> readers;
  std::atomic<int> wrong{0};
  for (uint64_t r = 0; r < 8; ++r) {
    readers.emplace_back([&, r] {
      DecodeAhead::Stream s(&pool);
      for (uint64_t i = 0; i < 200; ++i) {
        for (uint64_t next : s.Advance(r + 1, i, i, 200, kChunk, 1)) pool.Queue({r + 1, next}, kChunk, Filled(next));
        Result<ChunkBytes> got = cache.GetOrLoad({r + 1, i}, Filled(i));
        if (!got.ok() || (*got.value())[0] != static_cast<uint8_t>(i)) ++wrong;
      }
    });
  }
  for (auto& t : readers) t.join();
  pool.WaitIdle();
  done = true;
  watch.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(most.load(), kCapacity);
  EXPECT_LE(cache.bytes(), kCapacity);
  EXPECT_GT(pool.decoded(), 0u);
}

}  // namespace
}  // namespace ckptfs
