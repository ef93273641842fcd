#include "seal/seal_planner.h"

#include "base/log.h"
#include "codec/formats/layout.h"
#include "seal/ocdbt_data.h"
#include "seal/onnx_external.h"
#include "seal/tf_shards.h"

namespace ckptfs {
namespace {

// Parsed at seal time, not while the file streamed in: writers seek back,
// pre-extend or write their index last. A file that says nothing of itself
// (TF data shard, ONNX external data, Orbax data file or legacy zarr chunk)
// takes its layout from the files around it. Unknown formats get no ranges
// (generic path).
FileLayout LayoutForSeal(const ByteSource& file, SiblingSource* siblings) {
  FileLayout layout = DetectLayout(file);
  if (layout.format != "unknown" || !siblings) return layout;
  if (std::optional<FileLayout> tf = TfDataLayoutFromSiblings(file, *siblings)) return std::move(*tf);
  if (std::optional<FileLayout> onnx = OnnxExternalLayoutFromSiblings(file, *siblings)) return std::move(*onnx);
  if (std::optional<FileLayout> zarr = ZarrChunkLayoutFromSiblings(file, *siblings)) return std::move(*zarr);
  // Orbax reads back the node ending a data file before it writes the nodes
  // that may describe the file's values; under a lossy policy such reads
  // do not wait for this seal (FileContent::ReadableBeforeLossySeal), so it
  // may wait for those nodes as a lossless seal does.
  std::optional<FileLayout> o = OcdbtDataLayoutFromSiblings(file, *siblings, kOcdbtNodeWait);
  return o ? std::move(*o) : layout;
}

// Reads of B+tree nodes did not wait for this seal (seal/read_hints.h):
// what they were served stays as it is.
Status KeepServedBytesExact(const ByteSource& file, const std::string& ctx, FileLayout* layout) {
  if (const size_t n = KeepOcdbtTailExact(file, layout); n > 0) {
    spdlog::info("{}: {} tensor(s) overlapping the page of the file's last B+tree node or after it stay exact", ctx, n);
  }
  ASSIGN_OR_RETURN(const size_t near_nodes, KeepOcdbtNodePagesExact(file, layout));
  if (near_nodes > 0) spdlog::info("{}: {} tensor(s) sharing a page with a B+tree node stay exact", ctx, near_nodes);
  return Status::Ok();
}

class FormatPlanner : public SealPlanner {
 public:
  Status Plan(const ByteSource& file, const LossyPolicy& policy, SiblingSource* siblings,
              const TensorChunkOptions& chunk_options, const std::string& ctx, SealCoding* out) const override {
    // A seal that would wait for more of its save gives its slot back (SealWait).
    auto waits_for_save = [&] { return siblings != nullptr && siblings->Postponed(); };
    const Status postponed = Status::Error(kSealPostponed, "waiting for more of its save");
    FileLayout layout = LayoutForSeal(file, siblings);
    if (waits_for_save()) return postponed;
    out->chunk_size = PackChunkSizeFor(layout, out->chunk_size);
    if (policy.lossy()) RETURN_IF_ERROR(KeepServedBytesExact(file, ctx, &layout));
    out->tensors = TensorRangesOf(layout);
    spdlog::debug("{}: format {}, {} tensor ranges{}{}", ctx, layout.format, out->tensors.size(),
                  layout.note.empty() ? "" : ": ", LogSafe(layout.note));
    if (!policy.lossy()) return Status::Ok();
    std::optional<LossyCoder>& lossy = out->lossy;
    lossy.emplace(file, layout, out->tensors, policy, chunk_options, siblings);
    if (waits_for_save()) return postponed;
    if (!lossy->active()) {
      spdlog::info("{}: {} under {}: nothing in the lossy scope, sealed losslessly", ctx, layout.format,
                   FormatLossyPolicy(policy));
      lossy.reset();
      return Status::Ok();
    }
    spdlog::info("{}: {} under {}: weights weighed by {}{}{}", ctx, layout.format, FormatLossyPolicy(policy),
                 SensitivityRuleName(lossy->info().sensitivity), lossy->sibling_note().empty() ? "" : "; ",
                 LogSafe(lossy->sibling_note()));
    return Status::Ok();
  }
};

}  // namespace

const SealPlanner& FormatSealPlanner() {
  static const FormatPlanner planner;
  return planner;
}

}  // namespace ckptfs
