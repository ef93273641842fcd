// A stub is the backing-namespace file that stands for one user-visible
// regular file. Its inode carries the user's metadata (mode, owner, times,
// xattrs, hard links); its bytes say where the content lives.
//
// Layout (docs/FORMAT.md, "Stub"): two 64-byte slots. An update writes the
// slot the current record does not occupy, so a torn write can only damage
// the slot being written; readers take the valid slot with the higher gen.
// A zero-length stub is an empty file (what O_CREAT leaves behind).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "base/status.h"
#include "base/env.h"
#include "store/object_id.h"

namespace ckptfs {

enum class StubState : uint8_t {
  kSealed = 1,  // content is pack `object` (0: empty file)
  kStaged = 2,  // content is staging file `object`, not yet sealed
};

struct StubRecord {
  uint64_t gen = 0;
  StubState state = StubState::kSealed;
  uint64_t size = 0;  // logical size in bytes (for kStaged: size at last stub write, informational)
  ObjectId object = 0;
  // Cluster mode (docs/ARCHITECTURE.md "Cluster mode"): a staged record
  // names the node whose staging directory holds `object` (NodeId of its
  // name; 0 in a single-node store), and `closed` says its writer closed it:
  // `size` is final, and other nodes wait for the seal instead of hiding it.
  uint64_t node = 0;
  bool closed = false;
  bool operator==(const StubRecord&) const = default;
};

inline constexpr size_t kStubSlotSize = 64;
inline constexpr size_t kStubFileSize = 2 * kStubSlotSize;
inline constexpr uint16_t kStubFormatVersion = 1;
inline constexpr char kStubMagic[4] = {'C', 'K', 'S', 'T'};
// Seed of the slot checksum (last 8 bytes of a slot, over the first 56).
inline constexpr uint64_t kSeedStub = 0x53545542ull;  // "STUB"

// Pure encode/decode of one slot (no I/O), exposed for tests and fsck.
void EncodeStubSlot(const StubRecord& rec, std::span<uint8_t, kStubSlotSize> out);
Result<StubRecord> DecodeStubSlot(std::span<const uint8_t, kStubSlotSize> in);

// Reads the current record. Empty stub -> {gen 0, sealed, size 0, object 0}.
// Both slots invalid -> Corruption.
Result<StubRecord> ReadStub(Env* env, int stub_fd);

// The current record, and what is wrong with the other slot when it is
// neither valid nor all zero. Such a slot may have held the newer record
// (a flipped bit), so what it named cannot be known: recovery and gc then
// delete nothing (docs/ARCHITECTURE.md, "Recovery").
struct StubSlots {
  StubRecord current;
  std::string damaged;  // empty: the other slot is valid or was never written
};
Result<StubSlots> ReadStubSlots(Env* env, int stub_fd);
// Writes `rec` with gen = current.gen + 1 into the free slot; returns the
// record as written. Does not fsync: callers decide when durability is owed.
Result<StubRecord> WriteStub(Env* env, int stub_fd, const StubRecord& current, StubRecord rec);

}  // namespace ckptfs
