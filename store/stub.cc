#include "store/stub.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>
#include <string>

#include "base/hash.h"
#include "base/le.h"

namespace ckptfs {
namespace {

// Slot layout (64 bytes, little-endian):
//   0 magic "CKST" | 4 u16 version | 6 u8 state | 7 u8 flags (bit 0: closed)
//   8 u64 gen | 16 u64 size | 24 u64 object | 32 u64 node | 40..55 zero | 56 u64 checksum
constexpr size_t kOffVersion = 4;
constexpr size_t kOffState = 6;
constexpr size_t kOffFlags = 7;
constexpr uint8_t kFlagClosed = 1;
constexpr size_t kOffGen = 8;
constexpr size_t kOffSize = 16;
constexpr size_t kOffObject = 24;
constexpr size_t kOffNode = 32;
constexpr size_t kOffChecksum = 56;

bool AllZero(std::span<const uint8_t> b) {
  return std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; });
}

}  // namespace

void EncodeStubSlot(const StubRecord& rec, std::span<uint8_t, kStubSlotSize> out) {
  std::fill(out.begin(), out.end(), 0);
  std::memcpy(out.data(), kStubMagic, sizeof(kStubMagic));
  le::Put16(out, kOffVersion, kStubFormatVersion);
  out[kOffState] = static_cast<uint8_t>(rec.state);
  le::Put64(out, kOffGen, rec.gen);
  le::Put64(out, kOffSize, rec.size);
  le::Put64(out, kOffObject, rec.object);
  out[kOffFlags] = rec.closed ? kFlagClosed : 0;
  le::Put64(out, kOffNode, rec.node);
  le::Put64(out, kOffChecksum, Checksum64(std::span<const uint8_t>(out.data(), kOffChecksum), kSeedStub));
}

Result<StubRecord> DecodeStubSlot(std::span<const uint8_t, kStubSlotSize> in) {
  if (std::memcmp(in.data(), kStubMagic, sizeof(kStubMagic)) != 0) return Status::Corruption("bad stub magic");
  uint64_t want = le::Get64(in, kOffChecksum);
  if (Checksum64(in.first(kOffChecksum), kSeedStub) != want) return Status::Corruption("stub checksum mismatch");
  uint16_t version = le::Get16(in, kOffVersion);
  if (version != kStubFormatVersion) {
    return Status::Corruption("stub format version " + std::to_string(version) + " is not supported (expected " +
                              std::to_string(kStubFormatVersion) + ")");
  }
  StubRecord rec;
  uint8_t state = in[kOffState];
  if (state != static_cast<uint8_t>(StubState::kSealed) && state != static_cast<uint8_t>(StubState::kStaged)) {
    return Status::Corruption("stub has unknown state " + std::to_string(state));
  }
  rec.state = static_cast<StubState>(state);
  rec.gen = le::Get64(in, kOffGen);
  rec.size = le::Get64(in, kOffSize);
  rec.object = le::Get64(in, kOffObject);
  rec.node = le::Get64(in, kOffNode);
  rec.closed = (in[kOffFlags] & kFlagClosed) != 0;
  if (rec.gen == 0) return Status::Corruption("stub slot has generation 0");
  if (rec.state == StubState::kStaged && rec.object == 0) {
    return Status::Corruption("staged stub names no staging object");
  }
  if (rec.state == StubState::kSealed && rec.object == 0 && rec.size != 0) {
    return Status::Corruption("sealed stub of " + std::to_string(rec.size) + " bytes names no pack");
  }
  return rec;
}

Result<StubRecord> ReadStub(Env* env, int stub_fd) {
  ASSIGN_OR_RETURN(StubSlots slots, ReadStubSlots(env, stub_fd));
  return slots.current;
}

Result<StubSlots> ReadStubSlots(Env* env, int stub_fd) {
  std::array<uint8_t, kStubFileSize> buf{};
  // On a shared store another node rewrites stubs in place, and a network
  // file system's client need not invalidate pages it cached (ceph-fuse
  // kept stale stubs for minutes): read from the file system, not the cache.
  (void)env->Fadvise(stub_fd, 0, 0, POSIX_FADV_DONTNEED);
  ASSIGN_OR_RETURN(size_t n, env->PRead(stub_fd, buf, 0));
  if (n == 0) return StubSlots{};  // what O_CREAT leaves: an empty file
  if (n < kStubSlotSize) {
    return Status::Corruption("stub is " + std::to_string(n) + " bytes long (expected 0, 64 or 128)");
  }
  const size_t slots = n / kStubSlotSize;
  std::optional<StubRecord> best;
  std::string why;
  for (size_t i = 0; i < slots; ++i) {
    std::span<const uint8_t, kStubSlotSize> slot(buf.data() + i * kStubSlotSize, kStubSlotSize);
    Result<StubRecord> rec = DecodeStubSlot(slot);
    if (rec.ok() && rec->gen % 2 != i) {
      rec = Status::Corruption("generation " + std::to_string(rec->gen) + " in wrong slot");
    }
    if (!rec.ok()) {
      if (!AllZero(slot)) why += " slot " + std::to_string(i) + ": " + rec.status().message() + ";";
      continue;
    }
    if (!best || rec->gen > best->gen) best = *rec;
  }
  if (best) {
    if (!why.empty()) why.pop_back();
    return StubSlots{*best, why.empty() ? "" : why.substr(1)};
  }
  // Slots are written at gen%2: the first record ever goes to slot 1, so
  // all-zero slots mean no record was written (e.g. the first stub write
  // never reached the file). That is an empty file, not damage.
  if (why.empty()) return StubSlots{};
  why.pop_back();
  return Status::Corruption("stub has no valid slot:" + why);
}

Result<StubRecord> WriteStub(Env* env, int stub_fd, const StubRecord& current, StubRecord rec) {
  rec.gen = current.gen + 1;
  std::array<uint8_t, kStubSlotSize> slot;
  EncodeStubSlot(rec, slot);
  RETURN_IF_ERROR(env->PWriteAll(stub_fd, slot, (rec.gen % 2) * kStubSlotSize));
  return rec;
}

}  // namespace ckptfs
