#include "codec/lossy/roles.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

namespace ckptfs::lossy {
namespace {

// Only these hold values lossy mode may perturb; fp8 is already as coarse
// as it gets and complex numbers are not parameters of the usual kind.
bool LossyFloat(DType t) {
  return DTypeIsFloat(t) && (t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64);
}

uint64_t Elements(const TensorRegion& t) {
  unsigned es = DTypeSize(t.dtype);
  return es == 0 ? 0 : t.length / es;
}

std::string_view LastComponent(std::string_view label) {
  const size_t dot = label.rfind('.');
  return dot == std::string_view::npos ? label : label.substr(dot + 1);
}

TensorRole MomentRole(std::string_view l) {
  if (l.ends_with("exp_avg_sq")) return TensorRole::kAdamV;  // also amsgrad's max_exp_avg_sq
  if (l.ends_with("exp_avg") || l.ends_with("momentum_buffer")) return TensorRole::kAdamM;
  return TensorRole::kOther;
}

bool IsTorchFormat(const FileLayout& layout) {
  return layout.format == "torch-zip" || layout.format == "torch-legacy";
}
bool IsNumpyFormat(const FileLayout& layout) { return layout.format == "npy" || layout.format == "npz"; }

// The scope rules of LossyScope::kModels for one float tensor of a torch
// pickle, where only the pickle's structure proves anything: a moment is a
// tensor of an optimizer state_dict's per-parameter entry, a weight a value
// of a Module.state_dict(). Any other tensor is a weight only if an
// optimizer entry matches it (*needs_proof; AssignRoles settles it).
TensorRole TorchModelRole(const TensorRegion& t, bool* needs_proof) {
  const std::string_view last = LastComponent(t.label);
  if (t.optimizer_entry) return MomentRole(t.label);  // exp_avg & co.; step, sum, square_avg stay exact
  if (IsBufferName(last) || IsDataName(last)) return TensorRole::kOther;
  *needs_proof = !t.module_entry;
  return TensorRole::kWeight;
}

// The scope rules of LossyScope::kModels, for one float tensor.
TensorRole ModelRole(const FileLayout& layout, const TensorRegion& t, bool* needs_proof) {
  if (IsNumpyFormat(layout)) return TensorRole::kOther;
  if (IsTorchFormat(layout)) return TorchModelRole(t, needs_proof);
  if (const TensorRole m = MomentRole(t.label); m != TensorRole::kOther) return m;
  const std::string_view last = LastComponent(t.label);
  if (IsBufferName(last) || IsDataName(last)) return TensorRole::kOther;
  return TensorRole::kWeight;  // safetensors, GGUF, DCP, Orbax, Flax: model files
}

TensorRole RoleOf(const FileLayout& layout, const TensorRegion& t, LossyScope scope, bool* needs_proof) {
  if (!LossyFloat(t.dtype) || Elements(t) < 2) return TensorRole::kOther;
  std::string_view l = t.label;
  if (l == "step" || l.ends_with(".step")) return TensorRole::kOther;
  if (scope == LossyScope::kModels) return ModelRole(layout, t, needs_proof);
  const TensorRole m = MomentRole(l);
  return m != TensorRole::kOther ? m : TensorRole::kWeight;
}

// BatchNorm statistics are floats of a parameter's size sitting between
// parameters; no optimizer keeps state for them, so they never take an
// optimizer entry (which would shift every later pairing).
bool NeverOptimized(std::string_view label) {
  return label.ends_with("running_mean") || label.ends_with("running_var");
}

// The optimizer state of one parameter: first moment and/or second moment.
struct Entry {
  int32_t m = -1;
  int32_t v = -1;
};

// Element count, element type and, in torch files (whose pickle gives
// shapes), the shape: what an optimizer entry must share with its parameter.
using Key = std::tuple<uint64_t, DType, std::vector<uint64_t>>;
Key KeyOf(const TensorRegion& t) { return {Elements(t), t.dtype, {}}; }
Key KeyOf(const FileLayout& layout, const TensorRegion& t) {
  return {Elements(t), t.dtype, IsTorchFormat(layout) ? t.shape : std::vector<uint64_t>{}};
}

// Indices of layout.tensors in the file's logical order; ties (formats
// without one) fall back to file order.
std::vector<int32_t> LogicalOrder(const FileLayout& layout) {
  std::vector<int32_t> seq(layout.tensors.size());
  std::iota(seq.begin(), seq.end(), 0);
  std::stable_sort(seq.begin(), seq.end(),
                   [&](int32_t a, int32_t b) { return layout.tensors[a].order < layout.tensors[b].order; });
  return seq;
}

// Groups moments into per-parameter entries, in order. An m takes the
// first v after it, before the next m, of its size and type; amsgrad's
// max_exp_avg_sq joins the entry it sits in (never as its v); any other v
// starts its own entry.
std::vector<Entry> GroupEntries(const FileLayout& layout, const std::vector<int32_t>& seq,
                                const std::vector<RoleAssignment>& roles) {
  std::vector<Entry> entries;
  int32_t open = -1;  // entry whose m still waits for its v
  auto key_of = [&](const Entry& e) { return KeyOf(layout, layout.tensors[e.m >= 0 ? e.m : e.v]); };
  for (int32_t i : seq) {
    const TensorRegion& t = layout.tensors[i];
    if (roles[i].role == TensorRole::kAdamM) {
      open = static_cast<int32_t>(entries.size());
      entries.push_back({i, -1});
      continue;
    }
    if (roles[i].role != TensorRole::kAdamV) continue;
    bool fits_open = open >= 0 && key_of(entries[open]) == KeyOf(layout, t);
    if (t.label.ends_with("max_exp_avg_sq")) {
      if (fits_open || (!entries.empty() && key_of(entries.back()) == KeyOf(layout, t))) continue;
      entries.push_back({-1, i});
    } else if (fits_open) {
      entries[open].v = i;
      open = -1;
    } else {
      entries.push_back({-1, i});
    }
  }
  return entries;
}

// Weights that may own optimizer state, per (size, type), as positions in
// `seq` so "after the last match" is an ordered-set lookup.
std::map<Key, std::set<size_t>> Candidates(const FileLayout& layout, const std::vector<int32_t>& seq,
                                           const std::vector<RoleAssignment>& roles) {
  std::map<Key, std::set<size_t>> pool;
  for (size_t p = 0; p < seq.size(); ++p) {
    const TensorRegion& t = layout.tensors[seq[p]];
    if (roles[seq[p]].role == TensorRole::kWeight && !NeverOptimized(t.label)) pool[KeyOf(layout, t)].insert(p);
  }
  return pool;
}

// Entries follow parameter order, so each takes the next free weight of
// its size after the previous match. When none is left after it, the
// search restarts from the first free one: optimizers with several param
// groups (decay / no-decay) list their state group by group. Sizes alone
// cannot place a group boundary, so equal-sized tensors on both sides of
// one (a late bias, an early norm) may be paired with each other's state.
// Returns, per tensor, whether an entry matched it.
std::vector<bool> MatchEntries(const FileLayout& layout, const std::vector<int32_t>& seq,
                               const std::vector<Entry>& entries, std::vector<RoleAssignment>* roles) {
  std::vector<bool> matched(layout.tensors.size());
  auto pool = Candidates(layout, seq, *roles);
  size_t next = 0;  // position in seq just past the previous match
  for (const Entry& e : entries) {
    auto it = pool.find(KeyOf(layout, layout.tensors[e.m >= 0 ? e.m : e.v]));
    if (it == pool.end() || it->second.empty()) continue;
    auto pos = it->second.lower_bound(next);
    if (pos == it->second.end()) pos = it->second.begin();
    size_t p = *pos;
    it->second.erase(pos);
    next = p + 1;
    (*roles)[seq[p]].partner_v = e.v;
    matched[seq[p]] = true;
  }
  return matched;
}

// A torch tensor that needs proof of being a parameter (TorchModelRole)
// without an optimizer entry that matched it by order and shape, or one
// keyed by its name, is not one.
void DropUnproven(const FileLayout& layout, const std::vector<bool>& needs_proof, const std::vector<bool>& matched,
                  std::vector<RoleAssignment>* roles) {
  std::set<std::string_view> named;
  if (layout.optimizer_state) {
    named.insert(layout.param_names.begin(), layout.param_names.end());
    named.insert(layout.state_names.begin(), layout.state_names.end());
  }
  for (size_t i = 0; i < roles->size(); ++i) {
    if (!needs_proof[i] || matched[i] || (!layout.tensors[i].label.empty() && named.count(layout.tensors[i].label))) {
      continue;
    }
    (*roles)[i] = {TensorRole::kOther, -1};
  }
}

// optax's ScaleByAdamState keeps mu and nu as trees shaped like the
// parameters ("opt_state.0.mu.params.Dense_0.kernel", Orbax and Flax
// msgpack labels): a "mu" component whose "nu" twin exists is Adam's m,
// the twin its v, and the parameter is the weight whose label ends with
// what follows "mu". A layer merely named mu has no such twin.
size_t MomentComponent(std::string_view label, std::string_view which) {
  const std::string dotted = "." + std::string(which) + ".";
  if (label.starts_with(dotted.substr(1))) return 0;
  const size_t at = label.find(dotted);
  return at == std::string_view::npos ? std::string_view::npos : at + 1;
}

bool AssignOptaxMoments(const FileLayout& layout, std::vector<RoleAssignment>* roles) {
  std::map<std::string_view, int32_t> by_label;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    if ((*roles)[i].role != TensorRole::kOther) by_label.emplace(layout.tensors[i].label, static_cast<int32_t>(i));
  }
  bool any = false;
  for (const auto& [label, m] : by_label) {
    const size_t at = MomentComponent(label, "mu");
    if (at == std::string_view::npos) continue;
    std::string twin(label);
    twin[at] = 'n';
    auto v = by_label.find(twin);
    if (v == by_label.end() || KeyOf(layout.tensors[v->second]) != KeyOf(layout.tensors[m])) continue;
    (*roles)[m] = {TensorRole::kAdamM, v->second};
    (*roles)[v->second] = {TensorRole::kAdamV, -1};
    any = true;
  }
  // A "nu" or "mu" whose twin is not in this file: Orbax puts the two in
  // different data files when TensorStore splits a save, and the save's
  // tree says whether the twin array exists (FileLayout::save_arrays). If
  // it does, this is Adam's v, or Adam's m (without its v here: coded to
  // m's target in plain relative error, not as a weight, whose target is
  // 20 times tighter and cost such files 6x to 7x against 30x); if not, a
  // nu stays exact (coded as a weight a v could turn negative, NaN in
  // Adam's sqrt, and coded as a v a layer merely named nu would lose bits
  // it needs) and a mu stays a weight.
  const std::set<std::string_view> save(layout.save_arrays.begin(), layout.save_arrays.end());
  for (const auto& [label, i] : by_label) {
    const size_t nu = MomentComponent(label, "nu"), mu = MomentComponent(label, "mu");
    if ((*roles)[i].role != TensorRole::kWeight || (nu == std::string_view::npos && mu == std::string_view::npos)) {
      continue;
    }
    std::string twin(label.substr(0, label.find('/')));
    twin[nu != std::string_view::npos ? nu : mu] = nu != std::string_view::npos ? 'm' : 'n';
    const bool paired = save.count(twin) != 0;
    if (nu != std::string_view::npos) {
      (*roles)[i] = {paired ? TensorRole::kAdamV : TensorRole::kOther, -1};
    } else if (paired) {
      (*roles)[i] = {TensorRole::kAdamM, -1};
    }
    any = any || paired;
  }
  if (!any) return false;
  for (const auto& [label, m] : by_label) {
    if ((*roles)[m].role != TensorRole::kAdamM || (*roles)[m].partner_v < 0) continue;
    const std::string rest = "." + std::string(label.substr(MomentComponent(label, "mu") + 3));
    for (const auto& [wl, w] : by_label) {
      if ((*roles)[w].role != TensorRole::kWeight || KeyOf(layout.tensors[w]) != KeyOf(layout.tensors[m])) continue;
      if (wl.ends_with(rest) || wl == std::string_view(rest).substr(1)) {
        (*roles)[w].partner_v = (*roles)[m].partner_v;
        break;
      }
    }
  }
  return true;
}

}  // namespace

