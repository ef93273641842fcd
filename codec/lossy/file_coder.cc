#include "codec/lossy/file_coder.h"

#include <algorithm>
#include <cmath>

#include "base/metrics.h"
#include "codec/lossy/dcp_labels.h"
#include "codec/lossy/float_bits.h"
#include "codec/lossy/sensitivity.h"

namespace ckptfs {

using lossy::ChunkSegment;
using lossy::TensorRole;

namespace {

// Sensitivity vectors a worker keeps for its next chunks (a chunk holds a
// few lossy pieces at most; more would only hold memory).
constexpr size_t kPooledWeights = 2;

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

// Adam's true step is lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - b1^t),
// v_hat = v / (1 - b2^t): about the uncorrected one times
// sqrt(1 - b2^t) / (1 - b1^t), which is what this returns for the smallest
// step count t among the optimizer's "step" tensors (1: none found). The
// betas are taken as torch's defaults (0.9, 0.999): for any b2 <= 0.999 that
// gives a smaller factor than the true one, so a smaller budget.
double AdamBiasCorrection(const ByteSource& file, const FileLayout& layout) {
  if (!layout.optimizer_state) return 1;
  double t = 0;
  for (const TensorRegion& r : layout.tensors) {
    if (r.label != "step") continue;
    double x = 0;
    if (r.dtype == DType::kF32 && r.length == 4) {
      float f = 0;
      if (!file.ReadAt(r.offset, std::span(reinterpret_cast<uint8_t*>(&f), 4)).ok()) continue;
      x = f;
    } else if (r.dtype == DType::kI64 && r.length == 8) {
      int64_t i = 0;
      if (!file.ReadAt(r.offset, std::span(reinterpret_cast<uint8_t*>(&i), 8)).ok()) continue;
      x = static_cast<double>(i);
    } else {
      continue;
    }
    if (x >= 1 && std::isfinite(x)) t = t > 0 ? std::min(t, x) : x;
  }
  if (t < 1) return 1;
  return std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
}

}  // namespace

LossyCoder::LossyCoder(const ByteSource& file, const FileLayout& layout, std::span<const TensorRange> ranges,
                       const LossyPolicy& policy, const TensorChunkOptions& topts, SiblingSource* siblings)
    : file_(file), fidelity_(policy.fidelity), step_budget_(policy.step_budget), topts_(topts), ranges_(ranges) {
  info_.fidelity = static_cast<float>(fidelity_);
  info_.scope = policy.scope;
  // Several param_groups: the smallest learning rate and epsilon, which
  // give the smallest budget, since which group a tensor is in is not read.
  for (double lr : layout.group_lrs) {
    if (lr > 0 && std::isfinite(lr)) lr_ = lr_ > 0 ? std::min(lr_, lr) : lr;
  }
  bool eps_seen = false;
  for (double e : layout.group_eps) {
    if (e > 0 && std::isfinite(e)) eps_ = eps_seen ? std::min(eps_, e) : e, eps_seen = true;
  }
  lr_ *= AdamBiasCorrection(file, layout);
  if (layout.lossy_allowed && fidelity_ > 0) {
    // A DCP shard's tensors are named only in the save's .metadata.
    std::optional<LabelledShard> named;
    if (layout.format == "dcp" && siblings != nullptr) named = LabelDcpShard(layout, file.size(), *siblings);
    if (named) sibling_note_ = "tensor names from " + named->metadata;
    Classify(named ? named->layout : layout, policy.scope, siblings);
  }
  DescribeTargets();
}

void LossyCoder::DescribeTargets() {
  one_step_ = step_budget_ > 0 && lr_ > 0 && std::any_of(tensors_.begin(), tensors_.end(), [&](const Tensor& t) {
                return t.role == TensorRole::kWeight && t.m_offset && t.v_offset && !t.v_in_sibling;
              });
  info_.measure = one_step_ ? BudgetMeasure::kOneStep : BudgetMeasure::kRelative;
  const RoleTargets targets = one_step_ ? StepTargetsFor(step_budget_) : TargetsFor(fidelity_);
  for (TensorRole r : {TensorRole::kWeight, TensorRole::kAdamM, TensorRole::kAdamV}) {
    info_.roles[RoleSlot(r)].target = static_cast<float>(TargetFor(r, targets));
  }
  if (one_step_) info_.roles[RoleSlot(TensorRole::kWeight)].target = static_cast<float>(step_budget_);
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
    Tensor t{r.offset, r.length, r.dtype, roles[i].role, std::nullopt, false, r.order, std::nullopt};
    const int32_t pv = roles[i].partner_v;
    if (pv >= 0 && static_cast<size_t>(pv) < layout.tensors.size()) {
      const TensorRegion& v = layout.tensors[static_cast<size_t>(pv)];
      if (v.dtype == r.dtype && v.length == r.length) t.v_offset = v.offset;
    }
    // A weight's first moment is the one paired with the same second moment.
    for (size_t k = 0; t.v_offset && t.role == TensorRole::kWeight && k < roles.size(); ++k) {
      const TensorRegion& m = layout.tensors[k];
      if (roles[k].role == TensorRole::kAdamM && roles[k].partner_v == pv && m.dtype == r.dtype &&
          m.length == r.length) {
        t.m_offset = m.offset;
        break;
      }
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
  const bool any_weight =
      std::any_of(tensors_.begin(), tensors_.end(), [](const Tensor& t) { return t.role == TensorRole::kWeight; });
  const bool own_v = std::any_of(tensors_.begin(), tensors_.end(), [](const Tensor& t) {
    return t.role == TensorRole::kWeight && t.v_offset && !t.v_in_sibling;
  });
  info_.sensitivity = !any_weight          ? SensitivityRule::kNone
                      : sibling_pairs_ > 0 ? SensitivityRule::kSibling
                      : own_v              ? SensitivityRule::kOwnMoments
                                           : SensitivityRule::kMagnitude;
  for (const ZipCrcField& f : layout.zip_crcs) {
    const bool touched = std::any_of(tensors_.begin(), tensors_.end(), [&](const Tensor& t) {
      return Overlaps(t.offset, t.length, f.data_offset, f.data_length);
    });
    if (touched) crc_fields_.push_back(f);
  }
  if (crc_fields_.empty()) return;
  tracker_.emplace(crc_fields_);
  for (size_t i = 0; i < crc_fields_.size(); ++i) {
    for (uint64_t at : crc_fields_[i].field_offsets) field_at_.emplace_back(at, i);
  }
  std::sort(field_at_.begin(), field_at_.end());
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

std::span<const std::pair<uint64_t, size_t>> LossyCoder::FieldsIn(uint64_t offset, uint64_t len) const {
  // A 4-byte field may start up to 3 bytes before the chunk.
  const uint64_t lo = offset < 3 ? 0 : offset - 3, hi = offset + len;
  auto first = std::lower_bound(field_at_.begin(), field_at_.end(), std::make_pair(lo, size_t{0}));
  auto last = std::lower_bound(first, field_at_.end(), std::make_pair(hi, size_t{0}));
  return {first, last};
}

uint64_t LossyCoder::CrcPassEnd(uint64_t offset, uint64_t len) const {
  uint64_t end = offset + len;
  for (const auto& [at, i] : FieldsIn(offset, len)) {
    const ZipCrcField& f = crc_fields_[i];
    end = std::max(end, f.data_offset + std::min(f.data_length, UINT64_MAX - f.data_offset));
  }
  return end;
}

Status LossyCoder::PatchCrcs(uint64_t offset, std::span<uint8_t> raw) const {
  for (const auto& [at, i] : FieldsIn(offset, raw.size())) {
    const std::optional<uint32_t> crc = tracker_->Crc(i);
    if (!crc) {
      return Status::Error(EIO, "lossy seal: the zip CRC of the member at " +
                                    std::to_string(crc_fields_[i].data_offset) +
                                    " was not computed before encoding the chunk at " + std::to_string(offset));
    }
    const ZipCrcField one{crc_fields_[i].data_offset, crc_fields_[i].data_length, {at}};
    formats::PatchCrcFields(offset, raw, std::span(&one, 1), std::span(&*crc, 1));
  }
  return Status::Ok();
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
  std::vector<float> w;  // a vector an earlier chunk handed back: no fresh pages
  if (scratch != nullptr && !scratch->weights.empty()) {
    w = std::move(scratch->weights.back());
    scratch->weights.pop_back();
  }
  lossy::FisherWeights(t.dtype, bytes.first(n * es), t.role == TensorRole::kWeight, &w);
  return w;  // empty: no gradient seen yet, plain magnitude
}

Result<double> LossyCoder::OneStepTarget(const Tensor& t, uint64_t begin, uint64_t end,
                                         lossy::PieceScratch* scratch) const {
  const size_t es = DTypeSize(t.dtype), n = (end - begin) / es;
  lossy::PieceScratch own;
  lossy::PieceScratch& s = scratch != nullptr ? *scratch : own;
  const std::span<uint8_t> w = lossy::ScratchSpan(s.step_bytes[0], end - begin);
  const std::span<uint8_t> m = lossy::ScratchSpan(s.step_bytes[1], end - begin);
  const std::span<uint8_t> v = lossy::ScratchSpan(s.step_bytes[2], end - begin);
  RETURN_IF_ERROR(file_.ReadAt(begin, w));
  RETURN_IF_ERROR(file_.ReadAt(*t.m_offset + (begin - t.offset), m));
  RETURN_IF_ERROR(file_.ReadAt(*t.v_offset + (begin - t.offset), v));
  auto at = [dtype = t.dtype](std::span<const uint8_t> b) {
    return [b, dtype](size_t i) { return lossy::BitsToFloat(dtype, lossy::LoadBits(dtype, b.data(), i)); };
  };
  return OneStepWeightTargetOf(n, at(w), at(m), at(v), lr_, eps_, step_budget_);
}

Result<std::vector<ChunkSegment>> LossyCoder::Segments(uint64_t offset, uint64_t len, lossy::PieceScratch* scratch,
                                                       const CodedPieces* coded) const {
  const RoleTargets targets = one_step_ ? StepTargetsFor(step_budget_) : TargetsFor(fidelity_);
  const RoleTargets fallback = TargetsFor(fidelity_);
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
    // The named levels' m keeps its energy and every element's own value
    // (no pruning): both cost loss on the panel where noise of the same
    // size does not (docs/LOSSY.md). A numeric fidelity keeps its old coding.
    if (one_step_ && t.role == TensorRole::kAdamM) s.spec.preserve_energy = true, s.spec.prune = false;
    // Nor are the named levels' weights pruned: leaving the least sensitive
    // elements at the predictor drops their updates at every restore, a
    // systematic error; on the panel's B at 5 steps of budget it cost
    // +11.0% where the same budget without pruning cost +0.95% at 1% fewer
    // bytes (docs/LOSSY.md, "Pruning").
    if (step_budget_ > 0 && t.role == TensorRole::kWeight) s.spec.prune = false;
    if (coded != nullptr && coded->count(begin) != 0) {
      // Decoded, not coded: neither target nor sensitivity is needed.
    } else if (t.role == TensorRole::kWeight) {
      s.spec.target = fallback.weight;
      s.spec.residual_cap = fallback.weight_update;
      ASSIGN_OR_RETURN(const double step_target,
                       OneStep(t) ? OneStepTarget(t, begin, end, scratch) : Result<double>(0.0));
      if (step_target > 0) {
        // The budget is in units of the optimizer's own movement already:
        // no second cap on the change since the predecessor.
        s.spec.target = std::min(step_target, kMaxFidelity);
        s.spec.residual_cap = 0;
        s.error_to_steps = step_budget_ / s.spec.target;
      }
    }
    if (coded == nullptr || coded->count(begin) == 0) {
      ASSIGN_OR_RETURN(s.weight, Sensitivity(t, begin, end, scratch));
    }
    segs.push_back(std::move(s));
    pos = end - offset;
  }
  lossless_to(len);
  return segs;
}

Status LossyCoder::CodeChunk(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                             std::vector<ChunkSegment>* segs, std::vector<uint8_t>* out, lossy::PieceScratch* scratch,
                             const CodedPieces* coded, bool* lossless_against_base) {
  ASSIGN_OR_RETURN(*segs, Segments(offset, raw.size(), scratch, coded));
  {
    // Choices and blobs are only added during the CRC pass, which is over
    // when the chunks are coded for the pack.
    std::lock_guard lock(mu_);
    const bool keep = out == nullptr && coded_bytes_ < coded_budget_;
    for (ChunkSegment& s : *segs) {
      if (!s.lossy) continue;
      s.keep_blob = keep;
      auto c = coded != nullptr ? coded->find(offset + s.begin) : CodedPieces::const_iterator{};
      if (coded != nullptr && c != coded->end()) {
        s.coded = &c->second;
        s.error_to_steps = c->second.error_to_steps;
        continue;
      }
      auto it = choices_.find(offset + s.begin);
      if (it != choices_.end()) s.choice = &it->second;
    }
  }
  const Status st =
      lossy::EncodeLossyChunk(raw, base, offset, ranges_, *segs, topts_, out, scratch, lossless_against_base);
  for (ChunkSegment& s : *segs) {
    if (scratch != nullptr && s.weight.capacity() > 0 && scratch->weights.size() < kPooledWeights) {
      scratch->weights.push_back(std::move(s.weight));
    }
  }
  return st;
}

void LossyCoder::KeepCoded(uint64_t offset, std::vector<ChunkSegment>& segs) {
  std::lock_guard lock(mu_);
  for (ChunkSegment& s : segs) {
    if (!s.lossy) continue;
    if (!s.keep_blob) {
      choices_.emplace(offset + s.begin, std::move(s.outcome.choice));
      continue;
    }
    s.outcome.choice.levels.clear();  // in the blob already
    coded_bytes_ += s.blob.size();
    coded_.emplace(offset + s.begin, lossy::CodedPiece{std::move(s.blob), std::move(s.outcome), s.error_to_steps});
  }
}

LossyCoder::CodedPieces LossyCoder::TakeCoded(uint64_t offset, uint64_t len) {
  CodedPieces taken;
  std::lock_guard lock(mu_);
  for (auto it = coded_.lower_bound(offset); it != coded_.end() && it->first < offset + len;) {
    coded_bytes_ -= it->second.blob.size();
    taken.insert(coded_.extract(it++));
  }
  return taken;
}

Status LossyCoder::Reconstruct(uint64_t offset, std::span<uint8_t> raw, std::span<const uint8_t> base,
                               lossy::PieceScratch* scratch) {
  if (HasWork(offset, raw.size())) {
    std::vector<ChunkSegment> segs;
    RETURN_IF_ERROR(CodeChunk(offset, raw, base, &segs, nullptr, scratch));
    KeepCoded(offset, segs);
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
    // Under the one-step measure, weights report steps; those it could not
    // judge (coded to the fallback's relative target) are left out of it.
    const bool steps = one_step_ && s.role == TensorRole::kWeight;
    const double e = steps ? s.outcome.error * s.error_to_steps : s.outcome.error;
    if (!steps || s.error_to_steps > 0) r.max_error = std::max(r.max_error, static_cast<float>(e));
    GlobalMetrics().lossy_error.Observe(s.outcome.error);
  } else {
    info_.exact_elements += n;
  }
}

Result<std::optional<LossyChunk>> LossyCoder::Encode(uint64_t offset, std::span<uint8_t> raw,
                                                     std::span<const uint8_t> base, lossy::PieceScratch* scratch) {
  if (tracker_) RETURN_IF_ERROR(PatchCrcs(offset, raw));
  if (!HasWork(offset, raw.size())) return std::optional<LossyChunk>{};
  const CodedPieces coded = TakeCoded(offset, raw.size());  // outlives segs' pointers into it
  LossyChunk c;
  std::vector<ChunkSegment> segs;
  RETURN_IF_ERROR(CodeChunk(offset, raw, base, &segs, &c.payload, scratch, &coded, &c.used_base));
  for (const ChunkSegment& s : segs) {
    if (!s.lossy) continue;
    Record(s);
    c.used_base |= s.coded_lossy && s.outcome.against_base;
  }
  return std::optional<LossyChunk>(std::move(c));
}

}  // namespace ckptfs
