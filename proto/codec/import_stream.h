// The client side of ImportRequest, shared by every sender: `attnctl move`
// (client/common/request_mover.h), the server's drain (server/fleet/drain.h) and the tests. One
// stream: the header, then the page bytes in chunks, each written as its source yields it.
#ifndef ATTNSERVE_PROTO_CODEC_IMPORT_STREAM_H_
#define ATTNSERVE_PROTO_CODEC_IMPORT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace attnserve {

// Puts the next chunk of page bytes in `*data` (which it may swap in) and returns true, returns
// false when there are no more, or fails: the import is then cancelled.
using PageChunkSource = std::function<absl::StatusOr<bool>(std::string* data)>;

// `pages` in chunks of at most `chunk_bytes` (at least 1). `pages` must outlive the source.
PageChunkSource PageChunksOf(const std::string& pages, size_t chunk_bytes);

struct ImportSent {
  grpc::Status status;        // The call's status (from Finish).
  absl::Status source;        // The source's failure (the call was cancelled), else OK.
  bool target_ended = false;  // A Write failed: the target ended the call before all was sent.
  int64_t page_bytes = 0;     // Page bytes handed to the stream.
};

// One ImportRequest on `stub` with `context` (its deadline and metadata set by the caller): the
// header naming `session_id`, `request_id` and `request`, then every chunk of `next_chunk` until it
// has no more (then WritesDone) or the target ends the call.
ImportSent SendImportRequest(v1::AttentionService::StubInterface& stub,
                             grpc::ClientContext& context, const std::string& session_id,
                             const std::string& request_id, v1::ExportedRequest request,
                             const PageChunkSource& next_chunk,
                             v1::ImportRequestResponse* response);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_IMPORT_STREAM_H_
