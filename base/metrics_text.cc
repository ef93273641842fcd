#include "base/metrics_text.h"

#include <cstdio>
#include <cstdlib>

namespace ckptfs {
namespace {

std::string Number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Writer {
 public:
  void Family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void Series(std::string_view series, const std::string& value) {
    out_ += series;
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void One(std::string_view name, std::string_view type, std::string_view help, uint64_t v) {
    Family(name, type, help);
    Series(name, std::to_string(v));
  }
  void One(std::string_view name, std::string_view type, std::string_view help, double v) {
    Family(name, type, help);
    Series(name, Number(v));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

void WriteHistogram(Writer& w, const std::string& name, std::string_view help, const ErrorHistogram::Snapshot& h) {
  w.Family(name, "histogram", help);
  for (size_t i = 0; i < ErrorHistogram::kBounds.size(); ++i) {
    char le[32];
    std::snprintf(le, sizeof le, "%g", ErrorHistogram::kBounds[i]);
    w.Series(name + "_bucket{le=\"" + le + "\"}", std::to_string(h.cumulative[i]));
  }
  w.Series(name + "_bucket{le=\"+Inf\"}", std::to_string(h.count()));
  w.Series(name + "_sum", Number(h.sum));
  w.Series(name + "_count", std::to_string(h.count()));
}

}  // namespace

void ReadCounters(const Metrics& m, MetricsSample* out) {
  out->sealed_files = m.sealed_files.value();
  out->sealed_bytes = m.sealed_bytes.value();
  out->sealed_pack_bytes = m.sealed_pack_bytes.value();
  out->seal_seconds = static_cast<double>(m.seal_nanoseconds.value()) / 1e9;
  out->read_bytes = m.read_bytes.value();
  out->read_requests = m.read_requests.value();
  out->chunk_decodes = m.chunk_decodes.value();
  out->chunk_decoded_bytes = m.chunk_decoded_bytes.value();
  out->chunk_decodes_ahead = m.chunk_decodes_ahead.value();
  out->pages_pushed_bytes = m.pages_pushed_bytes.value();
  out->pages_push_dropped = m.pages_push_dropped.value();
  out->read_seconds = static_cast<double>(m.read_nanoseconds.value()) / 1e9;
  out->eio_errors = m.eio_errors.value();
  out->enospc_errors = m.enospc_errors.value();
  out->seal_failures = m.seal_failures.value();
  out->lossy_error = m.lossy_error.Take();
}

std::string FormatPrometheusText(const MetricsSample& s) {
  Writer w;
  w.One("ckptfs_logical_bytes", "gauge", "Logical bytes of the sealed files in the store.", s.logical_bytes);
  w.One("ckptfs_stored_bytes", "gauge", "Bytes of the packs in the store.", s.stored_bytes);
  w.One("ckptfs_compression_ratio", "gauge", "Logical over stored bytes (0 while nothing is stored).", s.ratio());
  w.One("ckptfs_seal_queue_depth", "gauge", "Files written and not yet sealed: queued, sealing, or to be retried.",
        s.seal_queue_depth);
  w.One("ckptfs_seal_queue_oldest_seconds", "gauge", "How long the oldest of those files has waited (0: none).",
        s.seal_queue_oldest_seconds);
  w.One("ckptfs_sealed_files_total", "counter", "Files sealed into packs.", s.sealed_files);
  w.One("ckptfs_sealed_bytes_total", "counter", "Logical bytes of the files sealed.", s.sealed_bytes);
  w.One("ckptfs_sealed_pack_bytes_total", "counter", "Bytes of the packs those seals wrote.", s.sealed_pack_bytes);
  w.One("ckptfs_seal_seconds_total", "counter", "Seconds spent coding and publishing packs.", s.seal_seconds);
  w.One("ckptfs_read_bytes_total", "counter", "Bytes read through the mount.", s.read_bytes);
  w.One("ckptfs_read_requests_total", "counter", "FUSE read requests answered.", s.read_requests);
  w.One("ckptfs_chunk_decodes_total", "counter", "Chunks decoded, of files and of delta bases.", s.chunk_decodes);
  w.One("ckptfs_chunk_decoded_bytes_total", "counter", "Decoded bytes of those chunks.", s.chunk_decoded_bytes);
  w.One("ckptfs_chunk_decodes_ahead_total", "counter", "Of those chunks, the ones decode-ahead decoded.",
        s.chunk_decodes_ahead);
  w.One("ckptfs_pages_pushed_bytes_total", "counter",
        "Unread bytes of chunks evicted from the cache that were stored into the kernel's page cache instead.",
        s.pages_pushed_bytes);
  w.One("ckptfs_pages_push_dropped_total", "counter",
        "Evicted chunks whose unread bytes were not stored into the page cache (the queue was full).",
        s.pages_push_dropped);
  w.One("ckptfs_read_seconds_total", "counter",
        "Seconds FUSE read requests took from arrival to reply (over the requests: the mean latency).", s.read_seconds);
  w.One("ckptfs_chunk_cache_hits_total", "counter", "Reads of a decoded chunk found in the cache.", s.cache_hits);
  w.One("ckptfs_chunk_cache_misses_total", "counter", "Reads of a decoded chunk that decoded it.", s.cache_misses);
  w.One("ckptfs_chunk_cache_bytes", "gauge", "Bytes of decoded chunks in the cache.", s.cache_bytes);
  w.One("ckptfs_chunk_cache_capacity_bytes", "gauge", "The cache's limit (-o cache_size).", s.cache_capacity_bytes);
  w.Family("ckptfs_errors_total", "counter",
           "Requests answered with an error: eio (a checksum or the backing store failed), enospc (ENOSPC or "
           "EDQUOT).");
  w.Series("ckptfs_errors_total{kind=\"eio\"}", std::to_string(s.eio_errors));
  w.Series("ckptfs_errors_total{kind=\"enospc\"}", std::to_string(s.enospc_errors));
  w.One("ckptfs_seal_failures_total", "counter", "Seals that failed; each is retried with backoff.", s.seal_failures);
  WriteHistogram(w, "ckptfs_lossy_relative_error",
                 "Relative error of each lossy-coded piece of a tensor, as measured when it was sealed.",
                 s.lossy_error);
  return w.Take();
}

std::map<std::string, double> ParsePrometheusText(std::string_view text) {
  std::map<std::string, double> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string_view::npos || sp == 0) continue;
    const std::string value(line.substr(sp + 1));
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0') continue;
    out[std::string(line.substr(0, sp))] = v;
  }
  return out;
}

}  // namespace ckptfs
