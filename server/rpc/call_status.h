// What the RPC handlers (server/rpc/attention_service.cc, server/rpc/request_transfer.cc) share
// about a call's status: absl -> gRPC statuses, the id checks and their bounds, and the report of a
// finished call to metrics.
#ifndef ATTNSERVE_SERVER_RPC_CALL_STATUS_H_
#define ATTNSERVE_SERVER_RPC_CALL_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/observability/metrics.h"

namespace attnserve::server {

// Session ids are 32 hex digits; anything much longer is refused before it is looked up or
// echoed, so a huge id cannot bloat the status message.
inline constexpr size_t kMaxSessionIdBytes = 64;
inline constexpr size_t kMaxCallIdBytes = 128;

// absl and gRPC share the canonical code numbering.
grpc::Status ToGrpc(const absl::Status& status);

// INVALID_ARGUMENT naming `field` when `id` has more than `max_bytes` bytes.
absl::Status CheckIdLength(const std::string& id, absl::string_view field, size_t max_bytes);

// CheckIdLength, and INVALID_ARGUMENT naming `field` when `id` is empty.
absl::Status CheckId(const std::string& id, absl::string_view field, size_t max_bytes);

// Reports a finished call (or stream message) to metrics, and its refusal for KV memory.
void ObserveCall(Metrics& metrics, Rpc rpc, const std::string& variant, const grpc::Status& status,
                 const RpcTiming& timing);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_CALL_STATUS_H_
