// The mount option table (mount-tools/mount_options.cc): every option's
// setter, the generic checks (unknown option, missing value) and the
// values each parser refuses, with the messages users see.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mount-tools/mount_options.h"

namespace ckptfs {
namespace {

MountOptions Parsed(const std::string& list) {
  MountOptions o;
  Status st = ParseMountOptions(list, &o);
  EXPECT_TRUE(st.ok()) << list << ": " << st.message();
  return o;
}

std::string ErrorOf(const std::string& list) {
  MountOptions o;
  Status st = ParseMountOptions(list, &o);
  EXPECT_FALSE(st.ok()) << list << " was accepted";
  EXPECT_EQ(st.code(), EINVAL) << list;
  return st.message();
}

// One case per option of the table: an option as a user writes it, and
// what it must have set.
struct SetterCase {
  std::string option;
  std::function<void(const MountOptions&)> check;
};

std::vector<SetterCase> SetterCases() {
  return {
      {"cache_size=64M", [](const MountOptions& o) { EXPECT_EQ(o.fuse.fs.cache_bytes, 64u << 20); }},
      {"chunk_size=1M", [](const MountOptions& o) { EXPECT_EQ(o.store.chunk_size, 1u << 20); }},
      {"zstd_level=-7", [](const MountOptions& o) { EXPECT_EQ(o.store.encoder.zstd_level, -7); }},
      {"tensor_codec=0", [](const MountOptions& o) { EXPECT_FALSE(o.store.encoder.tensor_codec); }},
      {"delta=0", [](const MountOptions& o) { EXPECT_FALSE(o.store.delta); }},
      {"direct_reads=0", [](const MountOptions& o) { EXPECT_FALSE(o.store.direct_pack_reads); }},
      {"keyframe_every=0", [](const MountOptions& o) { EXPECT_EQ(o.store.keyframe_every, 0u); }},
      {"lossy=0.05", [](const MountOptions& o) { EXPECT_DOUBLE_EQ(o.store.lossy, 0.05); }},
      {"lossy_scope=all", [](const MountOptions& o) { EXPECT_EQ(o.store.lossy_scope, lossy::LossyScope::kAll); }},
      {"lossy,lossless", [](const MountOptions& o) { EXPECT_EQ(o.store.lossy, 0); }},
      {"lossy_keyframe_every=64", [](const MountOptions& o) { EXPECT_EQ(o.store.lossy_keyframe_every, 64u); }},
      {"seal_threads=3", [](const MountOptions& o) { EXPECT_EQ(o.fuse.fs.seal_threads, 3); }},
      {"seal_workers=2", [](const MountOptions& o) { EXPECT_EQ(o.store.seal_workers, 2u); }},
      {"decode_threads=3", [](const MountOptions& o) { EXPECT_EQ(o.fuse.fs.decode_threads, 3); }},
      {"max_threads=256", [](const MountOptions& o) { EXPECT_EQ(o.fuse.max_threads, 256); }},
      {"max_fds=512", [](const MountOptions& o) { EXPECT_EQ(o.fuse.fs.max_fds, 512u); }},
      {"device=cuda", [](const MountOptions& o) { EXPECT_EQ(o.device, DeviceRequest::kGpu); }},
      {"gpu_mem=64M", [](const MountOptions& o) { EXPECT_EQ(o.cuda.memory_bytes, size_t{64} << 20); }},
      {"read_ahead=1M", [](const MountOptions& o) { EXPECT_EQ(o.fuse.read_ahead, 1u << 20); }},
      {"attr_timeout=0.5", [](const MountOptions& o) { EXPECT_DOUBLE_EQ(o.fuse.fs.attr_timeout, 0.5); }},
      {"entry_timeout=0", [](const MountOptions& o) { EXPECT_DOUBLE_EQ(o.fuse.fs.entry_timeout, 0); }},
      {"log=/var/log/x.log", [](const MountOptions& o) { EXPECT_EQ(o.log_path, "/var/log/x.log"); }},
      {"log_level=off", [](const MountOptions& o) { EXPECT_EQ(o.log_level, "off"); }},
      {"log_max=1M", [](const MountOptions& o) { EXPECT_EQ(o.log_file.max_bytes, 1u << 20); }},
      {"log_max=0", [](const MountOptions& o) { EXPECT_EQ(o.log_file.max_bytes, 0u); }},
      {"max_write=4K", [](const MountOptions& o) { EXPECT_EQ(o.fuse.fs.max_write, 4096u); }},
      {"writeback", [](const MountOptions& o) { EXPECT_TRUE(o.fuse.fs.writeback_cache); }},
      {"debug",
       [](const MountOptions& o) {
         EXPECT_TRUE(o.fuse.debug);
         EXPECT_TRUE(o.foreground);  // libfuse traces to the terminal
       }},
      {"nonempty", [](const MountOptions& o) { EXPECT_TRUE(o.nonempty); }},
      {"metrics=9464", [](const MountOptions& o) { EXPECT_EQ(o.metrics.ToString(), "127.0.0.1:9464"); }},
      {"metrics_remote,metrics=0.0.0.0:80",
       [](const MountOptions& o) {
         EXPECT_EQ(o.metrics.ToString(), "0.0.0.0:80");
         EXPECT_TRUE(o.metrics.allow_remote);
       }},
      {"packs=rados:ckpt", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.packs, "rados:ckpt"); }},
      {"ceph_conf=/etc/ceph/c.conf",
       [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.ceph_conf, "/etc/ceph/c.conf"); }},
      {"gc_grace=0", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.gc_grace_seconds, 0u); }},
      {"gc_interval=300", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.gc_interval_seconds, 300u); }},
      {"seal_hold=/tmp/hold", [](const MountOptions& o) { EXPECT_EQ(o.store.seal_hold, "/tmp/hold"); }},
      {"cluster", [](const MountOptions& o) { EXPECT_TRUE(o.store.cluster.enabled); }},
      {"node=gpu-07.rack_2", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.node, "gpu-07.rack_2"); }},
      {"staging=/local/ckptfs", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.staging_dir, "/local/ckptfs"); }},
      {"lease=5", [](const MountOptions& o) { EXPECT_EQ(o.store.cluster.lease_seconds, 5u); }},
  };
}

