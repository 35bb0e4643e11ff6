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
#ifndef ATTNSERVE_SERVER_RPC_STREAMED_UNARY_CALL_H_
#define ATTNSERVE_SERVER_RPC_STREAMED_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "server/rpc/wire_call.h"

namespace attnserve::server {

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

#endif  // ATTNSERVE_SERVER_RPC_STREAMED_UNARY_CALL_H_
