#include "codec/lossy/file_coder.h"

#include <algorithm>
#include <cmath>

#include "base/metrics.h"
#include "codec/lossy/dcp_labels.h"
#include "codec/lossy/float_bits.h"

namespace ckptfs {

using lossy::ChunkSegment;
using lossy::TensorRole;

namespace {

// Weights of a parameter's error: Adam's v estimates the diagonal of the
// Fisher information, so sum(v * dw^2) approximates the loss increase. The
// floor keeps parameters that saw no gradient yet from being free to move.
constexpr double kFisherFloor = 0.01;
// Adam's update divides m by sqrt(v) + eps: errors of m count in those units.
constexpr double kAdamEps = 1e-8;

size_t RoleSlot(TensorRole r) { return static_cast<size_t>(r) - 1; }

double TargetFor(TensorRole r, const RoleTargets& t) {
  switch (r) {
    case TensorRole::kAdamM:
      return t.first_moment;
    case TensorRole::kAdamV:
      return t.second_moment;
    default:
      return t.weight;
  }
}

bool Overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) { return a < b + blen && b < a + alen; }

}  // namespace

LossyCoder::LossyCoder(const ByteSource& file, const FileLayout& layout, std::span<const TensorRange> ranges,
                       const LossyPolicy& policy, const TensorChunkOptions& topts, SiblingSource* siblings)
    : file_(file), fidelity_(policy.fidelity), topts_(topts), ranges_(ranges) {
  const double fidelity = policy.fidelity;
  const RoleTargets targets = TargetsFor(fidelity);
  info_.fidelity = static_cast<float>(fidelity);
  info_.scope = policy.scope;
  for (TensorRole r : {TensorRole::kWeight, TensorRole::kAdamM, TensorRole::kAdamV}) {
    info_.roles[RoleSlot(r)].target = static_cast<float>(TargetFor(r, targets));
  }
  if (!layout.lossy_allowed || fidelity <= 0) return;
  // A DCP shard's tensors are named only in the save's .metadata.
  std::optional<LabelledShard> named;
  if (layout.format == "dcp" && siblings != nullptr) named = LabelDcpShard(layout, file.size(), *siblings);
  if (named) sibling_note_ = "tensor names from " + named->metadata;
  Classify(named ? named->layout : layout, policy.scope, siblings);
}

void LossyCoder::Classify(const FileLayout& layout, lossy::LossyScope scope, SiblingSource* siblings) {
  const std::vector<lossy::RoleAssignment> roles = lossy::AssignRoles(layout, scope);
  // In a zip, a tensor whose member's CRC cannot be rewritten stays exact.
  const bool zip = layout.format == "torch-zip" || layout.format == "npz" || layout.format == "dcp";
  auto crc_covered = [&](const TensorRegion& r) {
    return std::any_of(layout.zip_crcs.begin(), layout.zip_crcs.end(), [&](const ZipCrcField& f) {
      return r.offset >= f.data_offset && r.offset + r.length <= f.data_offset + f.data_length;
    });
  };
  for (size_t i = 0; i < layout.tensors.size() && i < roles.size(); ++i) {
    const TensorRegion& r = layout.tensors[i];
    if (roles[i].role == TensorRole::kOther || !lossy::LossyDTypeSupported(r.dtype)) continue;
    if (r.length / DTypeSize(r.dtype) < kMinLossyElements || (zip && !crc_covered(r))) continue;
    Tensor t{r.offset, r.length, r.dtype, roles[i].role, std::nullopt, false, r.order};
    if (roles[i].partner_v >= 0 && static_cast<size_t>(roles[i].partner_v) < layout.tensors.size()) {
      const TensorRegion& v = layout.tensors[static_cast<size_t>(roles[i].partner_v)];
      if (v.dtype == r.dtype && v.length == r.length) t.v_offset = v.offset;
    }
    tensors_.push_back(t);
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const Tensor& a, const Tensor& b) { return a.offset < b.offset; });
  const bool lacks_v = std::any_of(tensors_.begin(), tensors_.end(),
                                   [](const Tensor& t) { return t.role == TensorRole::kWeight && !t.v_offset; });
  const bool has_moments = std::any_of(roles.begin(), roles.end(), [](const lossy::RoleAssignment& r) {
    return r.role == TensorRole::kAdamV || r.role == TensorRole::kAdamM;
  });
  // A file of weights alone: its optimizer state may be a sibling file.
  if (lacks_v && !has_moments && siblings != nullptr) PairWithSibling(layout, scope, *siblings);
  const bool any_weight = std::any_of(tensors_.begin(), tensors_.end(),
                                      [](const Tensor& t) { return t.role == TensorRole::kWeight; });
  const bool own_v = std::any_of(tensors_.begin(), tensors_.end(), [](const Tensor& t) {
    return t.role == TensorRole::kWeight && t.v_offset && !t.v_in_sibling;
  });
  info_.sensitivity = !any_weight         ? SensitivityRule::kNone
                      : sibling_pairs_ > 0 ? SensitivityRule::kSibling
                      : own_v              ? SensitivityRule::kOwnMoments
                                           : SensitivityRule::kMagnitude;
  for (const ZipCrcField& f : layout.zip_crcs) {
    const bool touched = std::any_of(tensors_.begin(), tensors_.end(), [&](const Tensor& t) {
      return Overlaps(t.offset, t.length, f.data_offset, f.data_length);
    });
    if (touched) crc_fields_.push_back(f);
  }
  if (!crc_fields_.empty()) tracker_.emplace(crc_fields_);
}