bool IsDataName(std::string_view c) {
  static constexpr std::string_view kData[] = {
      "data",   "input",  "inputs",      "x",          "y",      "target",  "targets", "label",
      "labels", "sample", "samples",     "batch",      "images", "tokens",  "logits",  "output",
      "outputs", "features", "activation", "activations", "hidden_states"};
  return std::find(std::begin(kData), std::end(kData), c) != std::end(kData);
}

bool IsBufferName(std::string_view c) {
  return c.starts_with("running_") || c == "num_batches_tracked" || c == "inv_freq" || c == "position_ids" ||
         c == "masked_bias";
}

const char* LossyScopeName(LossyScope s) { return s == LossyScope::kAll ? "all" : "models"; }

const char* TensorRoleName(TensorRole r) {
  switch (r) {
    case TensorRole::kOther:
      return "other";
    case TensorRole::kWeight:
      return "weight";
    case TensorRole::kAdamM:
      return "adam_m";
    case TensorRole::kAdamV:
      return "adam_v";
  }
  return "other";
}

std::vector<RoleAssignment> AssignRoles(const FileLayout& layout, LossyScope scope) {
  std::vector<RoleAssignment> roles(layout.tensors.size());
  std::vector<bool> needs_proof(layout.tensors.size());
  for (size_t i = 0; i < roles.size(); ++i) {
    bool proof = false;
    roles[i].role = RoleOf(layout, layout.tensors[i], scope, &proof);
    needs_proof[i] = proof;
  }
  if (!IsTorchFormat(layout) && AssignOptaxMoments(layout, &roles)) return roles;
  std::vector<int32_t> seq = LogicalOrder(layout);
  std::vector<Entry> entries = GroupEntries(layout, seq, roles);
  for (const Entry& e : entries) {
    if (e.m >= 0) roles[e.m].partner_v = e.v;
  }
  DropUnproven(layout, needs_proof, MatchEntries(layout, seq, entries, &roles), &roles);
  return roles;
}

}  // namespace ckptfs::lossy
