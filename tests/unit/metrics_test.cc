// The daemon's metrics: the registry (base/metrics.h), the Prometheus text
// written and read back (base/metrics_text.h), the -o metrics= address
// (mount-tools/mount_options.cc), the pack index's totals, and the counted
// progress line of `ckptfs gc`.
#include <gtest/gtest.h>

#include "base/metrics_text.h"
#include "mount-tools/mount_options.h"
#include "mount-tools/progress.h"
#include "store/pack_index.h"

namespace ckptfs {
namespace {

bool HasLine(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(MetricsText, EveryFamilyHasHelpTypeAndItsValue) {
  MetricsSample s;
  s.logical_bytes = 4096;
  s.stored_bytes = 1024;
  s.seal_queue_depth = 2;
  s.seal_queue_oldest_seconds = 1.5;
  s.cache_hits = 7;
  s.eio_errors = 3;
  s.seal_seconds = 0.25;
  s.chunk_decodes = 5;
  s.chunk_decoded_bytes = 5u << 22;
  s.chunk_decodes_ahead = 4;
  s.read_seconds = 0.5;
  s.pages_pushed_bytes = 8192;
  s.pages_push_dropped = 2;
  const std::string text = FormatPrometheusText(s);
  EXPECT_TRUE(HasLine(text, "# HELP ckptfs_logical_bytes Logical bytes of the sealed files in the store."));
  EXPECT_TRUE(HasLine(text, "# TYPE ckptfs_logical_bytes gauge"));
  EXPECT_TRUE(HasLine(text, "ckptfs_logical_bytes 4096"));
  EXPECT_TRUE(HasLine(text, "ckptfs_stored_bytes 1024"));
  EXPECT_TRUE(HasLine(text, "ckptfs_compression_ratio 4"));
  EXPECT_TRUE(HasLine(text, "ckptfs_seal_queue_depth 2"));
  EXPECT_TRUE(HasLine(text, "ckptfs_seal_queue_oldest_seconds 1.5"));
  EXPECT_TRUE(HasLine(text, "# TYPE ckptfs_chunk_cache_hits_total counter"));
  EXPECT_TRUE(HasLine(text, "ckptfs_chunk_cache_hits_total 7"));
  EXPECT_TRUE(HasLine(text, "ckptfs_errors_total{kind=\"eio\"} 3"));
  EXPECT_TRUE(HasLine(text, "ckptfs_errors_total{kind=\"enospc\"} 0"));
  EXPECT_TRUE(HasLine(text, "ckptfs_seal_seconds_total 0.25"));
  EXPECT_TRUE(HasLine(text, "ckptfs_chunk_decodes_total 5"));
  EXPECT_TRUE(HasLine(text, "ckptfs_chunk_decoded_bytes_total 20971520"));
  EXPECT_TRUE(HasLine(text, "ckptfs_read_requests_total 0"));
  EXPECT_TRUE(HasLine(text, "ckptfs_chunk_decodes_ahead_total 4"));
  EXPECT_TRUE(HasLine(text, "ckptfs_read_seconds_total 0.5"));
  EXPECT_TRUE(HasLine(text, "ckptfs_pages_pushed_bytes_total 8192"));
  EXPECT_TRUE(HasLine(text, "ckptfs_pages_push_dropped_total 2"));
  // Each family's HELP and TYPE appear once, before its series.
  size_t types = 0;
  for (size_t at = 0; (at = text.find("# TYPE ", at)) != std::string::npos; ++at) ++types;
  EXPECT_EQ(types, 24u);
  EXPECT_EQ(text.back(), '\n');
}

TEST(MetricsText, EmptyStoreHasRatioZero) {
  EXPECT_TRUE(HasLine(FormatPrometheusText(MetricsSample{}), "ckptfs_compression_ratio 0"));
}

TEST(MetricsText, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  ErrorHistogram h;
  h.Observe(5e-6);  // <= 1e-5
  h.Observe(1e-3);  // on a bound: counted in it
  h.Observe(2e-3);  // <= 3e-3
  h.Observe(5.0);   // +Inf only
  MetricsSample s;
  s.lossy_error = h.Take();
  const std::string text = FormatPrometheusText(s);
  EXPECT_TRUE(HasLine(text, "# TYPE ckptfs_lossy_relative_error histogram"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"1e-05\"} 1"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"0.0003\"} 1"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"0.001\"} 2"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"0.003\"} 3"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"1\"} 3"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_bucket{le=\"+Inf\"} 4"));
  EXPECT_TRUE(HasLine(text, "ckptfs_lossy_relative_error_count 4"));
  const auto parsed = ParsePrometheusText(text);
  EXPECT_NEAR(parsed.at("ckptfs_lossy_relative_error_sum"), 5e-6 + 1e-3 + 2e-3 + 5.0, 1e-12);
}

TEST(MetricsText, ParsesWhatItWritesAndSkipsWhatItCannot) {
  MetricsSample s;
  s.read_bytes = (1ull << 50) + 1;  // exact in a double up to 2^53
  const auto parsed = ParsePrometheusText(FormatPrometheusText(s) + "garbage\nname notanumber\n\n# comment\n");
  EXPECT_EQ(parsed.at("ckptfs_read_bytes_total"), static_cast<double>((1ull << 50) + 1));
  EXPECT_EQ(parsed.at("ckptfs_errors_total{kind=\"enospc\"}"), 0);
  EXPECT_EQ(parsed.count("garbage"), 0u);
  EXPECT_EQ(parsed.count("name"), 0u);
}

TEST(MetricsRegistry, CountersReadIntoASample) {
  Metrics m;
  m.read_bytes.Add(10);
  m.read_bytes.Add(5);
  m.seal_nanoseconds.Add(1'500'000'000);
  m.seal_failures.Add();
  MetricsSample s;
  ReadCounters(m, &s);
  EXPECT_EQ(s.read_bytes, 15u);
  EXPECT_DOUBLE_EQ(s.seal_seconds, 1.5);
  EXPECT_EQ(s.seal_failures, 1u);
}

TEST(MetricsAddress, PortAloneIsLoopback) {
  auto a = ParseMetricsAddress("9464");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9464);
  EXPECT_TRUE(a->loopback());
  EXPECT_EQ(a->ToString(), "127.0.0.1:9464");
}

TEST(MetricsAddress, HostsAndTheirLoopbackness) {
  EXPECT_TRUE(ParseMetricsAddress("127.0.0.2:80")->loopback());
  EXPECT_TRUE(ParseMetricsAddress("localhost:80")->loopback());
  EXPECT_TRUE(ParseMetricsAddress("[::1]:9464")->loopback());
  EXPECT_EQ(ParseMetricsAddress("[::1]:9464")->ToString(), "[::1]:9464");
  EXPECT_FALSE(ParseMetricsAddress("0.0.0.0:9464")->loopback());
  EXPECT_FALSE(ParseMetricsAddress("10.1.2.3:9464")->loopback());
  EXPECT_FALSE(ParseMetricsAddress("[::]:9464")->loopback());
}

TEST(MetricsAddress, RejectsWhatIsNoAddress) {
  for (const char* bad : {"", "0", "65536", "host.example:80", "1.2.3.4:", "1.2.3.4:x", "[::1]9464", "-1"})
    EXPECT_FALSE(ParseMetricsAddress(bad).ok()) << bad;
}

TEST(MetricsAddress, MountOptionsInEitherOrder) {
  MountOptions a, b;
  ASSERT_TRUE(ParseMountOptions("metrics=0.0.0.0:9000,metrics_remote", &a).ok());
  ASSERT_TRUE(ParseMountOptions("metrics_remote,metrics=0.0.0.0:9000", &b).ok());
  EXPECT_TRUE(a.metrics.allow_remote && b.metrics.allow_remote);
  EXPECT_EQ(a.metrics.port, 9000);
  MountOptions c;
  EXPECT_FALSE(c.metrics.enabled());
  EXPECT_FALSE(ParseMountOptions("metrics=nothing", &c).ok());
}

TEST(PackIndexTotals, FollowRootsRetirementAndDeletion) {
  PackIndex index;
  index.Add(1, PackMeta{}, 1000, 4096, 300);
  index.Add(2, PackMeta{}, 2000, 4096, 500);
  EXPECT_EQ(index.totals().stored, 800u);
  EXPECT_EQ(index.totals().root_logical, 0u);
  index.AddRoot(1);
  index.AddRoot(2);
  EXPECT_EQ(index.totals().root_logical, 3000u);
  index.Retire(1);  // rewritten in place: not a sealed file's pack any more, but kept
  EXPECT_EQ(index.totals().root_logical, 2000u);
  EXPECT_EQ(index.totals().stored, 800u);
  EXPECT_EQ(index.Unretire(1), std::vector<ObjectId>{1});
  EXPECT_EQ(index.totals().stored, 500u);
  EXPECT_EQ(index.DropRoot(2), std::vector<ObjectId>{2});
  EXPECT_EQ(index.totals().root_logical, 0u);
  EXPECT_EQ(index.totals().stored, 0u);
}

TEST(Progress, CountedLineForGc) {
  EXPECT_EQ(Progress::Line("gc", 3, 12, 2, "packs"), "gc  3 / 12 packs  25%  1.5 packs/s  ETA 0:06");
  EXPECT_EQ(Progress::Line("gc", 0, 0, 0, "packs"), "gc  0 / 0 packs  0.0 packs/s");
}

}  // namespace
}  // namespace ckptfs
