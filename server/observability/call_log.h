// A log line for every failed call, rate-limited.
//
// A call that ends with a non-OK status (INVALID_ARGUMENT, NOT_FOUND, a checkpoint path outside
// --checkpoint_root, UNAUTHENTICATED, ...) is logged with the caller's address, the RPC, the
// status code and its message (clipped), e.g. in text format:
//   ... W call failed rpc=decode code=NOT_FOUND peer=ipv4:127.0.0.1:5432 error="session_id: ..."
// A client failing in a loop must not fill the disk: per status code, at most `per_second` lines
// are written in each one-second window; the rest are counted, and the first line of that code
// written after a suppression is preceded by one saying how many were dropped ("call failures
// suppressed" with code and suppressed fields).
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_CALL_LOG_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_CALL_LOG_H_

#include <cstdint>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace attnserve::server {

// Lines per status code per second; 0 turns failed-call logging off. Process-wide; call once at
// startup (default 10).
void SetFailedCallLogRate(int64_t per_second);

// Logs one failed call (nothing for OK). `rpc` is the metrics label (RpcLabel), `peer` the
// caller's address as gRPC gives it (ServerContext::peer()). Thread-safe.
void LogFailedCall(absl::string_view rpc, absl::string_view peer, absl::StatusCode code,
                   absl::string_view message);

// The canonical name of a status code ("NOT_FOUND"; "UNKNOWN" for a code outside the enum).
std::string StatusCodeName(absl::StatusCode code);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_CALL_LOG_H_
