// ExportRequest and ImportRequest over the gRPC callback API: moving a request's KV pages and
// positions from one replica to another that holds a session with the same fingerprint
// (server/session/layer_fingerprint.h). docs/api.md, "Moving a request".
//
// Export (server-streaming): the copy is made on the session's queue, ordered with the request's
// steps like Fork, so no Decode changes it while it is read; the header and then the page bytes in
// chunks under the message limit are written from that copy. Import (client-streaming): the header
// is checked against the target session at once (NOT_FOUND, FAILED_PRECONDITION naming what
// differs, INVALID_ARGUMENT, ALREADY_EXISTS) and the pool bytes its pages need are reserved
// (RESOURCE_EXHAUSTED), so a refused import costs no transfer; the bytes are gathered, counted
// (INVALID_ARGUMENT for too many or too few) and handed to the session's queue at the end. A stream
// that fails or is cancelled at any point returns the reservation: nothing leaks.
#ifndef ATTNSERVE_SERVER_RPC_REQUEST_TRANSFER_H_
#define ATTNSERVE_SERVER_RPC_REQUEST_TRANSFER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/capabilities.h"
#include "server/observability/metrics.h"
#include "server/runtime/timer_queue.h"
#include "server/security/caller.h"
#include "server/session/registry.h"
#include "server/session/session.h"

namespace attnserve::server {

// What the transfer calls need from the service; every pointer outlives the calls.
struct TransferContext {
  SessionRegistry* registry = nullptr;
  Metrics* metrics = nullptr;
  int64_t max_message_bytes = 0;  // The server's limit; page chunks stay under it.
  // Who is calling (UNAUTHENTICATED ends the call); the registry shows a caller its own sessions.
  std::function<absl::StatusOr<Principal>(const grpc::ServerContextBase&)> authenticate;
  // UNAVAILABLE while the replica drains (--drain_to) or stops (SIGTERM), else OK: refuses the
  // call first.
  std::function<grpc::Status()> draining;
  // The serving backend's table: without export_import both calls are UNIMPLEMENTED at once.
  const BackendCapabilities* capabilities = nullptr;
  // An ImportRequest stream that sends no message for this long (its header, then its page
  // bytes) is ended DEADLINE_EXCEEDED and its reserved pool bytes given back
  // (--import_idle_timeout; zero = never). Checked on `timer`.
  absl::Duration import_idle_timeout = absl::ZeroDuration();
  TimerQueue* timer = nullptr;
  // The same for a ForwardStream that owes rows or its header (--forward_stream_idle_timeout):
  // ended DEADLINE_EXCEEDED, and every request it created released (server/rpc/forward_stream.h).
  absl::Duration forward_stream_idle_timeout = absl::ZeroDuration();
};

// The header ExportRequest sends first for `exported`, a request of `session` (also what a drain
// sends its peer).
v1::ExportedRequest ExportedRequestHeader(const Session& session, const RequestExport& exported);

// The reactors of one ExportRequest / ImportRequest call; each deletes itself when done.
// ExportRequest is served as a bidi stream that reads its one request only once the caller is
// authenticated (StreamedUnaryCall, server/rpc/wire_call.h).
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartExportRequest(
    const TransferContext& context, grpc::CallbackServerContext* call);
grpc::ServerReadReactor<grpc::ByteBuffer>* StartImportRequest(const TransferContext& context,
                                                              grpc::CallbackServerContext* call,
                                                              grpc::ByteBuffer* response);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_REQUEST_TRANSFER_H_
