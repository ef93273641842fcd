#include "mount-tools/metrics_server.h"

#include <arpa/inet.h>
#include <civetweb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>

#include "base/log.h"
#include "base/unique_fd.h"

namespace ckptfs {

Status CheckMetricsAddress(const MetricsAddress& addr) {
  if (!addr.loopback() && !addr.allow_remote)
    return Status::InvalidArgument("metrics=" + addr.ToString() +
                                   " is not a loopback address; the endpoint has no authentication, so serving it to "
                                   "the network needs -o metrics_remote as well");
  sockaddr_storage ss{};
  socklen_t len = 0;
  int family = AF_INET;
  if (auto* v4 = reinterpret_cast<sockaddr_in*>(&ss); ::inet_pton(AF_INET, addr.host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(addr.port);
    len = sizeof *v4;
  } else {
    auto* v6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (::inet_pton(AF_INET6, addr.host.c_str(), &v6->sin6_addr) != 1)
      return Status::InvalidArgument("metrics=" + addr.ToString() + ": not an IP address");
    family = v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(addr.port);
    len = sizeof *v6;
  }
  UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno("metrics=" + addr.ToString() + ": socket");
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
    return Status::FromErrno("metrics=" + addr.ToString() + ": cannot listen there");
  return Status::Ok();
}

int MetricsServer::Handle(mg_connection* conn, void* self) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (std::strcmp(req->request_method, "GET") != 0 && std::strcmp(req->request_method, "HEAD") != 0) {
    mg_send_http_error(conn, 405, "%s", "use GET\n");
    return 405;
  }
  const std::string body = static_cast<MetricsServer*>(self)->text_();
  mg_send_http_ok(conn, "text/plain; version=0.0.4; charset=utf-8", static_cast<long long>(body.size()));
  if (std::strcmp(req->request_method, "GET") == 0) mg_write(conn, body.data(), body.size());
  return 200;
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const MetricsAddress& addr,
                                                            std::function<std::string()> text) {
  mg_init_library(0);
  std::unique_ptr<MetricsServer> server(new MetricsServer(std::move(text)));
  const std::string ports = addr.ToString();
  // Two threads: a scrape is a few kilobytes, and more would only idle.
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "2",
                           "request_timeout_ms", "10000",       nullptr};
  mg_callbacks callbacks{};
  char error[256] = "";
  mg_error_data err{nullptr, error, sizeof error};
  mg_init_data init{&callbacks, server.get(), options};
  server->ctx_ = mg_start2(&init, &err);
  if (server->ctx_ == nullptr)
    return Status::Error(EADDRNOTAVAIL, "metrics=" + ports + ": cannot serve there: " + std::string(error));
  mg_set_request_handler(server->ctx_, "/metrics$", &MetricsServer::Handle, server.get());
  spdlog::info("metrics at http://{}/metrics", ports);
  return server;
}

MetricsServer::~MetricsServer() {
  if (ctx_ != nullptr) mg_stop(ctx_);
}

}  // namespace ckptfs
