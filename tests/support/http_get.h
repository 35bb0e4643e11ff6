// The tests' one HTTP client: a plain GET over a loopback TCP socket (no client library), for the
// server's /metrics endpoint and HAProxy's stats page.
#ifndef ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_
#define ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"

namespace attnserve::server_test {

// A TCP connection to 127.0.0.1:port (-1 on failure); with send and receive timeouts of
// `timeout` unless it is zero.
int ConnectLoopback(int port, std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

struct HttpAnswer {
  int status = -1;       // "HTTP/1.x 404 Not Found" -> 404; -1 when the answer has no status line.
  std::string response;  // Everything the server sent, headers included.
  std::string body;      // After the blank line that ends the headers.
};

// GET `path` from 127.0.0.1:port over HTTP/1.0 (the server closes after the answer), read until
// it closes. Bounded: socket timeouts of `timeout`. UNAVAILABLE when it cannot connect or send,
// DEADLINE_EXCEEDED when the answer does not end in time.
absl::StatusOr<HttpAnswer> HttpGet(int port, const std::string& path,
                                   std::chrono::milliseconds timeout = std::chrono::seconds(10));

// The body of GET /metrics, or an error (UNAVAILABLE for an answer other than 200).
absl::StatusOr<std::string> ScrapeMetrics(int port);

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_HTTP_GET_H_
