#include "store/pack_meta.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "base/hash.h"
#include "base/le.h"

namespace ckptfs {
namespace {

constexpr char kMetaMagic[8] = {'C', 'K', 'P', 'T', 'M', 'E', 'T', 'A'};
constexpr size_t kFixed = 32;
constexpr size_t kTensorEntry = 17;
constexpr char kLossyMagic[4] = {'L', 'O', 'S', 'Y'};
constexpr uint32_t kLossyVersion = 2;
constexpr size_t kLossySizeV1 = 4 + 4 + 4 + 8 + 3 * 24;
constexpr size_t kLossySize = kLossySizeV1 + 4;  // + scope, sensitivity rule, padding
constexpr char kInputMagic[4] = {'I', 'N', 'P', 'T'};
constexpr uint32_t kInputVersion = 1;
constexpr size_t kInputSize = 4 + 4 + 3 * 8;

void PutF32(std::span<uint8_t> b, size_t at, float v) { le::Put32(b, at, std::bit_cast<uint32_t>(v)); }
float GetF32(std::span<const uint8_t> b, size_t at) { return std::bit_cast<float>(le::Get32(b, at)); }

void EncodeLossy(const LossyInfo& l, std::span<uint8_t> b) {
  std::memcpy(b.data(), kLossyMagic, 4);
  le::Put32(b, 4, kLossyVersion);
  PutF32(b, 8, l.fidelity);
  le::Put64(b, 12, l.exact_elements);
  for (size_t r = 0; r < 3; ++r) {
    PutF32(b, 20 + 24 * r, l.roles[r].target);
    PutF32(b, 24 + 24 * r, l.roles[r].max_error);
    le::Put64(b, 28 + 24 * r, l.roles[r].elements);
    le::Put64(b, 36 + 24 * r, l.roles[r].stored);
  }
  b[kLossySizeV1] = static_cast<uint8_t>(l.scope);
  b[kLossySizeV1 + 1] = static_cast<uint8_t>(l.sensitivity);
  b[kLossySizeV1 + 2] = static_cast<uint8_t>(l.measure);
  b[kLossySizeV1 + 3] = 0;
}

std::optional<LossyInfo> DecodeLossy(std::span<const uint8_t> b) {
  if (b.size() < kLossySizeV1 || std::memcmp(b.data(), kLossyMagic, 4) != 0) return std::nullopt;
  const uint32_t version = le::Get32(b, 4);
  if (!((version == 1 && b.size() == kLossySizeV1) || (version == 2 && b.size() == kLossySize))) return std::nullopt;
  LossyInfo l;
  l.fidelity = GetF32(b, 8);
  l.exact_elements = le::Get64(b, 12);
  for (size_t r = 0; r < 3; ++r) {
    l.roles[r].target = GetF32(b, 20 + 24 * r);
    l.roles[r].max_error = GetF32(b, 24 + 24 * r);
    l.roles[r].elements = le::Get64(b, 28 + 24 * r);
    l.roles[r].stored = le::Get64(b, 36 + 24 * r);
  }
  if (version == 2) {
    if (b[kLossySizeV1] > 1 || b[kLossySizeV1 + 1] > 3 || b[kLossySizeV1 + 2] > 1) return std::nullopt;
    l.scope = static_cast<lossy::LossyScope>(b[kLossySizeV1]);
    l.sensitivity = static_cast<SensitivityRule>(b[kLossySizeV1 + 1]);
    l.measure = static_cast<BudgetMeasure>(b[kLossySizeV1 + 2]);
  }
  return l;
}

void EncodeInput(const InputDigest& d, std::span<uint8_t> b) {
  std::memcpy(b.data(), kInputMagic, 4);
  le::Put32(b, 4, kInputVersion);
  le::Put64(b, 8, d.digest.low);
  le::Put64(b, 16, d.digest.high);
  le::Put64(b, 24, d.copy_of);
}

std::optional<InputDigest> DecodeInput(std::span<const uint8_t> b) {
  if (b.size() != kInputSize || std::memcmp(b.data(), kInputMagic, 4) != 0 || le::Get32(b, 4) != kInputVersion) {
    return std::nullopt;
  }
  return InputDigest{{le::Get64(b, 8), le::Get64(b, 16)}, le::Get64(b, 24)};
}

// How the optional sections split the bytes after the chunk depths: the
// lossy section (92 or 96 bytes) and the input section (32), each present
// or not; their sizes tell every combination apart.
bool SplitSections(size_t tail, size_t* lossy, size_t* input) {
  *input = tail >= kInputSize && (tail == kInputSize || tail - kInputSize == kLossySize ||
                                  tail - kInputSize == kLossySizeV1)
               ? kInputSize
               : 0;
  *lossy = tail - *input;
  return *lossy == 0 || *lossy == kLossySize || *lossy == kLossySizeV1;
}

}  // namespace

uint8_t PackMeta::max_depth() const {
  return chunk_depth.empty() ? 0 : *std::max_element(chunk_depth.begin(), chunk_depth.end());
}

uint64_t ChunkContentHash(std::span<const uint8_t> raw) { return XXH3_64bits(raw.data(), raw.size()); }

std::vector<uint8_t> EncodePackMeta(const PackMeta& m) {
  const size_t n = m.chunk_hash.size();
  const size_t lossy = m.lossy ? kLossySize : 0;
  const size_t input = m.input ? kInputSize : 0;
  std::vector<uint8_t> out(kFixed + 8 * m.bases.size() + kTensorEntry * m.tensors.size() + 9 * n + lossy + input + 8);
  std::span<uint8_t> b(out);
  std::memcpy(out.data(), kMetaMagic, sizeof(kMetaMagic));
  le::Put64(b, 8, m.sealed_ns);
  le::Put32(b, 16, static_cast<uint32_t>(m.bases.size()));
  le::Put32(b, 20, static_cast<uint32_t>(m.tensors.size()));
  le::Put64(b, 24, n);
  size_t pos = kFixed;
  for (ObjectId id : m.bases) le::Put64(b, pos, id), pos += 8;
  for (const TensorRange& t : m.tensors) {
    le::Put64(b, pos, t.offset);
    le::Put64(b, pos + 8, t.length);
    b[pos + 16] = static_cast<uint8_t>(t.dtype);
    pos += kTensorEntry;
  }
  for (uint64_t h : m.chunk_hash) le::Put64(b, pos, h), pos += 8;
  for (size_t i = 0; i < n; ++i) b[pos++] = i < m.chunk_depth.size() ? m.chunk_depth[i] : 0;
  if (m.lossy) EncodeLossy(*m.lossy, b.subspan(pos, kLossySize)), pos += kLossySize;
  if (m.input) EncodeInput(*m.input, b.subspan(pos, kInputSize)), pos += kInputSize;
  le::Put64(b, pos, Checksum64(b.first(pos), kSeedMeta));
  return out;
}

Result<PackMeta> DecodePackMeta(std::span<const uint8_t> b, uint64_t chunk_count) {
  auto corrupt = [](const std::string& what) { return Status::Corruption("pack meta block: " + what); };
  if (b.size() < kFixed + 8) return corrupt("too short (" + std::to_string(b.size()) + " bytes)");
  if (std::memcmp(b.data(), kMetaMagic, sizeof(kMetaMagic)) != 0) return corrupt("bad magic");
  if (!ChecksumMatches(Checksum64(b.first(b.size() - 8), kSeedMeta), le::Get64(b, b.size() - 8))) {
    return corrupt("checksum mismatch");
  }
  PackMeta m;
  m.sealed_ns = le::Get64(b, 8);
  const uint32_t nb = le::Get32(b, 16), nt = le::Get32(b, 20);
  const uint64_t nc = le::Get64(b, 24);
  if (nc != chunk_count) return corrupt("chunk count " + std::to_string(nc) + " differs from the header's");
  if (nb > kMaxMetaBases || nt > kMaxMetaTensors) return corrupt("implausible base or tensor count");
  const uint64_t want = kFixed + 8ull * nb + kTensorEntry * uint64_t{nt} + 9 * nc + 8;
  size_t lossy_size = 0, input_size = 0;
  if (nc > b.size() || b.size() < want || !SplitSections(b.size() - want, &lossy_size, &input_size))
    return corrupt("size " + std::to_string(b.size()) + ", expected " + std::to_string(want) +
                   " (plus a lossy and an input section, each optional)");
  size_t pos = kFixed;
  m.bases.resize(nb);
  for (auto& id : m.bases) id = le::Get64(b, pos), pos += 8;
  m.tensors.resize(nt);
  for (TensorRange& t : m.tensors) {
    t.offset = le::Get64(b, pos);
    t.length = le::Get64(b, pos + 8);
    t.dtype = static_cast<DType>(b[pos + 16]);
    pos += kTensorEntry;
  }
  m.chunk_hash.resize(nc);
  for (auto& h : m.chunk_hash) h = le::Get64(b, pos), pos += 8;
  m.chunk_depth.assign(b.begin() + pos, b.begin() + pos + nc);
  pos += nc;
  if (lossy_size > 0) {
    m.lossy = DecodeLossy(b.subspan(pos, lossy_size));
    if (!m.lossy) return corrupt("bad lossy section");
    pos += lossy_size;
  }
  if (input_size > 0) {
    m.input = DecodeInput(b.subspan(pos, input_size));
    if (!m.input) return corrupt("bad input section");
  }
  return m;
}

}  // namespace ckptfs
