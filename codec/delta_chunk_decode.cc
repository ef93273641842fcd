#include "codec/delta_chunk.h"

#include <cstring>
#include <string>

#include "codec/delta_pieces.h"
#include "codec/element_ops.h"
#include "codec/lossless/byte_io.h"

namespace ckptfs {
namespace {

using delta::DeltaPiece;
using delta::XorBytes;
using lossless::ByteReader;

// In place: `io` holds the residual and receives the raw lanes.
template <typename U>
void UndiffLanes(const uint8_t* base, uint8_t* io, size_t n) {
  for (size_t i = 0; i < n; i += sizeof(U)) {
    U z, b;
    std::memcpy(&z, io + i, sizeof(U));
    std::memcpy(&b, base + i, sizeof(U));
    const U a = ops::UnZigZagAdd<U>(z, b);
    std::memcpy(io + i, &a, sizeof(U));
  }
}

void Undiff(unsigned w, const uint8_t* base, uint8_t* io, size_t n) {
  if (w == 2) UndiffLanes<uint16_t>(base, io, n);
  if (w == 4) UndiffLanes<uint32_t>(base, io, n);
  if (w == 8) UndiffLanes<uint64_t>(base, io, n);
}

// The int-diff piece table, checked so that the inverse stays inside the
// chunk and on whole lanes whatever the payload says.
Status ReadPieceTable(ByteReader* r, uint64_t len, std::vector<DeltaPiece>* pieces) {
  uint64_t count = 0;
  RETURN_IF_ERROR(r->Varint(&count, "int-diff piece count"));
  // A piece takes 3 payload bytes and 2 chunk bytes at least, which bounds
  // the count before anything is allocated.
  if (count > r->remaining() / 3 || count > len / 2) {
    return Status::Corruption("int-diff piece count " + std::to_string(count) + " too large");
  }
  pieces->resize(count);
  uint64_t pos = 0;
  for (DeltaPiece& p : *pieces) {
    uint8_t w = 0;
    RETURN_IF_ERROR(r->Varint(&p.begin, "int-diff piece begin"));
    RETURN_IF_ERROR(r->Varint(&p.end, "int-diff piece end"));
    RETURN_IF_ERROR(r->Byte(&w, "int-diff lane size"));
    const std::string where = "int-diff piece [" + std::to_string(p.begin) + ", " + std::to_string(p.end) + ")";
    if (w != 2 && w != 4 && w != 8) return Status::Corruption(where + ": lane size " + std::to_string(w));
    if (p.begin < pos || p.end <= p.begin || p.end > len) {
      return Status::Corruption(where + " out of order or outside the chunk of " + std::to_string(len));
    }
    if ((p.end - p.begin) % w != 0) return Status::Corruption(where + " is not whole lanes of " + std::to_string(w));
    p.width = w;
    pos = p.end;
  }
  return Status::Ok();
}

// Turns the residual in `io` back into the raw bytes.
void InvertResidual(std::span<const DeltaPiece> pieces, std::span<const uint8_t> base, std::span<uint8_t> io) {
  uint64_t pos = 0;
  for (const DeltaPiece& p : pieces) {
    XorBytes(io.data() + pos, base.data() + pos, io.data() + pos, p.begin - pos);
    Undiff(p.width, base.data() + p.begin, io.data() + p.begin, p.end - p.begin);
    pos = p.end;
  }
  XorBytes(io.data() + pos, base.data() + pos, io.data() + pos, io.size() - pos);
}

}  // namespace

Status DecodeDeltaChunk(std::span<const uint8_t> payload, std::span<const uint8_t> base, std::span<uint8_t> raw_out) {
  if (base.size() != raw_out.size()) {
    return Status::Corruption("delta chunk of " + std::to_string(raw_out.size()) + " bytes against a base of " +
                              std::to_string(base.size()));
  }
  ByteReader r(payload);
  uint8_t version = 0, kind = 0;
  RETURN_IF_ERROR(r.Byte(&version, "delta chunk version"));
  if (version != kDeltaChunkVersion) {
    return Status::Corruption("delta chunk version " + std::to_string(version) + " is not supported");
  }
  RETURN_IF_ERROR(r.Byte(&kind, "delta kind"));
  std::vector<DeltaPiece> pieces;
  if (kind == static_cast<uint8_t>(DeltaKind::kIntDiff)) {
    RETURN_IF_ERROR(ReadPieceTable(&r, raw_out.size(), &pieces));
  } else if (kind != static_cast<uint8_t>(DeltaKind::kXor)) {
    return Status::Corruption("delta kind " + std::to_string(kind));
  }
  RETURN_IF_ERROR(DecodeTensorChunk(r.Rest(), raw_out).WithContext("delta residual"));
  InvertResidual(pieces, base, raw_out);
  return Status::Ok();
}

}  // namespace ckptfs
