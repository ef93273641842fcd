#include "codec/lossless/grid.h"

#include <algorithm>
#include <string>
#include <vector>

#include "codec/lossless/grid_format.h"

namespace ckptfs::lossless {
namespace {

using grid::Fold;
using grid::kBias;
using grid::Scaled;
using grid::Unfold;

Status ReadTerms(ByteReader* r, std::vector<uint32_t>* terms, const char* what) {
  uint32_t prev = 0;
  for (uint32_t& t : *terms) {
    uint64_t z = 0;
    RETURN_IF_ERROR(r->Varint(&z, what));
    if (z >> 33) return Status::Corruption(std::string(what) + " delta out of range");
    const int64_t d = static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
    prev += static_cast<uint32_t>(d);
    t = prev;
  }
  return Status::Ok();
}

}  // namespace

uint64_t GridRows(uint64_t row_length, uint64_t first_col, uint64_t lanes) {
  return lanes == 0 ? 0 : (first_col + lanes + row_length - 1) / row_length;
}

void ApplyGrid(const GridModel& m, std::span<uint8_t> hi, std::span<uint8_t> lo, bool forward) {
  std::vector<uint16_t> col(m.col.size());
  for (size_t j = 0; j < col.size(); ++j) col[j] = Scaled(m.col[j]);
  const uint64_t n = hi.size();
  uint64_t i = 0, j = m.first_col;
  for (uint64_t r = 0; i < n; ++r, j = 0) {
    const uint64_t count = std::min(m.row_length - j, n - i);
    const uint16_t base = Scaled(m.row[r]);
    const uint16_t* c = col.data() + j;
    uint8_t* h = hi.data() + i;
    uint8_t* l = lo.data() + i;
    // Four loops, so that each is a straight line the compiler vectorises.
    if (forward && m.fold) {
      for (uint64_t k = 0; k < count; ++k) {
        const uint16_t v = Fold(static_cast<uint16_t>(((h[k] << 8) | l[k]) - static_cast<uint16_t>(base + c[k])));
        h[k] = static_cast<uint8_t>(v >> 8), l[k] = static_cast<uint8_t>(v);
      }
    } else if (forward) {
      for (uint64_t k = 0; k < count; ++k) {
        const uint16_t v = static_cast<uint16_t>(((h[k] << 8) | l[k]) - static_cast<uint16_t>(base + c[k]) + kBias);
        h[k] = static_cast<uint8_t>(v >> 8), l[k] = static_cast<uint8_t>(v);
      }
    } else if (m.fold) {
      for (uint64_t k = 0; k < count; ++k) {
        const uint16_t v = static_cast<uint16_t>(Unfold(static_cast<uint16_t>((h[k] << 8) | l[k])) + base + c[k]);
        h[k] = static_cast<uint8_t>(v >> 8), l[k] = static_cast<uint8_t>(v);
      }
    } else {
      for (uint64_t k = 0; k < count; ++k) {
        const uint16_t v = static_cast<uint16_t>(((h[k] << 8) | l[k]) + static_cast<uint16_t>(base + c[k]) - kBias);
        h[k] = static_cast<uint8_t>(v >> 8), l[k] = static_cast<uint8_t>(v);
      }
    }
    i += count;
  }
}

Status ReadGrid(ByteReader* r, uint64_t lanes, GridModel* m) {
  RETURN_IF_ERROR(r->Varint(&m->row_length, "grid row length"));
  RETURN_IF_ERROR(r->Varint(&m->first_col, "grid first column"));
  uint8_t fold = 0;
  RETURN_IF_ERROR(r->Byte(&fold, "grid fold"));
  if (fold > 1) return Status::Corruption("grid fold " + std::to_string(fold) + " is not 0 or 1");
  m->fold = fold == 1;
  // Every term takes at least one byte, which bounds what a corrupt header
  // can make us allocate by the blob's own size.
  if (m->row_length == 0 || m->row_length > r->remaining() || m->first_col >= m->row_length) {
    return Status::Corruption("grid of row length " + std::to_string(m->row_length) + ", first column " +
                              std::to_string(m->first_col) + " is invalid");
  }
  const uint64_t rows = GridRows(m->row_length, m->first_col, lanes);
  if (rows > r->remaining() - m->row_length) {
    return Status::Corruption("grid needs " + std::to_string(rows) + " row terms; blob is too short");
  }
  m->row.assign(rows, 0);
  m->col.assign(m->row_length, 0);
  RETURN_IF_ERROR(ReadTerms(r, &m->row, "grid row term"));
  return ReadTerms(r, &m->col, "grid column term");
}

}  // namespace ckptfs::lossless
