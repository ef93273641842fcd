// Element types of tensors found in checkpoint files. Shared by the format
// parsers (which find tensors) and the tensor codecs (which compress them).
#pragma once

#include <cstdint>
#include <string_view>

namespace ckptfs {

enum class DType : uint8_t {
  kUnknown = 0,
  kF64 = 1,
  kF32 = 2,
  kF16 = 3,
  kBF16 = 4,
  kF8E4M3 = 5,
  kF8E5M2 = 6,
  kI64 = 7,
  kI32 = 8,
  kI16 = 9,
  kI8 = 10,
  kU8 = 11,
  kBool = 12,
  kU16 = 13,
  kU32 = 14,
  kU64 = 15,
  kC64 = 16,   // complex64: two f32
  kC128 = 17,  // complex128: two f64
};

// Bytes per element; 0 for kUnknown.
constexpr unsigned DTypeSize(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
    case DType::kU64:
    case DType::kC64:
      return 8;
    case DType::kC128:
      return 16;
    case DType::kF32:
    case DType::kI32:
    case DType::kU32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
    case DType::kU16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
      return 1;
    case DType::kUnknown:
      return 0;
  }
  return 0;
}

constexpr bool DTypeIsFloat(DType t) {
  return t == DType::kF64 || t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF8E4M3 ||
         t == DType::kF8E5M2 || t == DType::kC64 || t == DType::kC128;
}

std::string_view DTypeName(DType t);

}  // namespace ckptfs
