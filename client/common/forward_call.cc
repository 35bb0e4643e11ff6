#include "client/common/forward_call.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/core/tensor.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {

namespace {

grpc::Status LocalError(grpc::StatusCode code, std::string message) {
  return grpc::Status(code, absl::StrCat("client check: ", message));
}

// The server's max_message_bytes, asked once per Client.
int64_t ServerMaxMessageBytes(const Client& client) {
  int64_t known = client.server_max_message_bytes->load();
  if (known > 0) return known;
  grpc::ClientContext context;
  client.Prepare(&context);
  v1::GetServerInfoResponse info;
  if (client.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok() &&
      info.limits().max_message_bytes() > 0) {
    known = info.limits().max_message_bytes();
  } else {
    known = int64_t{4} << 20;  // gRPC's default, which the server keeps unless configured.
  }
  client.server_max_message_bytes->store(known);
  return known;
}

}  // namespace

grpc::Status CallForward(const Client& client, grpc::ClientContext* context,
                         const v1::ForwardRequest& request, v1::ForwardResponse* response) {
  const int64_t bytes = static_cast<int64_t>(request.ByteSizeLong());
  if (bytes <= kAlwaysUnaryForwardBytes) return client.stub->Forward(context, request, response);
  const int64_t limit = ServerMaxMessageBytes(client);
  if (bytes + kForwardStreamHeadroomBytes <= limit) {
    return client.stub->Forward(context, request, response);
  }
  return CallForwardStream(client, context, request, limit, response);
}

grpc::Status CallForwardStream(const Client& client, grpc::ClientContext* context,
                               const v1::ForwardRequest& request, int64_t max_message_bytes,
                               v1::ForwardResponse* response) {
  if (!request.call_id().empty()) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT,
                      "call_id: a Forward too large for one message goes through ForwardStream, "
                      "which has no idempotency key; send it without call_id");
  }
  if (request.layer() != 0) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT,
                      "layer: a model session's Forward must fit one message (ForwardStream "
                      "refuses model sessions)");
  }
  if (request.items_size() == 0) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT, "items: must not be empty");
  }
  // The header: shapes and positions; the rows follow, items in order.
  v1::ForwardStreamRequest header_message;
  v1::ForwardStreamHeader* header = header_message.mutable_header();
  header->set_session_id(request.session_id());
  const v1::Tensor& first = request.items(0).hidden();
  header->set_dtype(first.dtype());
  if (first.shape_size() != 2) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT, "items[0].hidden: expected 2 dims");
  }
  const int64_t d_model = first.shape(1);
  header->set_d_model(d_model);
  absl::StatusOr<DType> dtype = DTypeFromProto(first.dtype(), "items[0].hidden.dtype");
  if (!dtype.ok()) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT, std::string(dtype.status().message()));
  }
  const int64_t row_bytes = d_model * static_cast<int64_t>(DTypeSize(*dtype));
  for (int i = 0; i < request.items_size(); ++i) {
    const v1::ForwardItem& item = request.items(i);
    const v1::Tensor& hidden = item.hidden();
    if (hidden.dtype() != first.dtype() || hidden.shape_size() != 2 ||
        hidden.shape(1) != d_model ||
        static_cast<int64_t>(hidden.data().size()) != hidden.shape(0) * row_bytes) {
      return LocalError(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("items[", i, "].hidden: one stream takes [num_tokens, ",
                                     d_model, "] rows of one dtype, whole"));
    }
    v1::ForwardStreamItem* streamed = header->add_items();
    streamed->set_request_id(item.request_id());
    streamed->set_num_tokens(hidden.shape(0));
    *streamed->mutable_positions() = item.positions();
  }
  if (row_bytes <= 0 || row_bytes > max_message_bytes - kForwardStreamHeadroomBytes) {
    return LocalError(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("a row of ", row_bytes, " bytes does not fit a message of ",
                                   max_message_bytes, " bytes"));
  }
  // A quarter of the limit per message: the server's in-flight quota (--max_inflight_message_bytes,
  // 4 x the limit by default) covers every message gRPC has started receiving, and a stream of
  // full-size messages sent back to back can pass it (RST_STREAM, RESOURCE_EXHAUSTED).
  const int64_t message_bytes =
      std::max(row_bytes, max_message_bytes / 4 - kForwardStreamHeadroomBytes);
  const int64_t rows_per_message = message_bytes / row_bytes;

  std::unique_ptr<grpc::ClientReaderWriter<v1::ForwardStreamRequest, v1::ForwardStreamResponse>>
      stream = client.stub->ForwardStream(context);
  // Written on a thread of its own while this one reads: the server streams outputs back while
  // rows still arrive, and stops reading when two chunks wait, so neither side may block the other.
  std::thread writer([&] {
    if (!stream->Write(header_message)) return;
    v1::ForwardStreamRequest message;
    std::string* data = message.mutable_rows()->mutable_data();
    for (const v1::ForwardItem& item : request.items()) {
      const std::string& bytes = item.hidden().data();
      for (size_t at = 0; at < bytes.size();) {
        // Whole rows, possibly spanning items: fill the message, send it when full.
        const size_t room = static_cast<size_t>(rows_per_message * row_bytes) - data->size();
        const size_t n = std::min(room, bytes.size() - at);
        data->append(bytes, at, n);
        at += n;
        if (static_cast<int64_t>(data->size()) == rows_per_message * row_bytes) {
          if (!stream->Write(message)) return;
          data->clear();
        }
      }
    }
    if (!data->empty() && !stream->Write(message)) return;
    stream->WritesDone();
  });
  std::string outputs;
  v1::ForwardStreamResponse answer;
  v1::ForwardStreamSummary summary;
  bool have_summary = false;
  while (stream->Read(&answer)) {
    if (answer.has_rows()) {
      outputs.append(answer.rows().data());
    } else if (answer.has_summary()) {
      summary = answer.summary();
      have_summary = true;
    }
  }
  writer.join();
  grpc::Status status = stream->Finish();
  if (!status.ok()) return status;
  if (!have_summary || summary.results_size() != request.items_size()) {
    return LocalError(grpc::StatusCode::INTERNAL, "ForwardStream ended OK without its summary");
  }
  response->Clear();
  size_t at = 0;
  for (int i = 0; i < summary.results_size(); ++i) {
    const v1::ForwardStreamResult& done = summary.results(i);
    const size_t bytes = static_cast<size_t>(done.num_tokens() * row_bytes);
    if (at + bytes > outputs.size()) {
      return LocalError(grpc::StatusCode::INTERNAL,
                        absl::StrCat("ForwardStream sent ", outputs.size(),
                                     " output bytes, fewer than its summary counts"));
    }
    v1::ForwardResult* result = response->add_results();
    result->set_request_id(done.request_id());
    result->set_sequence_length(done.sequence_length());
    v1::Tensor* output = result->mutable_output();
    output->set_dtype(first.dtype());
    output->add_shape(done.num_tokens());
    output->add_shape(d_model);
    output->set_data(outputs.substr(at, bytes));
    at += bytes;
  }
  *response->mutable_timing() = summary.timing();
  return grpc::Status::OK;
}

}  // namespace attnserve
