// Sibling moments: where a checkpoint is split into files of one save
// (model.safetensors beside optimizer.pt, as Hugging Face's Trainer writes),
// lossy mode weighs the model file's errors by the optimizer file's Adam
// second moments. Which files may be that optimizer file is the store's
// knowledge (directory, owner, write times: SiblingSource); whether one is
// (its moments match the model's parameters one for one) is decided here.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "codec/formats/layout.h"
#include "codec/lossy/roles.h"

namespace ckptfs {

// Where the candidates for a file's optimizer state come from: the store
// implements it over its namespace (Store::SiblingsOf), tests with
// files in memory. Asked only when a file has weights and no optimizer
// state of its own, and only while its coder is being made.
class SiblingSource {
 public:
  virtual ~SiblingSource() = default;
  // Names of the files that may belong to the same save, most plausible
  // first (nearest in time).
  virtual std::vector<std::string> Candidates() = 0;
  // Candidate `name`'s logical bytes as they are now; they must stay
  // readable while the file is coded. An error skips the candidate.
  virtual Result<std::shared_ptr<const ByteSource>> Open(const std::string& name) = 0;
  // File `name` of the directory above the coded file's (an OCDBT data
  // file's manifest.ocdbt), under the same rules as a candidate.
  virtual Result<std::shared_ptr<const ByteSource>> OpenInParent(const std::string& name) {
    return Status::Error(ENOENT, "no parent directory to open " + name + " in");
  }
  // The coded file's own name in its directory (DCP's .metadata names the
  // shard files it indexes; a TF data shard's name hints at its index);
  // empty when unknown.
  virtual std::string OwnName() { return {}; }
  // The name of the directory holding the coded file (a legacy Orbax
  // zarr array's tree path, for its chunk files' labels); empty when
  // unknown or at the mount's root.
  virtual std::string DirName() { return {}; }
  // Waits a little for more of the save to appear (the .metadata a DCP
  // save writes after its shards) and says whether it is still worth
  // looking again; false once the file's save is surely over, or when this
  // seal may not wait here (Postponed).
  virtual bool WaitForMore() { return false; }
  // Whether WaitForMore said false only because this seal gives its slot
  // back instead of waiting, while more of the save could still come: the
  // seal is then abandoned and tried again later.
  virtual bool Postponed() const { return false; }
  // When the coded file's wait for the rest of its save began: the first
  // try's start, for a seal tried again, so that a bound on the wait spans
  // the tries.
  virtual std::chrono::steady_clock::time_point WaitingSince() const { return std::chrono::steady_clock::now(); }
};

// Parsing further than this many candidates costs more than it helps.
inline constexpr size_t kMaxSiblings = 8;

// Adam's second moments from another file of the same save, for weights
// whose own file lacks them.
struct SiblingMoments {
  std::string name;  // for logs
  std::shared_ptr<const ByteSource> source;
  FileLayout layout;
};

// Candidate `name` of `siblings`, parsed, when it holds second moments;
// nothing when it cannot be read or holds none (a file still being
// written parses as unknown).
std::optional<SiblingMoments> ReadSiblingMoments(SiblingSource& siblings, const std::string& name);

// Whether `sibling`'s second moments belong to the parameters of `model`:
// as many second moments (amsgrad's max_exp_avg_sq aside) as the model has
// parameters, each of the same element type and count and the same shape
// where both parsers know a shape of more than one dimension. When the
// optimizer's param_groups name its parameters (FileLayout::param_names),
// they are paired by those names with the model's labels; otherwise in
// order, and where the sibling names the parameter in the moment's label
// ("fc.weight.exp_avg_sq"), the names must agree. On a match, returns for
// each parameter (index into model.tensors) its second moment's index into
// sibling.tensors; otherwise the reason, for the log.
Result<std::vector<std::pair<size_t, size_t>>> MatchSiblingMoments(const FileLayout& model,
                                                                   const FileLayout& sibling,
                                                                   lossy::LossyScope scope);

}  // namespace ckptfs
