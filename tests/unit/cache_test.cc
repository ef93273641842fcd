#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cache/chunk_cache.h"

namespace ckptfs {
namespace {

ChunkBytes Bytes(size_t n, uint8_t fill = 1) { return std::make_shared<const ChunkBuffer>(n, fill); }

TEST(ChunkCacheTest, GetPutAndCounters) {
  ChunkCache c(10000);
  EXPECT_EQ(c.Get({1, 0}), nullptr);
  c.Put({1, 0}, Bytes(100, 7));
  ChunkBytes b = c.Get({1, 0});
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->size(), 100u);
  EXPECT_EQ((*b)[0], 7);
  EXPECT_EQ(c.Get({1, 1}), nullptr);
  EXPECT_EQ(c.Get({2, 0}), nullptr);
  EXPECT_EQ(c.hits(), 1u);
  EXPECT_EQ(c.misses(), 3u);
  EXPECT_EQ(c.bytes(), 100u);
  EXPECT_EQ(c.capacity(), 10000u);
}

TEST(ChunkCacheTest, EvictsLeastRecentlyUsedByBytes) {
  ChunkCache c(10000);
  c.Put({1, 0}, Bytes(3000));
  c.Put({1, 1}, Bytes(3000));
  c.Put({1, 2}, Bytes(3000));
  ASSERT_NE(c.Get({1, 0}), nullptr);  // 0 is now the most recent; 1 the oldest
  c.Put({1, 3}, Bytes(3000));
  EXPECT_EQ(c.Get({1, 1}), nullptr);
  EXPECT_NE(c.Get({1, 0}), nullptr);
  EXPECT_NE(c.Get({1, 2}), nullptr);
  EXPECT_NE(c.Get({1, 3}), nullptr);
  EXPECT_EQ(c.bytes(), 9000u);
  // One big entry pushes out several small ones.
  c.Put({2, 0}, Bytes(7000));
  EXPECT_LE(c.bytes(), 10000u);
  EXPECT_NE(c.Get({2, 0}), nullptr);
}

// A chunk whose bytes were all handed on goes before any chunk that still
// has bytes to give, however recently it was used.
TEST(ChunkCacheTest, SpentChunksAreEvictedFirst) {
  ChunkCache c(300);
  c.Put({1, 0}, Bytes(100));
  c.Put({1, 1}, Bytes(100));
  c.Put({1, 2}, Bytes(100));
  c.NoteRead({1, 2}, 0, 60);
  c.NoteRead({1, 2}, 60, 100);  // spent
  c.NoteRead({1, 1}, 0, 99);    // one byte left to give
  ASSERT_NE(c.Get({1, 2}), nullptr);
  c.Put({1, 3}, Bytes(100));
  EXPECT_EQ(c.Get({1, 2}), nullptr);
  EXPECT_NE(c.Get({1, 0}), nullptr);
  EXPECT_NE(c.Get({1, 1}), nullptr);
  // Among chunks with bytes to give, plain LRU: 3 was used least recently.
  c.Put({1, 4}, Bytes(100));
  EXPECT_EQ(c.Get({1, 3}), nullptr);
  EXPECT_EQ(c.bytes(), 300u);
  // Spent chunks are still served, and ErasePack drops them as well.
  c.NoteRead({1, 4}, 0, 100);
  EXPECT_NE(c.Get({1, 4}), nullptr);
  c.ErasePack(1);
  EXPECT_EQ(c.bytes(), 0u);
  EXPECT_EQ(c.Get({1, 4}), nullptr);
  c.NoteRead({1, 9}, 0, 100);  // not cached: nothing to do
}

TEST(ChunkCacheTest, UnreadListsWholePagesNotHandedOn) {
  constexpr uint64_t P = ChunkCache::kUnreadPage;
  ChunkCache c(100 * P);
  c.Put({1, 0}, Bytes(10 * P + 100));  // the last page is short
  ASSERT_EQ(c.Unread({1, 0}).size(), 1u);
  EXPECT_EQ(c.Unread({1, 0})[0].end, 10 * P + 100);
  c.NoteRead({1, 0}, 2 * P, 4 * P);         // pages 2 and 3
  c.NoteRead({1, 0}, 6 * P + 1, 8 * P);     // page 6 only in part: still unread; page 7
  c.NoteRead({1, 0}, 9 * P, 10 * P + 100);  // page 9 and the short one
  const std::vector<ChunkCache::Range> unread = c.Unread({1, 0});
  ASSERT_EQ(unread.size(), 3u);
  EXPECT_EQ(unread[0].begin, 0u);
  EXPECT_EQ(unread[0].end, 2 * P);
  EXPECT_EQ(unread[1].begin, 4 * P);
  EXPECT_EQ(unread[1].end, 7 * P);
  EXPECT_EQ(unread[2].begin, 8 * P);
  EXPECT_EQ(unread[2].end, 9 * P);
  EXPECT_TRUE(c.Unread({1, 5}).empty());  // not cached
  c.NoteRead({1, 0}, 0, 2 * P);
  c.NoteRead({1, 0}, 4 * P, 7 * P);
  c.NoteRead({1, 0}, 8 * P, 9 * P);
  EXPECT_TRUE(c.Unread({1, 0}).empty());
}

TEST(ChunkCacheTest, EvictingAChunkWithUnreadPagesHandsThemOn) {
  constexpr uint64_t P = ChunkCache::kUnreadPage;
  ChunkCache c(8 * P);
  struct Seen {
    ChunkKey key;
    ChunkBytes bytes;
    std::vector<ChunkCache::Range> unread;
  };
  std::vector<Seen> seen;
  c.SetEvictUnread([&](const ChunkKey& key, ChunkBytes bytes, std::vector<ChunkCache::Range> unread) {
    seen.push_back(Seen{key, std::move(bytes), std::move(unread)});
  });
  c.Put({1, 0}, Bytes(4 * P, 5));
  c.Put({1, 1}, Bytes(4 * P, 6));
  c.NoteRead({1, 0}, 0, P);      // half read
  c.NoteRead({1, 1}, 0, 4 * P);  // spent: evicted first, nothing to hand on
  c.Put({1, 2}, Bytes(4 * P, 7));
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(c.Get({1, 1}), nullptr);
  c.Put({1, 3}, Bytes(4 * P, 8));  // evicts chunk 0, three pages unread
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].key, (ChunkKey{1, 0}));
  ASSERT_NE(seen[0].bytes, nullptr);
  EXPECT_EQ((*seen[0].bytes)[0], 5);
  ASSERT_EQ(seen[0].unread.size(), 1u);
  EXPECT_EQ(seen[0].unread[0].begin, P);
  EXPECT_EQ(seen[0].unread[0].end, 4 * P);
  EXPECT_EQ(c.Get({1, 0}), nullptr);
  // ErasePack drops chunks without handing them on: their pack is gone.
  c.ErasePack(1);
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(c.bytes(), 0u);
}

