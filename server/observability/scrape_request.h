// What the metrics endpoint answers to one HTTP request head (the request line and the headers,
// up to and including the blank line), decided before anything is rendered.
//
// The endpoint serves one resource, GET (or HEAD) /metrics, and never reads a request body: a
// request that announces one is answered without reading it, and the connection is closed after
// every answer, so a body's bytes (a bad chunk size, a Content-Length larger than what follows)
// are never parsed. Verdicts, in this order:
//   400 Bad Request         the request line is not METHOD SP TARGET SP HTTP/1.x, a header line
//                           has no ':', or Content-Length is not one non-negative decimal number
//                           (e.g. -1, "1, 2", two different values);
//   413 Content Too Large   Content-Length above kMaxScrapeBodyBytes (e.g. 99999999999);
//   404 Not Found           a path other than /metrics (the query string is ignored);
//   405 Method Not Allowed  a method other than GET and HEAD (the answer says Allow: GET, HEAD);
//   400 Bad Request         GET or HEAD /metrics with a body (Content-Length > 0 or any
//                           Transfer-Encoding): a scrape has none;
//   200 OK                  otherwise.
// Heads that are too large or too slow never get here: see metrics_http_server.h.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_SCRAPE_REQUEST_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_SCRAPE_REQUEST_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace attnserve::server {

inline constexpr int64_t kMaxScrapeBodyBytes = 1 << 20;

struct ScrapeVerdict {
  int status = 400;        // 200, 400, 404, 405 or 413.
  bool head_only = false;  // HEAD: the answer has headers but no body.
  std::string why;         // For non-200 answers: a one-line plain-text body.
};

// `head` is the request up to and including its terminating blank line ("\r\n\r\n" or "\n\n").
ScrapeVerdict JudgeScrapeRequest(absl::string_view head);

// "OK", "Bad Request", ... for the statuses the endpoint sends (also 408, 414, 431, 500, 503).
const char* HttpReasonPhrase(int status);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_SCRAPE_REQUEST_H_
