#include "tests/support/model_session_util.h"

#include <memory>

#include "proto/codec/import_stream.h"

namespace attnserve::server_test {

v1::ConfigureRequest StackConfigureRequest(const std::vector<LayerSpec>& specs, uint64_t seed) {
  v1::ConfigureRequest request;
  for (const LayerSpec& spec : specs) {
    *request.mutable_stack()->add_layers() = LayerSpecToProto(spec);
  }
  request.mutable_weights()->set_seed(seed);
  return request;
}

v1::ConfigureRequest ModelConfigureRequest(const std::vector<LayerSpec>& specs, uint64_t seed) {
  v1::ConfigureRequest request = StackConfigureRequest(specs, seed);
  request.mutable_stack()->set_per_layer(true);
  return request;
}

v1::SessionInfo SessionInfoOf(v1::AttentionService::Stub& stub, const std::string& session) {
  v1::GetSessionRequest request;
  request.set_session_id(session);
  v1::GetSessionResponse response;
  grpc::ClientContext context;
  SetDeadline(context);
  EXPECT_TRUE(stub.GetSession(&context, request, &response).ok());
  return response.session();
}

std::pair<int64_t, int> RequestState(v1::AttentionService::Stub& stub, const std::string& session,
                                     const std::string& request_id) {
  const v1::SessionInfo info = SessionInfoOf(stub, session);  // Held: the loop reads its requests.
  for (const v1::RequestInfo& r : info.requests()) {
    if (r.request_id() == request_id) return {r.sequence_length(), r.next_layer()};
  }
  return {-1, -1};
}

grpc::Status ForwardLayer(v1::AttentionService::Stub& stub, const std::string& session, int layer,
                          const std::string& request_id, const Tensor& hidden,
                          v1::ForwardResponse* response) {
  v1::ForwardRequest request;
  request.set_session_id(session);
  request.set_layer(layer);
  *request.add_items() = MakeForwardItem(request_id, hidden);
  return Forward(stub, request, response);
}

grpc::Status DecodeLayer(v1::AttentionService::Stub& stub, const std::string& session, int layer,
                         const std::string& request_id, const Tensor& hidden,
                         v1::DecodeResponse* response) {
  v1::DecodeRequest request;
  request.set_session_id(session);
  request.set_layer(layer);
  *request.add_items() = MakeDecodeItem(request_id, hidden);
  return Decode(stub, request, response);
}

grpc::Status Export(v1::AttentionService::Stub& stub, const std::string& session,
                    const std::string& request_id, bool release, Exported* out,
                    int64_t max_chunk_bytes) {
  v1::ExportRequestRequest request;
  request.set_session_id(session);
  request.set_request_id(request_id);
  request.set_release_after_export(release);
  request.set_max_chunk_bytes(max_chunk_bytes);
  grpc::ClientContext context;
  SetDeadline(context);
  std::unique_ptr<grpc::ClientReader<v1::ExportRequestResponse>> reader =
      stub.ExportRequest(&context, request);
  v1::ExportRequestResponse message;
  bool first = true;
  while (reader->Read(&message)) {
    if (first) {
      EXPECT_TRUE(message.has_header()) << "the first message carries the header";
      out->header = message.header();
      first = false;
    } else {
      EXPECT_TRUE(message.has_pages());
      if (max_chunk_bytes > 0) {
        EXPECT_LE(static_cast<int64_t>(message.pages().data().size()), max_chunk_bytes);
      }
      out->pages += message.pages().data();
      ++out->chunks;
    }
  }
  return reader->Finish();
}

grpc::Status Import(v1::AttentionService::Stub& stub, const std::string& session,
                    const std::string& request_id, const v1::ExportedRequest& header,
                    const std::string& pages, v1::ImportRequestResponse* response,
                    size_t chunk_bytes) {
  grpc::ClientContext context;
  SetDeadline(context);
  return SendImportRequest(stub, context, session, request_id, header,
                           PageChunksOf(pages, chunk_bytes), response)
      .status;
}

}  // namespace attnserve::server_test