TEST(ChunkCacheTest, ReplaceAdjustsBytes) {
  ChunkCache c(10000);
  c.Put({1, 0}, Bytes(3000));
  c.Put({1, 0}, Bytes(500, 9));
  EXPECT_EQ(c.bytes(), 500u);
  EXPECT_EQ((*c.Get({1, 0}))[0], 9);
}

TEST(ChunkCacheTest, OversizedChunkIsNotCached) {
  ChunkCache c(1000);
  c.Put({1, 0}, Bytes(500));
  c.Put({1, 0}, Bytes(1001));  // replaces, but cannot be kept
  EXPECT_EQ(c.Get({1, 0}), nullptr);
  EXPECT_EQ(c.bytes(), 0u);
  c.Put({1, 1}, Bytes(1000));  // exactly the capacity fits
  EXPECT_NE(c.Get({1, 1}), nullptr);
}

TEST(ChunkCacheTest, ErasePackDropsOnlyThatPack) {
  ChunkCache c(100000);
  for (uint64_t i = 0; i < 5; ++i) {
    c.Put({7, i}, Bytes(100));
    c.Put({8, i}, Bytes(100));
  }
  c.ErasePack(7);
  EXPECT_EQ(c.bytes(), 500u);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(c.Get({7, i}), nullptr);
    EXPECT_NE(c.Get({8, i}), nullptr);
  }
}

TEST(ChunkCacheTest, EvictedBytesStayValidForHolders) {
  ChunkCache c(100);
  c.Put({1, 0}, Bytes(100, 3));
  ChunkBytes held = c.Get({1, 0});
  c.Put({1, 1}, Bytes(100, 4));
  EXPECT_EQ(c.Get({1, 0}), nullptr);
  EXPECT_EQ((*held)[99], 3);
}

TEST(ChunkCacheTest, ConcurrentUseStaysBounded) {
  ChunkCache c(50000);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&c, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        ChunkKey k{static_cast<uint64_t>(t % 2), i % 97};
        if (ChunkBytes b = c.Get(k); b == nullptr) c.Put(k, Bytes(1000 + (i % 7) * 100));
        if (i % 500 == 0) c.ErasePack(static_cast<uint64_t>(t % 2));
        EXPECT_LE(c.bytes(), c.capacity());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(c.bytes(), 50000u);
  EXPECT_EQ(c.hits() + c.misses(), 8000u);
}

// Concurrent misses on one key share one load. The loader returns only once
// every thread has arrived at GetOrLoad, so each thread either waits on the
// pending load or, arriving after it, finds the chunk cached (it is cached
// before the pending entry goes): never a second load, with no timing.
TEST(ChunkCacheTest, ConcurrentMissesShareOneLoad) {
  constexpr int kThreads = 8;
  ChunkCache c(1 << 20);
  std::atomic<int> arrived{0}, loads{0};
  std::vector<ChunkBytes> got(kThreads);
  auto load = [&]() -> Result<ChunkBytes> {
    ++loads;
    while (arrived.load() < kThreads) std::this_thread::yield();
    return Bytes(4096, 9);
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ++arrived;
      Result<ChunkBytes> r = c.GetOrLoad({5, 1}, load);
      if (r.ok()) got[i] = r.value();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(loads.load(), 1);
  for (const ChunkBytes& b : got) EXPECT_EQ(b, got[0]);
  ASSERT_NE(got[0], nullptr);
  EXPECT_EQ((*got[0])[0], 9);
  EXPECT_EQ(c.bytes(), 4096u);
}

// A failed load reaches every waiter and is not cached: the next call loads again.
TEST(ChunkCacheTest, FailedLoadIsSharedAndNotCached) {
  constexpr int kThreads = 4;
  ChunkCache c(1 << 20);
  std::atomic<int> arrived{0}, failures{0};
  auto failing = [&]() -> Result<ChunkBytes> {
    while (arrived.load() < kThreads) std::this_thread::yield();
    return Status::Error(EIO, "checksum mismatch");
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      ++arrived;
      Result<ChunkBytes> r = c.GetOrLoad({6, 0}, failing);
      if (!r.ok() && r.status().code() == EIO) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), kThreads);
  EXPECT_EQ(c.bytes(), 0u);
  Result<ChunkBytes> again = c.GetOrLoad({6, 0}, [] { return Result<ChunkBytes>(Bytes(10, 3)); });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again.value())[0], 3);
}

}  // namespace
}  // namespace ckptfs
