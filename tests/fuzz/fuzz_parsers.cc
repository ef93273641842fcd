// libFuzzer entries for the format parsers one by one, called directly so
// the fuzzer need not first find the magic DetectLayout dispatches on. One
// source, built once per parser with CKPTFS_FUZZ_<NAME> defined (see
// CMakeLists.txt). Besides "no crash, no hang", each entry checks what the
// parser promises: regions inside the input, sizes that match the shape.
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "codec/formats/gguf.h"
#include "codec/formats/hdf5.h"
#include "codec/formats/layout.h"
#include "codec/formats/limits.h"
#include "codec/formats/msgpack.h"
#include "codec/formats/numpy.h"
#include "codec/formats/ocdbt.h"
#include "codec/formats/onnx.h"
#include "codec/formats/safetensors.h"
#include "codec/formats/tf_bundle.h"
#include "codec/formats/torch.h"
#include "codec/formats/zip.h"

namespace {

using ckptfs::ByteSource;
using ckptfs::FileLayout;
using ckptfs::Result;
namespace f = ckptfs::formats;

// Regions lie inside the input and hold whole elements of their shape.
void Check(const FileLayout& l, uint64_t size, bool sorted) {
  uint64_t end = 0;
  for (const auto& r : l.tensors) {
    if (!f::InRange(r.offset, r.length, size)) std::abort();
    if (sorted && (r.length == 0 || r.offset < end)) std::abort();
    end = r.offset + r.length;
    if (r.dtype == ckptfs::DType::kUnknown) continue;
    auto n = f::NumElements(r.shape);
    auto bytes = n ? f::CheckedMul(*n, ckptfs::DTypeSize(r.dtype)) : std::nullopt;
    if (bytes != r.length) std::abort();
  }
}

void Check(const Result<FileLayout>& r, uint64_t size) {
  if (r.ok()) Check(*r, size, /*sorted=*/false);
}

void Run(const ByteSource& src) {
  const uint64_t size = src.size();
#if defined(CKPTFS_FUZZ_TORCH_ZIP)
  auto z = f::ReadZip(src, size, /*allow_comment=*/true);
  if (z.ok()) {
    for (const auto& e : z->entries) {
      if (!f::InRange(e.data_offset, e.comp_size, size)) std::abort();
    }
    if (f::IsTorchArchive(*z) && z->base == 0) Check(f::ParseTorchZip(src, *z), size);
  }
#elif defined(CKPTFS_FUZZ_TORCH_LEGACY)
  Check(f::ParseTorchLegacy(src), size);
#elif defined(CKPTFS_FUZZ_DCP)
  Check(f::ParseDcp(src), size);
#elif defined(CKPTFS_FUZZ_SAFETENSORS)
  Check(f::ParseSafetensors(src), size);
#elif defined(CKPTFS_FUZZ_NPY)
  Check(f::ParseNpy(src), size);
#elif defined(CKPTFS_FUZZ_NPZ)
  auto z = f::ReadZip(src, size, /*allow_comment=*/true);
  if (z.ok()) Check(f::ParseNpz(src, *z), size);
#elif defined(CKPTFS_FUZZ_GGUF)
  Check(f::ParseGguf(src), size);
#elif defined(CKPTFS_FUZZ_TF_INDEX)
  Check(f::ParseTfIndex(src), size);
  auto idx = f::ReadTfBundleIndex(src);
  if (!idx.ok()) return;
  for (const auto& e : idx->entries) {
    if (e.shard_id >= idx->num_shards || e.offset + e.size < e.offset) std::abort();
  }
  // The input doubles as a data shard: layouts of the shards entries name.
  for (uint32_t shard : {0u, idx->entries.empty() ? 0u : idx->entries.back().shard_id}) {
    Check(f::TfDataLayout(*idx, shard, size), size, /*sorted=*/true);
  }
  // ...and is tied to its own index by content only when the CRCs agree.
  if (auto shard = f::MatchTfDataShard(*idx, src); shard && *shard >= idx->num_shards) std::abort();
  std::vector<f::NamedTfIndex> named{{"self", *std::move(idx)}};
  if (auto l = f::TfDataLayoutFromIndexes(src, named)) Check(*l, size, /*sorted=*/true);
#elif defined(CKPTFS_FUZZ_ONNX)
  Check(f::ParseOnnx(src), size);
#elif defined(CKPTFS_FUZZ_HDF5)
  Check(f::ParseHdf5(src), size);
  auto z = f::ReadZip(src, size, /*allow_comment=*/true);
  if (z.ok() && f::HoldsHdf5Member(src, *z)) Check(f::ParseZippedHdf5(src, *z), size);
#elif defined(CKPTFS_FUZZ_ONNX_EXTERNAL)
  // The input is the model and, under every name it gives, the data file.
  auto refs = f::ReadOnnxExternalTensors(src);
  if (!refs.ok()) return;
  for (const auto& e : *refs) {
    if (auto l = f::OnnxExternalLayout(*refs, e.location, size)) Check(*l, size, /*sorted=*/true);
  }
#elif defined(CKPTFS_FUZZ_FLAX_MSGPACK)
  Check(f::ParseFlaxMsgpack(src), size);
#elif defined(CKPTFS_FUZZ_OCDBT)
  // Input: a 2-byte little-endian length, a manifest of that length, then
  // one data file that every path of the database opens.
  uint8_t len[2];
  if (size < 2 || !src.ReadAt(0, len).ok()) return;
  const uint64_t mlen = len[0] | (uint64_t{len[1]} << 8);
  if (mlen > size - 2) return;
  const ckptfs::SubSource manifest(src, 2, mlen), data(src, 2 + mlen, size - 2 - mlen);
  (void)f::StartsWithOcdbtNode(data);
  // The data file's own last node (ending it, or followed by values).
  for (bool at_end : {true, false}) {
    auto node = at_end ? f::OcdbtTailNode(data, "d/x") : f::OcdbtLastNode(data, "d/x");
    if (node.ok() && !f::InRange(node->node.offset, node->node.length, data.size())) std::abort();
  }
  // Every node anywhere in it (the pages a lossy seal keeps).
  if (auto nodes = f::FindOcdbtNodes(data, 0, data.size(), 1u << 20); nodes.ok()) {
    for (const auto& n : *nodes) {
      if (!f::InRange(n.offset, n.length, data.size())) std::abort();
    }
  }
  auto root = f::ReadOcdbtManifest(manifest);
  if (!root.ok()) return;
  f::OcdbtOpener open = [&](const std::string&) -> Result<std::shared_ptr<const ByteSource>> {
    return std::shared_ptr<const ByteSource>(&data, [](const ByteSource*) {});
  };
  auto keys = f::ListOcdbt(*root, open);
  if (!keys.ok()) return;
  for (const auto& e : *keys) {
    if (e.ref && e.ref->path.size() > f::kMaxNameBytes) std::abort();
  }
  Check(f::OcdbtDataLayout(*keys, root->node.path, data.size(), open), data.size());
#elif defined(CKPTFS_FUZZ_ZARR_CHUNK)
  // Input: the chunk file's size (8 bytes, little-endian), a 1-byte
  // length, the chunk file's name of that length, then the `.zarray` text
  // beside it. The chunk's bytes are never read: its layout follows from
  // its name, its size and the metadata.
  uint8_t head[9];
  if (size < sizeof head || !src.ReadAt(0, head).ok()) return;
  uint64_t chunk_size = 0;
  for (int i = 7; i >= 0; --i) chunk_size = chunk_size << 8 | head[i];
  if (head[8] > size - sizeof head) return;
  auto text = [&](uint64_t off, uint64_t len) {
    std::string t(len, '\0');
    return src.ReadAt(off, std::span(reinterpret_cast<uint8_t*>(t.data()), t.size())).ok() ? t : std::string();
  };
  const std::string key = text(sizeof head, head[8]),
                    zarray = text(sizeof head + head[8], size - sizeof head - head[8]);
  const bool chunk_name = f::LooksLikeZarrChunkName(key);
  auto l = f::ZarrChunkFileLayout(zarray, "params.w", key, chunk_size);
  if (l.ok() && !chunk_name) std::abort();  // only chunk names are chunks
  if (l.ok() && (l->lossy_allowed || l->tensors.size() > 1)) std::abort();
  Check(l, chunk_size);
#else
#error "define one CKPTFS_FUZZ_<PARSER>"
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ckptfs::SpanSource src(std::span<const uint8_t>(data, size));
  Run(src);
  return 0;
}
