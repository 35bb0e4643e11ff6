// The bytes edge of every RPC: requests arrive as raw gRPC ByteBuffers and responses leave as
// ones, so that the service, not gRPC's generated code, decides what a malformed message means.
//
// gRPC's typed handlers answer a request that does not parse with UNIMPLEMENTED or INTERNAL
// ("Message deserialization failed"), and a stream whose next message does not parse simply ends,
// with OK. Parsing here turns both into INVALID_ARGUMENT naming the message type, as docs/api.md
// promises, and lets a response be size-checked before it is sent.
//
// Also what every handler (server/rpc/attention_service.cc, server/rpc/request_transfer.cc,
// server/rpc/forward_stream.cc) shares about a call's status: absl -> gRPC statuses, the id checks
// and their bounds, and the report of a finished call to metrics.
#ifndef ATTNSERVE_SERVER_RPC_WIRE_CALL_H_
#define ATTNSERVE_SERVER_RPC_WIRE_CALL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
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

// Parses `buffer` into `message` (cleared first). False when the bytes are not a valid encoding
// of the message's type (including invalid UTF-8 in a string field).
bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// INVALID_ARGUMENT: "request is not a valid attnserve.v1.X (N bytes could not be parsed)".
grpc::Status UnparseableMessage(const google::protobuf::Message& message, size_t num_bytes);

// INVALID_ARGUMENT: "the stream ended before its attnserve.v1.X request message" (a unary method
// served as a stream, server/rpc/streamed_unary_call.h, whose caller sent no message).
grpc::Status MissingMessage(const google::protobuf::Message& message);

// Serializes `message` into `buffer`. RESOURCE_EXHAUSTED (and `buffer` untouched) when it is
// larger than `max_bytes`.
grpc::Status SerializeMessage(const google::protobuf::Message& message, int64_t max_bytes,
                              grpc::ByteBuffer* buffer);

// How the typed handlers finish a unary call, whatever carries it.
class UnaryCall {
 public:
  virtual ~UnaryCall() = default;
  // Ends the call with `status`; on OK the response is sent first. Called exactly once; the call
  // (and its request and response) may be gone when it returns.
  virtual void Finish(grpc::Status status) = 0;
  // The caller's address (grpc::ServerContext::peer()), for logging a failed call before Finish.
  virtual std::string peer() const = 0;
};

// One unary call carried as bytes: owns the typed request and response for the call's life.
// Created per call; deletes itself in Finish.
template <typename Request, typename Response>
class UnaryExchange final : public UnaryCall {
 public:
  UnaryExchange(grpc::CallbackServerContext* context, grpc::ByteBuffer* wire_response,
                int64_t max_message_bytes)
      : context_(context),
        reactor_(context->DefaultReactor()),
        wire_response_(wire_response),
        max_message_bytes_(max_message_bytes) {}

  grpc::ServerUnaryReactor* reactor() const { return reactor_; }
  std::string peer() const override { return context_->peer(); }
  Request& request() { return request_; }
  Response& response() { return response_; }

  void Finish(grpc::Status status) override {
    if (status.ok()) status = SerializeMessage(response_, max_message_bytes_, wire_response_);
    grpc::ServerUnaryReactor* reactor = reactor_;
    delete this;
    reactor->Finish(std::move(status));
  }

 private:
  grpc::CallbackServerContext* const context_;
  grpc::ServerUnaryReactor* const reactor_;
  grpc::ByteBuffer* const wire_response_;
  const int64_t max_message_bytes_;
  Request request_;
  Response response_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_WIRE_CALL_H_
