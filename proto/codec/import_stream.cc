#include "proto/codec/import_stream.h"

#include <algorithm>
#include <memory>
#include <utility>

namespace attnserve {

PageChunkSource PageChunksOf(const std::string& pages, size_t chunk_bytes) {
  chunk_bytes = std::max<size_t>(1, chunk_bytes);
  return [&pages, chunk_bytes, offset = size_t{0}](std::string* data) mutable
         -> absl::StatusOr<bool> {
    if (offset >= pages.size()) return false;
    *data = pages.substr(offset, chunk_bytes);
    offset += chunk_bytes;
    return true;
  };
}

ImportSent SendImportRequest(v1::AttentionService::StubInterface& stub,
                             grpc::ClientContext& context, const std::string& session_id,
                             const std::string& request_id, v1::ExportedRequest request,
                             const PageChunkSource& next_chunk,
                             v1::ImportRequestResponse* response) {
  ImportSent sent;
  std::unique_ptr<grpc::ClientWriterInterface<v1::ImportRequestRequest>> writer =
      stub.ImportRequest(&context, response);
  v1::ImportRequestRequest message;
  v1::ImportRequestHeader* header = message.mutable_header();
  header->set_session_id(session_id);
  header->set_request_id(request_id);
  *header->mutable_request() = std::move(request);
  bool open = writer->Write(message);
  // A false Write means the target has ended the call: its status (from Finish) says why.
  while (open) {
    message.Clear();
    absl::StatusOr<bool> more = next_chunk(message.mutable_pages()->mutable_data());
    if (!more.ok()) {
      sent.source = more.status();
      context.TryCancel();  // The target returns what it reserved.
      sent.status = writer->Finish();
      return sent;
    }
    if (!*more) break;
    sent.page_bytes += static_cast<int64_t>(message.pages().data().size());
    open = writer->Write(message);
  }
  sent.target_ended = !open;
  if (open) writer->WritesDone();
  sent.status = writer->Finish();
  return sent;
}

}  // namespace attnserve
