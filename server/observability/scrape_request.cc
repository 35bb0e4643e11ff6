#include "server/observability/scrape_request.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace attnserve::server {

namespace {

ScrapeVerdict Refuse(int status, absl::string_view why) {
  return ScrapeVerdict{status, false, std::string(why)};
}

}  // namespace

ScrapeVerdict JudgeScrapeRequest(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& line : lines) absl::ConsumeSuffix(&line, "\r");
  if (lines.empty()) return Refuse(400, "empty request");

  // METHOD SP TARGET SP HTTP/1.x
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      !absl::StartsWith(parts[2], "HTTP/1.")) {
    return Refuse(400, "malformed request line");
  }
  const absl::string_view method = parts[0];
  absl::string_view path = parts[1];
  path = path.substr(0, path.find('?'));

  bool has_body = false;
  bool has_length = false;
  uint64_t length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) continue;  // The terminating blank line.
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0) return Refuse(400, "malformed header");
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      has_body = true;
    } else if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      uint64_t this_length = 0;
      // Digits only: SimpleAtoi would take "+5" and " 5"; -1 and 99999999999999999999 fail here.
      if (value.empty() || value.size() > 19 ||
          value.find_first_not_of("0123456789") != absl::string_view::npos ||
          !absl::SimpleAtoi(value, &this_length)) {
        return Refuse(400, "invalid Content-Length");
      }
      if (has_length && this_length != length) return Refuse(400, "conflicting Content-Length");
      has_length = true;
      length = this_length;
    }
  }
  if (length > static_cast<uint64_t>(kMaxScrapeBodyBytes)) {
    return Refuse(413, "request body too large");
  }
  if (length > 0) has_body = true;

  if (path != "/metrics") return Refuse(404, "not found; metrics are at /metrics");
  const bool head_only = method == "HEAD";
  if (method != "GET" && !head_only) return Refuse(405, "only GET and HEAD are allowed");
  if (has_body) return Refuse(400, "a scrape request has no body");
  return ScrapeVerdict{200, head_only, ""};
}

const char* HttpReasonPhrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace attnserve::server
