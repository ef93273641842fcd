// The order in which a reader is expected to visit a file's records when it
// is not the order they are stored in, so that decode-ahead can follow the
// reader instead of the file: torch.load asks for a zip's tensor records in
// the numeric order of their names (0, 1, 2, ...), while torch.save stores
// them sorted as strings (0, 1, 10, 100, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ckptfs {

class ReadOrder {
 public:
  struct Range {
    uint64_t begin = 0;
    uint64_t end = 0;  // one past
  };
  // `ranges`: the records in the order they will be read; non-overlapping.
  explicit ReadOrder(std::vector<Range> ranges);

  // Up to `max_chunks` chunks (of `chunk_bytes`, below `chunk_count`) of the
  // records read after the one holding `offset`, in that order, none of the
  // chunks of that record itself. Empty if no record holds `offset`.
  std::vector<uint64_t> ChunksAfter(uint64_t offset, uint64_t chunk_bytes, uint64_t chunk_count,
                                    uint64_t max_chunks) const;
  size_t size() const { return order_.size(); }

  // The most records ChunksAfter looks at past the current one.
  static constexpr size_t kMaxRecordsAhead = 1024;

 private:
  struct Start {
    uint64_t begin = 0;
    uint32_t rank = 0;
  };
  std::vector<Range> order_;
  std::vector<Start> by_offset_;  // sorted by begin
};

}  // namespace ckptfs
