// The HTTP endpoint of /metrics: a small HTTP/1.x server of our own for one text resource.
//
// Why not prometheus-cpp's Exposer: it runs on Debian's civetweb, whose threads get a fixed
// 100 KiB stack (built with USE_STACK_SIZE=102400; no runtime option changes it). glibc carves a
// process's static TLS out of that stack, and this server's (OpenBLAS alone has 60 KiB) leaves
// civetweb too little for its error-page path: every request it answers with an error page
// (GET /, POST, a bad Content-Length or chunk size) overflowed the stack in
// mg_send_http_error -> mg_printf and killed the whole server with SIGSEGV. Its worker threads
// also wait on slow clients, so two half-open connections blocked every scraper for seconds.
//
// This server runs one thread with one poll() loop over non-blocking sockets, so no client can
// hold up another: each connection has a deadline to send its request head (request_timeout,
// answered 408) and one to take the answer (response_timeout, then closed), heads are bounded
// (max_head_bytes: 414 or 431), connections beyond max_connections are answered 503 at once,
// and the verdict on a head is scrape_request.h's. Every answer closes the connection
// ("Connection: close"); unread request bytes are drained briefly first, so that the client is
// not sent a reset before it reads the answer. Rendering runs on the loop thread: it takes
// milliseconds (Metrics::Render).
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_SERVER_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_SERVER_H_

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace attnserve::server {

struct MetricsHttpLimits {
  absl::Duration request_timeout = absl::Seconds(1);    // Accept to the end of the request head.
  absl::Duration response_timeout = absl::Seconds(10);  // To write the whole answer.
  size_t max_head_bytes = 8192;                         // Request line and headers together.
  int max_connections = 64;                             // Open at once; more are answered 503.
};

class MetricsHttpServer {
 public:
  // Returns the text exposition; called on the server's thread for each GET /metrics.
  using Render = std::function<std::string()>;

  // Listens on `address` (host:port, [v6]:port or :port for every interface; port 0 picks a free
  // port) and serves until destroyed. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& address, Render render, const MetricsHttpLimits& limits = {});

  // Stops the loop, closes every connection and joins the thread.
  ~MetricsHttpServer();

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  struct Connection;

  MetricsHttpServer(int listen_fd, int wake_fd, int port, Render render,
                    const MetricsHttpLimits& limits);
  void Loop();

  const int listen_fd_;
  const int wake_fd_;  // eventfd: the destructor writes to it to end poll().
  const int port_;
  const Render render_;
  const MetricsHttpLimits limits_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // Last: started once everything above is set.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_METRICS_HTTP_SERVER_H_