// The first candidate whose second moments match this file's parameters
// one for one gives each of them its sensitivity; anything less and the
// weights are weighed by magnitude, as a mismatched file would mislead.
void LossyCoder::PairWithSibling(const FileLayout& layout, lossy::LossyScope scope, SiblingSource& siblings) {
  const std::vector<std::string> names = siblings.Candidates();
  for (size_t i = 0; i < names.size() && i < kMaxSiblings; ++i) {
    std::optional<SiblingMoments> candidate = ReadSiblingMoments(siblings, names[i]);
    if (!candidate) continue;
    Result<std::vector<std::pair<size_t, size_t>>> pairs = MatchSiblingMoments(layout, candidate->layout, scope);
    if (!pairs.ok()) {
      sibling_note_ += (sibling_note_.empty() ? "" : "; ") + candidate->name + " not used: " + pairs.status().message();
      continue;
    }
    for (const auto& [w, v] : *pairs) {
      const TensorRegion& wr = layout.tensors[w];
      auto t = std::find_if(tensors_.begin(), tensors_.end(), [&](const Tensor& x) { return x.offset == wr.offset; });
      if (t == tensors_.end() || t->v_offset) continue;  // stays exact, or paired already
      t->v_offset = candidate->layout.tensors[v].offset;
      t->v_in_sibling = true;
      ++sibling_pairs_;
    }
    if (sibling_pairs_ == 0) continue;
    sibling_note_ = "second moments of " + candidate->name;
    sibling_ = std::move(candidate);
    return;
  }
}

bool LossyCoder::HasWork(uint64_t offset, uint64_t len) const {
  return std::any_of(tensors_.begin(), tensors_.end(),
                     [&](const Tensor& t) { return Overlaps(t.offset, t.length, offset, len); });
}

bool LossyCoder::CrcChunk(uint64_t offset, uint64_t len) const {
  return std::any_of(crc_fields_.begin(), crc_fields_.end(),
                     [&](const ZipCrcField& f) { return Overlaps(f.data_offset, f.data_length, offset, len); });
}

Result<std::vector<float>> LossyCoder::Sensitivity(const Tensor& t, uint64_t begin, uint64_t end,
                                                   lossy::PieceScratch* scratch) const {
  if (!t.v_offset || t.role == TensorRole::kAdamV) return std::vector<float>{};
  const size_t es = DTypeSize(t.dtype), n = (end - begin) / es;
  std::vector<uint8_t> own;
  const std::span<uint8_t> bytes = lossy::ScratchSpan(scratch != nullptr ? scratch->bytes : own, end - begin);
  const uint64_t at = *t.v_offset + (begin - t.offset);
  if (t.v_in_sibling) {
    RETURN_IF_ERROR(sibling_->source->ReadAt(at, bytes).WithContext("reading the sibling file's second moments"));
  } else {
    RETURN_IF_ERROR(file_.ReadAt(at, bytes));
  }
  auto v_at = [&](size_t i) {
    const double x = lossy::BitsToFloat(t.dtype, lossy::LoadBits(t.dtype, bytes.data(), i));
    return std::isfinite(x) && x > 0 ? x : 0.0;
  };
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += v_at(i);
  if (sum <= 0) return std::vector<float>{};  // no gradient seen yet: plain magnitude
  std::vector<float> w(n);
  const double floor = kFisherFloor * sum / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    const double v = v_at(i);
    const double d = std::sqrt(v) + kAdamEps;
    w[i] = static_cast<float>(t.role == TensorRole::kWeight ? v + floor : 1.0 / (d * d));
  }
  return w;
}

