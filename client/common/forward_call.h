// Forward through whichever RPC fits the prompt: the unary Forward while the request (and so its
// answer, as large as its input) fits one message of the server's limit, else ForwardStream
// (docs/api.md, "ForwardStream"), whose answer is reassembled into the same ForwardResponse.
#ifndef ATTNSERVE_CLIENT_COMMON_FORWARD_CALL_H_
#define ATTNSERVE_CLIENT_COMMON_FORWARD_CALL_H_

#include <cstdint>

#include "attnserve/v1/attention_service.grpc.pb.h"
#include "client/common/client.h"
#include "grpcpp/client_context.h"

namespace attnserve {

// Requests up to this size always go unary, without asking the server its limit (the default is
// 4 MiB; no sensible limit is this small). Larger ones ask once per Client.
inline constexpr int64_t kAlwaysUnaryForwardBytes = int64_t{16} << 10;
// Room under the server's message limit for the framing of a message of rows.
inline constexpr int64_t kForwardStreamHeadroomBytes = 1024;

// Forward, streamed when `request` does not fit a message of the server's max_message_bytes
// (read once per Client with GetServerInfo). `context` carries the call's deadline and metadata
// either way. A streamed call cannot carry call_id or a model session's layer: those are
// INVALID_ARGUMENT here, before anything is sent.
grpc::Status CallForward(const Client& client, grpc::ClientContext* context,
                         const v1::ForwardRequest& request, v1::ForwardResponse* response);

// ForwardStream always: the header, then the items' rows in messages of at most
// `max_message_bytes`, reading the output rows as they come; `response` as Forward answers.
grpc::Status CallForwardStream(const Client& client, grpc::ClientContext* context,
                               const v1::ForwardRequest& request, int64_t max_message_bytes,
                               v1::ForwardResponse* response);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_FORWARD_CALL_H_
