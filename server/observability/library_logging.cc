#include "server/observability/library_logging.h"

#include <grpc/support/log.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "kernels/base/clip_for_message.h"
#include "server/observability/logging.h"

namespace attnserve::server {

namespace {

struct LogWindow {
  absl::Mutex mu;
  absl::Time start ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  int64_t written ABSL_GUARDED_BY(mu) = 0;
  int64_t suppressed ABSL_GUARDED_BY(mu) = 0;
  int64_t limit = 60;
};

LogWindow& Window() {
  static LogWindow* window = new LogWindow();  // Never destroyed: logging may run at exit.
  return *window;
}

void HandleProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                       const std::string& message) {
  LogWindow& w = Window();
  int64_t dropped = 0;
  {
    absl::MutexLock lock(&w.mu);
    const absl::Time now = absl::Now();
    if (now - w.start >= absl::Minutes(1)) {
      w.start = now;
      w.written = 0;
    }
    if (w.written >= w.limit) {
      ++w.suppressed;
      return;
    }
    ++w.written;
    dropped = w.suppressed;
    w.suppressed = 0;
  }
  if (dropped > 0) {
    SERVER_LOG(WARNING, "protobuf: %d log lines suppressed (rate limit %d per minute)", dropped,
               w.limit);
  }
  const std::string text =
      absl::StrCat("protobuf ", filename, ":", line, ": ", ClipForMessage(message, 500));
  if (level >= google::protobuf::LOGLEVEL_ERROR) {
    SERVER_LOG(ERROR, "%s", text);
  } else if (level == google::protobuf::LOGLEVEL_WARNING) {
    SERVER_LOG(WARNING, "%s", text);
  } else {
    SERVER_LOG(INFO, "%s", text);
  }
}

std::atomic<void (*)(const char*)> listener_failed{nullptr};

void HandleGrpcLog(gpr_log_func_args* args) {
  const char* file = args->file != nullptr ? args->file : "";
  if (const char* slash = std::strrchr(file, '/')) file = slash + 1;
  const std::string text =
      absl::StrCat("grpc ", file, ":", args->line, ": ", ClipForMessage(args->message, 500));
  if (args->severity == GPR_LOG_SEVERITY_ERROR) {
    SERVER_LOG(ERROR, "%s", text);
  } else {
    SERVER_LOG(INFO, "%s", text);
  }
  if (args->message != nullptr && std::strncmp(args->message, "Failed accept4", 14) == 0) {
    if (auto* callback = listener_failed.exchange(nullptr)) callback(args->message);
  }
}

}  // namespace

void WatchGrpcLogging(void (*on_listener_failed)(const char* message)) {
  listener_failed.store(on_listener_failed);
  gpr_set_log_function(&HandleGrpcLog);
}

void RateLimitProtobufLogging(int64_t lines_per_minute) {
  Window().limit = lines_per_minute;
  google::protobuf::SetLogHandler(&HandleProtobufLog);
}

}  // namespace attnserve::server
