// What the lossy codec's unit tests share (quantizer_test.cc, levels_test.cc,
// lossy_chunk_test.cc, file_coder_test.cc, sensitivity_test.cc,
// pack_meta_test.cc, lossy_xattrs_test.cc): floats as element bytes, seeded
// Gaussian tensors, and a pack meta carrying a lossy record.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "codec/lossy/float_bits.h"
#include "store/pack_meta.h"

namespace ckptfs::lossy {

inline std::vector<uint8_t> Floats(const std::vector<float>& v, DType t = DType::kF32) {
  std::vector<uint8_t> b(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) StoreBits(t, b.data(), i, FloatToBits(t, v[i]));
  return b;
}

inline std::vector<float> Normal(size_t n, float sigma, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

}  // namespace ckptfs::lossy

namespace ckptfs {

inline PackMeta MetaWithLossy() {
  PackMeta m;
  m.sealed_ns = 7;
  m.chunk_hash = {1, 2};
  m.chunk_depth = {0, 1};
  LossyInfo l;
  l.fidelity = 0.05f;
  l.roles[0] = {0.05f, 0.04f, 1000, 300};
  l.roles[2] = {0.5f, 0.25f, 800, 100};
  l.scope = lossy::LossyScope::kAll;
  l.sensitivity = SensitivityRule::kSibling;
  m.lossy = l;
  return m;
}

}  // namespace ckptfs
