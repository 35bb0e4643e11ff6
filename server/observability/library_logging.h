// Routes what the protobuf library logs (e.g. "String field ... contains invalid UTF-8 data" for
// every malformed request) into the server's log, rate-limited: a client sending malformed
// messages in a loop must not be able to fill the disk with them.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_LIBRARY_LOGGING_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_LIBRARY_LOGGING_H_

#include <cstdint>

namespace attnserve::server {

// At most `lines_per_minute` protobuf log lines are written each minute; the rest are counted,
// and the first line written after a suppression says how many were dropped. Process-wide;
// call once at startup.
void RateLimitProtobufLogging(int64_t lines_per_minute = 60);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_LIBRARY_LOGGING_H_
