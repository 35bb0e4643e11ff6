#include "server/observability/logging.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve::server {

namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};

const char* LevelName(char severity) {
  switch (severity) {
    case 'E':
      return "ERROR";
    case 'W':
      return "WARNING";
    default:
      return "INFO";
  }
}

// The length of the valid UTF-8 sequence at text[i], or 0 if it is not one.
size_t Utf8Length(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n;
  uint32_t min;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  uint32_t code = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

void AppendJsonString(std::string& out, absl::string_view text) {
  out += '"';
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++i;
    } else if (c == '\n') {
      out += "\\n";
      ++i;
    } else if (c == '\r') {
      out += "\\r";
      ++i;
    } else if (c == '\t') {
      out += "\\t";
      ++i;
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\u%04x", c);
      ++i;
    } else if (const size_t n = Utf8Length(text, i); n > 0) {
      out.append(text.data() + i, n);
      i += n;
    } else {
      out += "\\ufffd";  // Not UTF-8: a JSON parser would refuse the line.
      ++i;
    }
  }
  out += '"';
}

// A text-format value: bare when it is a plain token, else quoted with C escapes, so a client's
// string can never break the line or fake another field.
void AppendTextValue(std::string& out, absl::string_view value) {
  bool plain = !value.empty();
  for (const char ch : value) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7F || c == '"' || c == '=' || c == '\\') plain = false;
  }
  if (plain) {
    out.append(value.data(), value.size());
    return;
  }
  out += '"';
  for (const char ch : value) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += ch;
    }
  }
  out += '"';
}

void HandleGrpcLog(gpr_log_func_args* args) {
  const char severity = args->severity == GPR_LOG_SEVERITY_ERROR   ? 'E'
                        : args->severity == GPR_LOG_SEVERITY_INFO  ? 'I'
                        : args->severity == GPR_LOG_SEVERITY_DEBUG ? 'I'
                                                                   : 'W';
  internal::WriteLogLine(severity, absl::StrCat("grpc: ", args->message),
                         {{"source", absl::StrCat(args->file, ":", args->line)}});
}

}  // namespace

bool ParseLogFormat(absl::string_view name, LogFormat* format) {
  if (name == "text") {
    *format = LogFormat::kText;
  } else if (name == "json") {
    *format = LogFormat::kJson;
  } else {
    return false;
  }
  return true;
}

void SetLogFormat(LogFormat format) { g_format.store(format); }

LogFormat GetLogFormat() { return g_format.load(std::memory_order_relaxed); }

void RouteGrpcLogging() { gpr_set_log_function(&HandleGrpcLog); }

namespace internal {

std::string FormatLogLine(LogFormat format, char severity, absl::string_view message,
                          const LogFields& fields) {
  const absl::Time now = absl::Now();
  std::string line;
  if (format == LogFormat::kJson) {
    line = absl::StrCat("{\"ts\":\"",
                        absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", now, absl::UTCTimeZone()),
                        "\",\"level\":\"", LevelName(severity), "\",\"msg\":");
    AppendJsonString(line, message);
    for (const auto& [key, value] : fields) {
      line += ',';
      AppendJsonString(line, key);
      line += ':';
      AppendJsonString(line, value);
    }
    line += '}';
    return line;
  }
  line = absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%E6S", now, absl::LocalTimeZone()), " ",
                      absl::string_view(&severity, 1), " ", message);
  for (const auto& [key, value] : fields) {
    absl::StrAppend(&line, " ", key, "=");
    AppendTextValue(line, value);
  }
  return line;
}

void WriteLogLine(char severity, absl::string_view message, const LogFields& fields) {
  std::string line = FormatLogLine(GetLogFormat(), severity, message, fields);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace internal

}  // namespace attnserve::server
