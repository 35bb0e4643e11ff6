// ForwardStream over the gRPC callback API: a Forward too large for one message (docs/api.md,
// "ForwardStream").
//
// The header is checked at once (NOT_FOUND, INVALID_ARGUMENT, OUT_OF_RANGE, ALREADY_EXISTS) and
// the Forward becomes a resumable op on the session's scheduler (SessionScheduler::PostResumableOp)
// on its requests. Its first turn plans it and reserves the KV bytes of every row announced
// (RESOURCE_EXHAUSTED before the rows are uploaded); each later turn runs one chunk of rows that
// has arrived (at most --prefill_chunk_tokens, the session's chunk) and queues the chunk's output
// rows for the client, and the op waits between chunks for more rows, so the session's other
// requests keep decoding. Rows are read as they arrive (bytes left in gRPC's buffers would count
// against --max_inflight_message_bytes, past which gRPC resets streams). A failure of any kind (a bad message, too few or too many rows, cancellation, the
// engine) undoes the whole Forward on the session's queue: every request it created is released,
// and the reservation returned. A stream that owes its header or rows and sends nothing for
// --forward_stream_idle_timeout is such a failure (DEADLINE_EXCEEDED), checked on the service's
// TimerQueue: its op would otherwise hold the session's later ops until the call's deadline.
//
// All the reactor's state is guarded by one mutex; compute runs outside it. After the op is
// posted, only its turn (or a write completion the turn armed) finishes the call, so the reactor
// outlives every turn.
#ifndef ATTNSERVE_SERVER_RPC_FORWARD_STREAM_H_
#define ATTNSERVE_SERVER_RPC_FORWARD_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include "server/rpc/request_transfer.h"

namespace attnserve::server {

// The reactor of one ForwardStream call (deletes itself when done). Uses `context`'s registry,
// metrics, message limit, authentication and drain check.
grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* StartForwardStream(
    const TransferContext& context, grpc::CallbackServerContext* call);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_FORWARD_STREAM_H_
