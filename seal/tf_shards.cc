#include "seal/tf_shards.h"

#include <thread>
#include <vector>

#include "codec/formats/tf_bundle.h"

namespace ckptfs {
namespace {

// Parsing more candidates than this per round costs more than it finds.
constexpr size_t kMaxIndexCandidates = 64;
constexpr std::chrono::milliseconds kPollEvery{50};

// The siblings that parse as bundle indexes now (one still being written
// does not).
std::vector<formats::NamedTfIndex> SiblingIndexes(SiblingSource& siblings) {
  std::vector<formats::NamedTfIndex> out;
  std::vector<std::string> names = siblings.Candidates();
  if (names.size() > kMaxIndexCandidates) names.resize(kMaxIndexCandidates);
  for (const std::string& name : names) {
    Result<std::shared_ptr<const ByteSource>> src = siblings.Open(name);
    if (!src.ok() || (*src)->size() > kMaxTfIndexBytes || !formats::HasTfIndexFooter(**src)) continue;
    Result<formats::TfBundleIndex> idx = formats::ReadTfBundleIndex(**src);
    if (idx.ok()) out.push_back({name, std::move(idx).value()});
  }
  return out;
}

}  // namespace

std::optional<FileLayout> TfDataLayoutFromSiblings(const ByteSource& file, SiblingSource& siblings,
                                                   std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  const bool expect_index = formats::LooksLikeTfDataShardName(siblings.OwnName());
  if (!expect_index && file.size() < kMinUnnamedTfShardBytes) return std::nullopt;
  while (true) {
    if (std::optional<FileLayout> l = formats::TfDataLayoutFromIndexes(file, SiblingIndexes(siblings))) return l;
    if (!expect_index || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(kPollEvery);
  }
}

}  // namespace ckptfs
