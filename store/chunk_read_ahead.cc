#include "store/chunk_read_ahead.h"

#include <cstring>
#include <system_error>

namespace ckptfs {

ChunkReadAhead::~ChunkReadAhead() {
  for (Held& h : held_) h.done.wait();
}

void ChunkReadAhead::Start(uint64_t index, uint64_t off, size_t len) {
  std::lock_guard lk(mu_);
  if (index >= seen_.size() || seen_[index] || held_.size() >= kMaxHeld) return;
  std::unique_ptr<Early> early = SpareEarly();
  const std::span<uint8_t> room = early->room.Get(source_->RoomFor(len));
  if (room.empty() && len > 0) return;  // no memory: read when asked
  Early* e = early.get();
  try {
    std::future<void> done = std::async(std::launch::async, [this, e, room, off, len] {
      Result<std::span<const uint8_t>> got = source_->ReadIn(room, off, len);
      e->status = got.status();
      if (got.ok()) e->bytes = *got;
    });
    held_.push_back({index, std::move(early), std::move(done)});
    seen_[index] = true;
  } catch (const std::system_error&) {
    // No thread for it: the chunk is read when asked, as without read-ahead.
  }
}

std::unique_ptr<ChunkReadAhead::Early> ChunkReadAhead::SpareEarly() {
  if (spare_.empty()) return std::make_unique<Early>();
  std::unique_ptr<Early> e = std::move(spare_.back());
  spare_.pop_back();
  e->status = Status::Ok();
  e->bytes = {};
  return e;
}

bool ChunkReadAhead::TakeInto(uint64_t index, std::span<uint8_t> out) {
  std::vector<Held> mine;  // waited for outside the lock
  {
    std::lock_guard lk(mu_);
    if (index < seen_.size()) seen_[index] = true;
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->index == index || it->index + kStale < index) {
        mine.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  bool copied = false;
  for (Held& h : mine) {
    h.done.wait();
    if (h.index == index && h.early->status.ok() && h.early->bytes.size() == out.size()) {
      std::memcpy(out.data(), h.early->bytes.data(), out.size());
      copied = true;
    }
  }
  std::lock_guard lk(mu_);
  if (held_.empty()) {
    // Nothing read ahead is left: the pack's reader may stay open for long
    // (the open-pack cache), and its spare buffers with it.
    spare_.clear();
    return copied;
  }
  for (Held& h : mine) {
    if (spare_.size() < kMaxHeld) spare_.push_back(std::move(h.early));
  }
  return copied;
}

}  // namespace ckptfs