const char* const kKernelOptions[] = {
    "allow_other", "allow_root", "default_permissions", "ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec",
    "exec",        "noatime"};

TEST(MountOptionsTest, EachSetterSetsItsField) {
  for (const SetterCase& c : SetterCases()) {
    SCOPED_TRACE(c.option);
    c.check(Parsed(c.option));
  }
}

TEST(MountOptionsTest, KernelOptionsArePassedOnInOrder) {
  std::string list;
  for (const char* k : kKernelOptions) list += std::string(list.empty() ? "" : ",") + k;
  const std::vector<std::string> want(std::begin(kKernelOptions), std::end(kKernelOptions));
  EXPECT_EQ(Parsed(list).fuse.kernel_opts, want);
}

// A new row in the table needs a case above.
TEST(MountOptionsTest, EveryOptionOfTheTableIsTested) {
  std::set<std::string> tested(std::begin(kKernelOptions), std::end(kKernelOptions));
  for (const SetterCase& c : SetterCases())
    for (size_t start = 0; start <= c.option.size();) {
      const size_t end = std::min(c.option.find(',', start), c.option.size());
      const std::string opt = c.option.substr(start, end - start);
      tested.insert(opt.substr(0, opt.find('=')));
      start = end + 1;
    }
  for (const MountOptionSpec& spec : MountOptionTable())
    EXPECT_TRUE(tested.count(std::string(spec.name))) << spec.name << " has no setter test";
}

