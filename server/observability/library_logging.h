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

// Routes gRPC core's log lines (errors, at its default verbosity) into the server's log, and
// calls `on_listener_failed` (once, on the gRPC thread that logged it) when gRPC reports that
// accept4 failed on a listening port ("Failed accept4: Too many open files"): gRPC 1.51 stops
// that listener for good then (tcp_server_posix.cc never re-arms it), so the port accepts no
// new connection until the process restarts. Process-wide; call once at startup.
void WatchGrpcLogging(void (*on_listener_failed)(const char* message));

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_LIBRARY_LOGGING_H_
