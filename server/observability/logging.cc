#include "server/observability/logging.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace attnserve::server::internal {

void WriteLogLine(char severity, absl::string_view message) {
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%E6S", absl::Now(), absl::LocalTimeZone()), " ",
                   absl::string_view(&severity, 1), " ", message, "\n");
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace attnserve::server::internal