TEST(MountOptionsTest, DefaultsAreEachLayersOwn) {
  const MountOptions o;
  const StoreOptions store;
  EXPECT_EQ(o.store.chunk_size, store.chunk_size);
  EXPECT_EQ(o.store.encoder.zstd_level, store.encoder.zstd_level);
  EXPECT_EQ(o.store.encoder.tensor_codec, store.encoder.tensor_codec);
  EXPECT_EQ(o.store.delta, store.delta);
  EXPECT_EQ(o.store.keyframe_every, store.keyframe_every);
  EXPECT_EQ(o.store.lossy, 0);
  EXPECT_EQ(o.store.lossy_keyframe_every, store.lossy_keyframe_every);
  EXPECT_TRUE(o.store.create_if_missing);
  EXPECT_TRUE(o.store.take_lock);
  // Where a daemon differs from a library user.
  EXPECT_TRUE(o.store.background_gc);
  // Every core seals (issue 17 dropped the cap of 4).
  EXPECT_EQ(o.store.seal_workers, std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
  EXPECT_EQ(o.fuse.max_threads, FuseOptions{}.max_threads);
  EXPECT_EQ(o.fuse.fs.cache_bytes, FsConfig{}.cache_bytes);
  EXPECT_TRUE(o.fuse.kernel_opts.empty());
  EXPECT_EQ(o.device, DeviceRequest::kAuto);
  EXPECT_FALSE(o.foreground);
}

TEST(MountOptionsTest, UnknownOptionIsNamed) {
  EXPECT_EQ(ErrorOf("bogus"), "unknown mount option 'bogus' (see ckptfs mount --help)");
  EXPECT_EQ(ErrorOf("cache_size=1M,bogus=1"), "unknown mount option 'bogus=1' (see ckptfs mount --help)");
  EXPECT_EQ(ErrorOf("=5"), "unknown mount option '=5' (see ckptfs mount --help)");
  // An option that takes no value is unknown with one.
  EXPECT_EQ(ErrorOf("writeback=1"), "unknown mount option 'writeback=1' (see ckptfs mount --help)");
  EXPECT_EQ(ErrorOf("ro=1"), "unknown mount option 'ro=1' (see ckptfs mount --help)");
}

TEST(MountOptionsTest, EveryValueOptionNeedsAValue) {
  int checked = 0;
  for (const MountOptionSpec& spec : MountOptionTable()) {
    if (spec.takes != MountOptionSpec::Takes::kValue) continue;
    const std::string name(spec.name);
    EXPECT_EQ(ErrorOf(name), "option " + name + " needs a value (" + name + "=...)");
    ++checked;
  }
  EXPECT_GE(checked, 19);
}

TEST(MountOptionsTest, BadNumbersNameOptionAndRange) {
  EXPECT_EQ(ErrorOf("zstd_level=abc"), "option zstd_level=abc: expected an integer in [-7, 22]");
  EXPECT_EQ(ErrorOf("zstd_level=23"), "option zstd_level=23: expected an integer in [-7, 22]");
  EXPECT_EQ(ErrorOf("zstd_level="), "option zstd_level=: expected an integer in [-7, 22]");
  EXPECT_EQ(ErrorOf("keyframe_every=65"), "option keyframe_every=65: expected an integer in [0, 64]");
  EXPECT_EQ(ErrorOf("lossy_keyframe_every=-1"), "option lossy_keyframe_every=-1: expected an integer in [0, 64]");
  EXPECT_EQ(ErrorOf("seal_threads=0"), "option seal_threads=0: expected an integer in [1, 64]");
  EXPECT_EQ(ErrorOf("seal_workers=1x"), "option seal_workers=1x: expected an integer in [1, 64]");
  EXPECT_EQ(ErrorOf("max_threads=257"), "option max_threads=257: expected an integer in [1, 256]");
  EXPECT_EQ(ErrorOf("max_fds=63"), "option max_fds=63: expected an integer in [64, 1073741824]");
  EXPECT_EQ(ErrorOf("attr_timeout=-1"), "option attr_timeout=-1: expected seconds >= 0");
  EXPECT_EQ(ErrorOf("entry_timeout=soon"), "option entry_timeout=soon: expected seconds >= 0");
}

TEST(MountOptionsTest, BadSizesNameOptionAndRule) {
  EXPECT_EQ(ErrorOf("cache_size=lots"), "option cache_size: bad size 'lots'");
  EXPECT_EQ(ErrorOf("read_ahead=4Q"), "option read_ahead: bad size '4Q': use a number with K, M, G or T");
  EXPECT_EQ(ErrorOf("chunk_size=3000"), "option chunk_size=3000: must be a power of two from 4K to 256M");
  EXPECT_EQ(ErrorOf("chunk_size=512M"), "option chunk_size=512M: must be a power of two from 4K to 256M");
  EXPECT_EQ(ErrorOf("chunk_size=-1"), "option chunk_size=-1: must be a power of two from 4K to 256M");
  EXPECT_EQ(ErrorOf("gpu_mem=1M"), "option gpu_mem=1M: at least 4M");
  EXPECT_EQ(ErrorOf("max_write=2M"), "option max_write=2M: from 4K to 1M");
}

TEST(MountOptionsTest, BadWordsSayWhatIsAccepted) {
  EXPECT_NE(ErrorOf("tensor_codec=2").find("option tensor_codec=2: use 1 ("), std::string::npos);
  EXPECT_NE(ErrorOf("delta=yes").find("option delta=yes: use 1 ("), std::string::npos);
  EXPECT_NE(ErrorOf("direct_reads=2").find("option direct_reads=2: use 1 ("), std::string::npos);
  EXPECT_EQ(ErrorOf("log_level=shouty"), "option log_level=shouty: use trace, debug, info, warn, error or off");
  EXPECT_EQ(ErrorOf("log_max=100"), "option log_max=100: 0 (never rotate) or at least 4K");
  EXPECT_NE(ErrorOf("device=tpu").find("device=tpu: use auto"), std::string::npos);
  EXPECT_NE(ErrorOf("lossy_scope=npy").find("lossy scope \"npy\""), std::string::npos);
  EXPECT_NE(ErrorOf("lossy=2").find("lossy policy \"lossy=2\""), std::string::npos);
  EXPECT_NE(ErrorOf("lossless=1").find("lossy policy \"lossless=1\""), std::string::npos);
}

TEST(MountOptionsTest, ListsSkipEmptyEntriesAndLaterOptionsWin) {
  const MountOptions o = Parsed(",zstd_level=5,,zstd_level=7,");
  EXPECT_EQ(o.store.encoder.zstd_level, 7);
  EXPECT_EQ(Parsed("").store.encoder.zstd_level, MountOptions{}.store.encoder.zstd_level);
  EXPECT_DOUBLE_EQ(Parsed("lossy").store.lossy, 0.01);
}

// -o lossy alone is the safe level (docs/LOSSY.md); a number keeps the relative measure alone.
TEST(MountOptionsTest, PlainLossyIsTheSafeLevel) {
  EXPECT_DOUBLE_EQ(Parsed("lossy").store.lossy_steps, kSafeSteps);
  EXPECT_DOUBLE_EQ(Parsed("lossy=safe").store.lossy_steps, kSafeSteps);
  EXPECT_DOUBLE_EQ(Parsed("lossy=aggressive").store.lossy_steps, kAggressiveSteps);
  EXPECT_DOUBLE_EQ(Parsed("lossy=aggressive").store.lossy, kAggressiveFidelity);
  EXPECT_DOUBLE_EQ(Parsed("lossy=steps:5").store.lossy_steps, 5.0);
  EXPECT_DOUBLE_EQ(Parsed("lossy=0.05").store.lossy_steps, 0.0);
  EXPECT_DOUBLE_EQ(Parsed("lossy,lossy=0.05").store.lossy_steps, 0.0);
}

TEST(MountOptionsTest, ParseSizeSuffixes) {
  EXPECT_EQ(ParseSize("4096").value(), 4096u);
  EXPECT_EQ(ParseSize("4K").value(), 4096u);
  EXPECT_EQ(ParseSize("2MiB").value(), 2u << 20);
  EXPECT_EQ(ParseSize("1g").value(), 1ull << 30);
  EXPECT_EQ(ParseSize("1T").value(), 1ull << 40);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("M").ok());
  EXPECT_FALSE(ParseSize("4X").ok());
}

TEST(MountOptionsTest, HelpComesFromTheTable) {
  const std::string help = MountOptionsHelp();
  for (const MountOptionSpec& spec : MountOptionTable())
    EXPECT_NE(help.find(std::string(spec.name)), std::string::npos) << spec.name << " is not in the help";
  // Defaults are read from the structs, not written twice.
  EXPECT_NE(help.find("cache_size=SIZE     decoded-chunk cache limit (default 128M)"), std::string::npos) << help;
  EXPECT_NE(help.find("max_write=SIZE      largest FUSE write request, 4K..1M (default 512K)"), std::string::npos)
      << help;
  EXPECT_NE(help.find("(default auto)"), std::string::npos) << help;
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 80u) << line;
}

}  // namespace
}  // namespace ckptfs
