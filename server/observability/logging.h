// Minimal logging for the server: timestamped lines on stderr, as text or as JSON.
//
// Abseil 20220623 (Debian 12) has no absl/log, so this stands in for it with the same shape:
//   SERVER_LOG(INFO, "listening on %s", address);
// The format is checked at compile time by absl::StrFormat. Structured fields (key/value pairs)
// go with SERVER_LOG_FIELDS or WriteLogLine.
//
// Two formats (--log_format, SetLogFormat):
//   text: "2024-05-01 12:00:00.123456 I message key=value key=\"a value\"" (local time; a value
//         with spaces, quotes, '=' or control characters is quoted with C escapes);
//   json: {"ts":"2024-05-01T12:00:00.123456Z","level":"INFO","msg":"message","key":"value"}, one
//         object per line (UTC; strings JSON-escaped, invalid UTF-8 replaced by U+FFFD), for log
//         pipelines.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace attnserve::server {

enum class LogFormat { kText, kJson };

// "text" or "json"; false for anything else. Process-wide; set once at startup (before threads
// log), kText until then.
bool ParseLogFormat(absl::string_view name, LogFormat* format);
void SetLogFormat(LogFormat format);
LogFormat GetLogFormat();

// Key/value pairs of a log line, in order. Keys are fixed identifiers ([a-z_]); values any bytes.
using LogFields = std::vector<std::pair<std::string, std::string>>;

// Sends what gRPC itself logs (gpr_log) through WriteLogLine, so that every line of the process
// has the chosen format.
void RouteGrpcLogging();

}  // namespace attnserve::server

namespace attnserve::server::internal {

// Writes one line in the current format to stderr in one write, so lines from different threads
// do not interleave. `severity` is 'I', 'W' or 'E'.
void WriteLogLine(char severity, absl::string_view message, const LogFields& fields = {});

// The line WriteLogLine would write (without the newline), for tests.
std::string FormatLogLine(LogFormat format, char severity, absl::string_view message,
                          const LogFields& fields);

}  // namespace attnserve::server::internal

#define SERVER_LOG_SEVERITY_INFO 'I'
#define SERVER_LOG_SEVERITY_WARNING 'W'
#define SERVER_LOG_SEVERITY_ERROR 'E'

#define SERVER_LOG(severity, ...)                                             \
  ::attnserve::server::internal::WriteLogLine(SERVER_LOG_SEVERITY_##severity, \
                                              ::absl::StrFormat(__VA_ARGS__))

// SERVER_LOG_FIELDS(WARNING, fields, "call failed") with a LogFields `fields`.
#define SERVER_LOG_FIELDS(severity, fields, ...)                              \
  ::attnserve::server::internal::WriteLogLine(SERVER_LOG_SEVERITY_##severity, \
                                              ::absl::StrFormat(__VA_ARGS__), fields)

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_LOGGING_H_
