// Minimal logging for the server: timestamped lines on stderr.
//
// Abseil 20220623 (Debian 12) has no absl/log, so this stands in for it with the same shape:
//   SERVER_LOG(INFO, "listening on %s", address);
// The format is checked at compile time by absl::StrFormat.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace attnserve::server::internal {

// Writes "2024-05-01 12:00:00.123456 I message\n" to stderr in one write, so lines from
// different threads do not interleave.
void WriteLogLine(char severity, absl::string_view message);

}  // namespace attnserve::server::internal

#define SERVER_LOG_SEVERITY_INFO 'I'
#define SERVER_LOG_SEVERITY_WARNING 'W'
#define SERVER_LOG_SEVERITY_ERROR 'E'

#define SERVER_LOG(severity, ...)                                             \
  ::attnserve::server::internal::WriteLogLine(SERVER_LOG_SEVERITY_##severity, \
                                              ::absl::StrFormat(__VA_ARGS__))

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_
