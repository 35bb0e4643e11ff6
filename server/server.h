// Starting, running and draining the attnserve gRPC server. main.cc only parses flags.
#ifndef ATTNSERVE_SERVER_SERVER_H_
#define ATTNSERVE_SERVER_SERVER_H_

#include "absl/status/status.h"
#include "server/server_options.h"

namespace attnserve::server {

// Serves until SIGTERM or SIGINT, then stops accepting calls, lets in-flight calls finish for up
// to options.shutdown_grace (cancelling the rest), frees every session and returns OK.
// Errors before serving: INVALID_ARGUMENT for bad options, FAILED_PRECONDITION for a backend that
// is not built or has no usable device (cuda), UNAVAILABLE when the address cannot be bound.
// Must be called before any other thread is started: it blocks SIGTERM/SIGINT so that only its
// own wait receives them.
absl::Status RunServer(const ServerOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVER_H_
