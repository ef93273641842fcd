// One sample of the daemon's figures and the Prometheus text exposition
// format (version 0.0.4) it is served in: by the HTTP endpoint of
// `-o metrics=`, and by the user.ckptfs.metrics attribute of the mount's
// root, which `ckptfs top` reads. Written here rather than with a client
// library: Debian 12 packages none for C++ (no prometheus-cpp), and the
// format is a few lines per metric.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "base/metrics.h"

namespace ckptfs {

// The mount root's attribute that holds a sample as Prometheus text.
inline constexpr char kMetricsXattr[] = "user.ckptfs.metrics";

struct MetricsSample {
  // The store as the daemon's pack index holds it.
  uint64_t logical_bytes = 0;  // sealed files
  uint64_t stored_bytes = 0;   // packs
  // Files staged and not yet sealed: waiting, being sealed, or waiting for
  // a retry; and how long the oldest of them has been waiting.
  uint64_t seal_queue_depth = 0;
  double seal_queue_oldest_seconds = 0;
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_bytes = 0;
  uint64_t cache_capacity_bytes = 0;
  // From the registry (base/metrics.h).
  uint64_t sealed_files = 0;
  uint64_t sealed_bytes = 0;
  uint64_t sealed_pack_bytes = 0;
  double seal_seconds = 0;
  uint64_t read_bytes = 0;
  uint64_t read_requests = 0;
  uint64_t chunk_decodes = 0;
  uint64_t chunk_decodes_ahead = 0;
  uint64_t pages_pushed_bytes = 0;
  uint64_t pages_push_dropped = 0;
  double read_seconds = 0;
  uint64_t chunk_decoded_bytes = 0;
  uint64_t eio_errors = 0;
  uint64_t enospc_errors = 0;
  uint64_t seal_failures = 0;
  ErrorHistogram::Snapshot lossy_error;

  double ratio() const { return stored_bytes == 0 ? 0.0 : double(logical_bytes) / double(stored_bytes); }
};

// Copies the registry's counters into `out`.
void ReadCounters(const Metrics& m, MetricsSample* out);

// The sample as Prometheus text: # HELP and # TYPE, then one line per series.
std::string FormatPrometheusText(const MetricsSample& s);

// The series of a Prometheus text, by name with its labels as written
// (`ckptfs_errors_total{kind="eio"}`); comments and blank lines skipped. A
// line that is not "SERIES VALUE" is skipped too (a newer daemon may add
// what this reader does not know).
std::map<std::string, double> ParsePrometheusText(std::string_view text);

}  // namespace ckptfs
