// What the rANS encoder and decoder (rans_encode.cc, rans_decode.cc) share:
// the state range, the interleaving and the blob's modes.
#pragma once

#include <cstdint>

namespace ckptfs::lossless::rans {

// States live in [kL, kL << 8); byte-wise renormalization keeps them there.
// 32-bit states kept in [kL, 2^32) with 16-bit renormalization: one
// conditional word read per symbol, and eight interleaved states so the
// decoder's dependency chains overlap.
inline constexpr uint32_t kL = 1u << 16;
inline constexpr int kStates = 8;
inline constexpr uint8_t kModeRun = 0;
inline constexpr uint8_t kModeRans = 1;
// As kModeRans with one state instead of eight (RansEncodeCompact).
inline constexpr uint8_t kModeRansOneState = 2;
inline constexpr unsigned kListedSymbolsMax = 32;

}  // namespace ckptfs::lossless::rans
