// Flax msgpack checkpoints (flax.serialization.to_bytes, and what Orbax's
// and flax.training.checkpoints' msgpack handlers write): a msgpack map of
// the state tree in which each ndarray is an ext value of type 1 holding
// the msgpack array (shape, dtype name, raw bytes in C order). The file has
// no magic: it is "flax-msgpack" only when it parses as exactly one msgpack
// map, to its last byte, holding at least one such ndarray. Labels are the
// tree's key path joined by '.' ("params.Dense_0.kernel",
// "opt_state.0.mu.Dense_0.kernel"). Work is bounded: every item costs a
// byte of the file, nesting stops at kMaxMsgpackDepth, and binary payloads
// are skipped unread.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "codec/formats/layout.h"

namespace ckptfs::formats {

inline constexpr unsigned kMaxMsgpackDepth = 64;

// Cheap probe: the first byte starts a msgpack map.
bool LooksLikeMsgpackMap(std::span<const uint8_t> head);

Result<FileLayout> ParseFlaxMsgpack(const ByteSource& src);

// numpy dtype name (as ndarray.dtype.name gives it) -> our element type;
// kUnknown for anything else (object, str, 4-bit types).
DType NumpyNameToDType(std::string_view name);

}  // namespace ckptfs::formats