Result<std::vector<ChunkSegment>> LossyCoder::Segments(uint64_t offset, uint64_t len,
                                                       lossy::PieceScratch* scratch) const {
  const RoleTargets targets = TargetsFor(fidelity_);
  std::vector<ChunkSegment> segs;
  uint64_t pos = 0;  // chunk-relative
  auto lossless_to = [&](uint64_t end) {
    if (end > pos) {
      ChunkSegment s;
      s.begin = pos, s.end = end;
      segs.push_back(std::move(s));
    }
    pos = std::max(pos, end);
  };
  for (const Tensor& t : tensors_) {
    if (!Overlaps(t.offset, t.length, offset, len)) continue;
    const uint64_t es = DTypeSize(t.dtype);
    // Whole elements only: a chunk boundary may split one.
    const uint64_t lo = std::max(offset, t.offset), hi = std::min(offset + len, t.offset + t.length);
    const uint64_t begin = t.offset + (lo - t.offset + es - 1) / es * es;
    const uint64_t end = t.offset + (hi - t.offset) / es * es;
    if (end <= begin) continue;
    lossless_to(begin - offset);
    ChunkSegment s;
    s.begin = begin - offset, s.end = end - offset, s.lossy = true;
    s.role = t.role;
    s.spec.dtype = t.dtype;
    s.spec.domain = t.role == TensorRole::kAdamV ? lossy::Domain::kLogBits : lossy::Domain::kValue;
    s.spec.target = TargetFor(t.role, targets);
    if (t.role == TensorRole::kWeight) s.spec.residual_cap = targets.weight_update;
    ASSIGN_OR_RETURN(s.weight, Sensitivity(t, begin, end, scratch));
    segs.push_back(std::move(s));
    pos = end - offset;
  }
  lossless_to(len);
  return segs;
}

Status LossyCoder::CodeChunk(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                             std::vector<ChunkSegment>* segs, std::vector<uint8_t>* out, lossy::PieceScratch* scratch) {
  ASSIGN_OR_RETURN(*segs, Segments(offset, raw.size(), scratch));
  {
    // Choices are only added during the CRC pass, which is over when the
    // chunks are coded for the pack.
    std::lock_guard lock(mu_);
    for (ChunkSegment& s : *segs) {
      auto it = choices_.find(offset + s.begin);
      if (s.lossy && it != choices_.end()) s.choice = &it->second;
    }
  }
  return lossy::EncodeLossyChunk(raw, base, offset, ranges_, *segs, topts_, out, scratch);
}

Status LossyCoder::Reconstruct(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                               lossy::PieceScratch* scratch) {
  if (HasWork(offset, raw.size())) {
    std::vector<ChunkSegment> segs;
    RETURN_IF_ERROR(CodeChunk(offset, raw, base, &segs, nullptr, scratch));
    std::lock_guard lock(mu_);
    for (ChunkSegment& s : segs) {
      if (s.lossy) choices_.emplace(offset + s.begin, std::move(s.outcome.choice));
    }
  }
  if (tracker_) tracker_->Feed(offset, raw);
  return Status::Ok();
}

void LossyCoder::Record(const ChunkSegment& s) {
  std::lock_guard lock(mu_);
  LossyRoleInfo& r = info_.roles[RoleSlot(s.role)];
  const uint64_t n = (s.end - s.begin) / DTypeSize(s.spec.dtype);
  r.elements += n;
  r.stored += s.stored;
  if (s.coded_lossy) {
    r.max_error = std::max(r.max_error, static_cast<float>(s.outcome.error));
    GlobalMetrics().lossy_error.Observe(s.outcome.error);
  } else {
    info_.exact_elements += n;
  }
}

Result<std::optional<LossyChunk>> LossyCoder::Encode(uint64_t offset, std::span<uint8_t> raw,
                                                     std::span<const uint8_t> base, lossy::PieceScratch* scratch) {
  if (tracker_) {
    {
      std::lock_guard lock(mu_);
      if (!crcs_ready_) {
        if (!tracker_->Complete()) return Status::Error(EIO, "lossy seal: zip CRCs were not computed before encoding");
        crcs_ = tracker_->Crcs();
        crcs_ready_ = true;
      }
    }
    formats::PatchCrcFields(offset, raw, crc_fields_, crcs_);
  }
  if (!HasWork(offset, raw.size())) return std::optional<LossyChunk>{};
  LossyChunk c;
  std::vector<ChunkSegment> segs;
  RETURN_IF_ERROR(CodeChunk(offset, raw, base, &segs, &c.payload, scratch));
  for (const ChunkSegment& s : segs) {
    if (!s.lossy) continue;
    Record(s);
    c.used_base |= s.coded_lossy && s.outcome.against_base;
  }
  return std::optional<LossyChunk>(std::move(c));
}

}  // namespace ckptfs
