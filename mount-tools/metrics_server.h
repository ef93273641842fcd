// The HTTP side of -o metrics=: GET /metrics answers with the daemon's
// sample in the Prometheus text format (base/metrics_text.h), through
// civetweb (Debian's libcivetweb1: there is no prometheus-cpp in Debian 12,
// and civetweb is a maintained embeddable server). Here, in the CLI, so
// that neither store/ nor fuse/ depends on an HTTP library.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "mount-tools/mount_options.h"

struct mg_context;
struct mg_connection;

namespace ckptfs {

// Refuses an address other than loopback without allow_remote, and binds
// a socket to it once: a port in use then fails `ckptfs mount` on the
// user's terminal, before the daemon forks (the server itself starts after
// the fork, since its threads would not survive it).
Status CheckMetricsAddress(const MetricsAddress& addr);

class MetricsServer {
 public:
  // Serves `text()` at /metrics on `addr`; every other path is 404.
  static Result<std::unique_ptr<MetricsServer>> Start(const MetricsAddress& addr, std::function<std::string()> text);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  explicit MetricsServer(std::function<std::string()> text) : text_(std::move(text)) {}
  static int Handle(mg_connection* conn, void* self);

  std::function<std::string()> text_;
  mg_context* ctx_ = nullptr;
};

}  // namespace ckptfs
