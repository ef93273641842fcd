#include "tests/unit/test_util.h"

#include <stdlib.h>
#include <unistd.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "base/log.h"
#include "store/stub.h"
#include "seal/seal_planner.h"

namespace ckptfs::test {
namespace {

// Recovery and fsck log every action; keep test output readable unless
// CKPTFS_TEST_LOG=<level> asks for it.
struct QuietLogs {
  QuietLogs() {
    const char* lvl = std::getenv("CKPTFS_TEST_LOG");
    spdlog::set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::off);
  }
} quiet_logs;

}  // namespace

TempDir::TempDir() {
  char tmpl[] = "/tmp/ckptfs-test-XXXXXX";
  char* p = ::mkdtemp(tmpl);
  if (p == nullptr) std::abort();
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

void ExpectRegionsInOrder(const FileLayout& l, uint64_t size) {
  uint64_t end = 0;
  for (const TensorRegion& r : l.tensors) {
    EXPECT_GE(r.offset, end);
    EXPECT_GT(r.length, 0u);
    EXPECT_LE(r.offset + r.length, size);
    end = r.offset + r.length;
  }
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return out;
}

std::vector<uint8_t> CompressibleBytes(size_t n, uint64_t seed) {
  static const char* kWords[] = {"layer", ".weight", ".bias", "optimizer", "exp_avg", "step", " ", "\n"};
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out;
  out.reserve(n);
  while (out.size() < n) {
    const char* w = kWords[rng() % 8];
    for (const char* c = w; *c && out.size() < n; ++c) out.push_back(static_cast<uint8_t>(*c));
  }
  return out;
}

std::vector<uint8_t> MixedContent(uint32_t chunk_size, uint64_t seed) {
  std::vector<uint8_t> out = CompressibleBytes(chunk_size, seed);
  std::vector<uint8_t> r = RandomBytes(chunk_size, seed + 1);
  out.insert(out.end(), r.begin(), r.end());
  out.insert(out.end(), chunk_size, 0);
  std::vector<uint8_t> tail = RandomBytes(chunk_size / 3 + 7, seed + 2);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
}

void WriteFileBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> ReadFileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::vector<uint8_t> ReadFdBytes(int fd) {
  std::vector<uint8_t> out;
  uint8_t buf[65536];
  for (uint64_t off = 0;;) {
    ssize_t n = ::pread(fd, buf, sizeof(buf), static_cast<off_t>(off));
    if (n <= 0) break;
    out.insert(out.end(), buf, buf + n);
    off += static_cast<uint64_t>(n);
  }
  return out;
}

size_t CountFiles(const std::string& dir, bool one_level_down) {
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (one_level_down && e.is_directory()) {
      n += CountFiles(e.path().string(), false);
    } else {
      ++n;
    }
  }
  return n;
}

Result<std::vector<uint8_t>> ReadContent(Store* store, int stub_fd) {
  ASSIGN_OR_RETURN(StubRecord rec, ReadStub(store->env(), stub_fd));
  if (rec.state == StubState::kStaged) {
    ASSIGN_OR_RETURN(UniqueFd fd, store->OpenStaging(rec.object));
    return ReadFdBytes(fd.get());
  }
  std::vector<uint8_t> out;
  if (rec.object == 0) return out;
  ASSIGN_OR_RETURN(std::shared_ptr<PackReader> pack, store->OpenPack(rec.object));
  std::vector<uint8_t> chunk;
  for (uint64_t i = 0; i < pack->chunks().size(); ++i) {
    RETURN_IF_ERROR(pack->ReadChunk(i, &chunk, store));
    out.insert(out.end(), chunk.begin(), chunk.end());
  }
  if (out.size() != rec.size) return Status::Corruption("pack size differs from stub size");
  return out;
}

Result<std::vector<uint8_t>> ReadContentAt(Store* store, const std::string& ns_path) {
  ASSIGN_OR_RETURN(UniqueFd fd, store->env()->OpenAt(store->ns_fd(), ns_path, O_RDONLY));
  return ReadContent(store, fd.get());
}

StoreOptions SmallChunks(uint32_t chunk_size) {
  StoreOptions o;
  o.planner = &FormatSealPlanner();
  o.chunk_size = chunk_size;
  return o;
}

