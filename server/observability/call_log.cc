#include "server/observability/call_log.h"

#include <array>
#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/base/clip_for_message.h"
#include "server/observability/logging.h"

namespace attnserve::server {

namespace {

// The status message is quoted up to this many bytes (the server already clips each client
// string it quotes to 200).
constexpr size_t kMaxLoggedMessageBytes = 400;
constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED.

struct Window {
  absl::Time start = absl::InfinitePast();
  int64_t written = 0;
  int64_t suppressed = 0;
};

struct CallLogState {
  std::atomic<int64_t> per_second{10};
  absl::Mutex mu;
  std::array<Window, kNumCodes + 1> windows ABSL_GUARDED_BY(mu);  // The last: any other code.
};

CallLogState& State() {
  static CallLogState* state = new CallLogState();  // Never destroyed: calls may end at exit.
  return *state;
}

}  // namespace

std::string StatusCodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);  // Empty for a code outside the enum.
  return name.empty() ? "UNKNOWN" : name;
}

void SetFailedCallLogRate(int64_t per_second) { State().per_second.store(per_second); }

void LogFailedCall(absl::string_view rpc, absl::string_view peer, absl::StatusCode code,
                   absl::string_view message) {
  if (code == absl::StatusCode::kOk) return;
  CallLogState& state = State();
  const int64_t limit = state.per_second.load(std::memory_order_relaxed);
  if (limit <= 0) return;
  const int i = static_cast<int>(code);
  const int slot = i > 0 && i < kNumCodes ? i : kNumCodes;
  int64_t dropped = 0;
  {
    absl::MutexLock lock(&state.mu);
    Window& w = state.windows[slot];
    const absl::Time now = absl::Now();
    if (now - w.start >= absl::Seconds(1)) {
      w.start = now;
      w.written = 0;
    }
    if (w.written >= limit) {
      ++w.suppressed;
      return;
    }
    ++w.written;
    dropped = w.suppressed;
    w.suppressed = 0;
  }
  const std::string name = StatusCodeName(code);
  if (dropped > 0) {
    SERVER_LOG_FIELDS(WARNING, (LogFields{{"code", name}, {"suppressed", absl::StrCat(dropped)}}),
                      "call failures suppressed (at most %d log lines per second per code)", limit);
  }
  const LogFields fields = {{"rpc", std::string(rpc)},
                            {"code", name},
                            {"peer", std::string(peer)},
                            {"error", ClipForMessage(message, kMaxLoggedMessageBytes)}};
  switch (code) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      SERVER_LOG_FIELDS(ERROR, fields, "call failed");
      break;
    case absl::StatusCode::kCancelled:
      SERVER_LOG_FIELDS(INFO, fields, "call failed");
      break;
    default:
      SERVER_LOG_FIELDS(WARNING, fields, "call failed");
  }
}

}  // namespace attnserve::server
