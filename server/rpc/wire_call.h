// A call at the server's gRPC edge, from the moment gRPC creates it to the moment it is destroyed:
// how many are alive (for the shutdown), how its bytes become a request and its response bytes,
// and how it ends (its status, its report to metrics).
//
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
//
// A unary call served as a stream of one request and one response, so that the service decides
// from the call's metadata alone, before a byte of its request is read, whether to take it.
//
// Why not a plain unary handler: for a unary (or server-streaming) method the gRPC 1.51 core reads
// the whole request (up to --max_message_bytes) before it hands the call to any handler, so a
// caller without a token could make the server hold 64 MiB per call (issue 21, item 2). The other
// ways to refuse a call at its metadata do not serve here: a server interceptor cannot end a call
// before its message is received; grpc::AuthMetadataProcessor runs at call start, but
// InsecureServerCredentials (plaintext, where most of our deployments terminate TLS in front)
// asserts in SetAuthMetadataProcessor, so it would only cover --tls_cert servers. A method
// registered as BIDI_STREAMING is surfaced at its initial metadata, and its first message is read
// only when the handler asks (StartRead); on the wire a unary call and a one-message stream are the
// same HTTP/2 exchange, so clients and their generated stubs do not change.
//
// The calls in flight (CallTracker), so that a shutdown can wait for them before it tells the
// clients to go away. Why the shutdown needs this (ShutdownTest.SigtermDrainsAnInFlightCall):
// gRPC's Server::Shutdown(deadline) sends GOAWAY at once and waits for the calls, but a call is
// over for gRPC when its answer is in the connection's socket, not when the client has read it;
// the last stream closing then closes the connection, and a socket closed with unread bytes in
// (the client's WINDOW_UPDATEs and pings) is reset, which drops the part of the answer the client
// had not received yet ("Connection reset by peer": reproduced by freezing the client at
// SIGTERM). Waiting for the calls first, then shutting down, puts gRPC's graceful GOAWAY and its
// ping behind every answer on each connection: the final GOAWAY (and the close) waits for the
// client's ping ack, which it sends only once it has read what came before. A call counts from
// the moment gRPC creates it until it is destroyed, after its reactor's OnDone (its answer handed
// to the transport), whatever its service (health and reflection too).
#ifndef ATTNSERVE_SERVER_RPC_WIRE_CALL_H_
#define ATTNSERVE_SERVER_RPC_WIRE_CALL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_interceptor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "server/observability/metrics.h"

namespace attnserve::server {

// Counts every call of the server it is installed in, from its creation to its destruction.
class CallTracker {
 public:
  CallTracker() = default;
  CallTracker(const CallTracker&) = delete;
  CallTracker& operator=(const CallTracker&) = delete;

  // For grpc::ServerBuilder::experimental().SetInterceptorCreators: counts every call of the
  // server it is given to. The tracker must outlive that server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // Calls in flight now.
  int64_t live() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every call that started before this call has ended, or until `deadline`. True
  // when they all ended. Calls that start meanwhile are not waited for (the service refuses them
  // while the server stops, so they end at once).
  bool AwaitCallsStartedBefore(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Interceptor;
  class Factory;

  // Numbers a starting call; Ended takes its number back.
  uint64_t Started() ABSL_LOCKS_EXCLUDED(mu_);
  void Ended(uint64_t number) ABSL_LOCKS_EXCLUDED(mu_);

  mutable absl::Mutex mu_;
  uint64_t next_number_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls numbered below `cut_` still live (the ones AwaitCallsStartedBefore waits for).
  uint64_t cut_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t live_before_cut_ ABSL_GUARDED_BY(mu_) = 0;
};

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
// served as a stream, StreamedUnaryCall below, whose caller sent no message).
grpc::Status MissingMessage(const google::protobuf::Message& message);

// RESOURCE_EXHAUSTED naming both sizes when a response of `size` bytes is over `max_bytes`;
// OK otherwise.
grpc::Status CheckResponseSize(size_t size, int64_t max_bytes);

// RESOURCE_EXHAUSTED: the response's `size` bytes could not be allocated (the call fails alone).
grpc::Status ResponseNotAllocated(size_t size);

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

// One unary call over a bidi stream of bytes: owns the typed request and response for the call's
// life and deletes itself once gRPC is done with the call. Created per call by the method's
// factory, which either finishes it at once (a refused caller) or calls ReadRequest.
template <typename Request, typename Response>
class StreamedUnaryCall final : public UnaryCall {
 public:
  // Runs once the request's bytes arrived; must finish the call exactly once.
  using OnRequest = std::function<void(StreamedUnaryCall& call)>;

  StreamedUnaryCall(grpc::CallbackServerContext* context, int64_t max_message_bytes)
      : reactor_(this), context_(context), max_message_bytes_(max_message_bytes) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* reactor() { return &reactor_; }
  grpc::CallbackServerContext* context() const { return context_; }
  std::string peer() const override { return context_->peer(); }
  Request& request() { return request_; }
  Response& response() { return response_; }

  // Reads the request's message, then parses it into request() and runs `on_request`; a message
  // that does not parse, or a stream that ends without one, finishes the call instead
  // (INVALID_ARGUMENT; CANCELLED when the caller went away), through `refuse`.
  void ReadRequest(OnRequest on_request, std::function<void(UnaryCall*, grpc::Status)> refuse) {
    on_request_ = std::move(on_request);
    refuse_ = std::move(refuse);
    reactor_.StartRead(&wire_request_);
  }

  void Finish(grpc::Status status) override {
    if (status.ok()) status = SerializeMessage(response_, max_message_bytes_, &wire_response_);
    // The object lives on until OnDone: gRPC still reads wire_response_.
    if (status.ok()) {
      reactor_.StartWriteAndFinish(&wire_response_, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      reactor_.Finish(std::move(status));
    }
  }

 private:
  class Reactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Reactor(StreamedUnaryCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->OnReadDone(ok); }
    void OnDone() override { delete call_; }

   private:
    StreamedUnaryCall* const call_;
  };

  void OnReadDone(bool ok) {
    if (!ok) {
      return refuse_(this, context_->IsCancelled()
                               ? grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled")
                               : MissingMessage(request_));
    }
    const bool parsed = ParseMessage(wire_request_, &request_);
    const size_t num_bytes = wire_request_.Length();
    wire_request_.Clear();  // The parsed request is all that is kept.
    if (!parsed) return refuse_(this, UnparseableMessage(request_, num_bytes));
    on_request_(*this);
  }

  Reactor reactor_;
  grpc::CallbackServerContext* const context_;
  const int64_t max_message_bytes_;
  OnRequest on_request_;
  std::function<void(UnaryCall*, grpc::Status)> refuse_;
  grpc::ByteBuffer wire_request_;
  grpc::ByteBuffer wire_response_;
  Request request_;
  Response response_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_WIRE_CALL_H_