Result<StubRecord> MakeStagedFile(Store* store, const std::string& name, const std::vector<uint8_t>& bytes) {
  Env* env = store->env();
  ASSIGN_OR_RETURN(UniqueFd stub, env->OpenAt(store->ns_fd(), name, O_CREAT | O_RDWR, 0644));
  ASSIGN_OR_RETURN(StubRecord cur, ReadStub(env, stub.get()));
  ObjectId id = 0;
  ASSIGN_OR_RETURN(UniqueFd staging, store->CreateStaging(&id));
  RETURN_IF_ERROR(env->PWriteAll(staging.get(), bytes, 0));
  RETURN_IF_ERROR(env->Fdatasync(staging.get()));
  RETURN_IF_ERROR(store->SyncStagingDir());
  StubRecord staged{.state = StubState::kStaged, .size = bytes.size(), .object = id};
  ASSIGN_OR_RETURN(StubRecord written, WriteStub(env, stub.get(), cur, staged));
  RETURN_IF_ERROR(env->Fsync(stub.get()));
  RETURN_IF_ERROR(env->Fsync(store->ns_fd()));
  return written;
}

Result<StubRecord> MakeSealedFile(Store* store, const std::string& name, const std::vector<uint8_t>& bytes) {
  ASSIGN_OR_RETURN(StubRecord staged, MakeStagedFile(store, name, bytes));
  ASSIGN_OR_RETURN(UniqueFd stub, store->env()->OpenAt(store->ns_fd(), name, O_RDWR));
  ASSIGN_OR_RETURN(UniqueFd staging, store->OpenStaging(staged.object));
  return store->SealStub(stub.get(), staged, staging.get());
}

void PutLE(std::vector<uint8_t>* b, uint64_t v, unsigned width) {
  for (unsigned i = 0; i < width; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint16_t F32ToF16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7bff);
  return static_cast<uint16_t>(sign | (exp << 10) | ((x >> 13) & 0x3ff));
}

std::vector<uint8_t> BuildSafetensors(const std::vector<SafetensorsTensor>& tensors) {
  std::string json = "{\"__metadata__\":{\"format\":\"pt\"}";
  uint64_t pos = 0;
  for (const SafetensorsTensor& t : tensors) {
    json += ",\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) json += (i ? "," : "") + std::to_string(t.shape[i]);
    json += "],\"data_offsets\":[" + std::to_string(pos) + "," + std::to_string(pos + t.data.size()) + "]}";
    pos += t.data.size();
  }
  json += "}";
  while (json.size() % 8 != 0) json += ' ';
  ByteWriter w;
  w.U64(json.size());
  w.Str(json);
  for (const SafetensorsTensor& t : tensors) w.Raw(t.data);
  return w.b;
}

std::vector<std::vector<uint8_t>> NpyVersions(int n, size_t elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> init(0.f, 0.02f), step(0.f, 1e-5f);
  std::vector<float> w(elems);
  for (float& x : w) x = init(rng);
  std::vector<std::vector<uint8_t>> out;
  for (int v = 0; v < n; ++v) {
    out.push_back(NpyF32({reinterpret_cast<const uint8_t*>(w.data()), 4 * w.size()}));
    for (size_t i = 0; i < elems / 2; ++i) w[i] += step(rng);
  }
  return out;
}

std::vector<uint8_t> NpyF32(std::span<const uint8_t> f32) {
  std::string hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(f32.size() / 4) + ",), }";
  while ((10 + hdr.size() + 1) % 64 != 0) hdr += ' ';
  hdr += '\n';
  std::vector<uint8_t> b = {
      0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, static_cast<uint8_t>(hdr.size()), static_cast<uint8_t>(hdr.size() >> 8)};
  b.insert(b.end(), hdr.begin(), hdr.end());
  b.insert(b.end(), f32.begin(), f32.end());
  return b;
}

Status MemBases::ReadPackRange(ObjectId pack, uint64_t offset, std::span<uint8_t> out) {
  auto it = packs.find(pack);
  if (it == packs.end()) return Status::Error(ENOENT, "no pack " + std::to_string(pack));
  if (offset > it->second.size() || it->second.size() - offset < out.size()) {
    return Status::Corruption("range " + std::to_string(offset) + " is outside base pack");
  }
  std::memcpy(out.data(), it->second.data() + offset, out.size());
  return Status::Ok();
}

}  // namespace ckptfs::test
