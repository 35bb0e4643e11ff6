// The stack and model-session (StackSpec.per_layer) side of the server tests: configuring a stack,
// one layer's Forward or Decode, a session and a request's (length, next layer) as GetSession
// reports them, and a request's export and import as a client sends them. Shared by the stack,
// model session, model decode stream, model session move and request transfer tests, which each
// declared their own copy.
#ifndef ATTNSERVE_TESTS_SUPPORT_MODEL_SESSION_UTIL_H_
#define ATTNSERVE_TESTS_SUPPORT_MODEL_SESSION_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/support/service_test_util.h"

namespace attnserve::server_test {

// A stack of `specs` run as one layer (the residual stream), layer k's weights seeded from
// `seed` + k.
v1::ConfigureRequest StackConfigureRequest(const std::vector<LayerSpec>& specs, uint64_t seed);
// The same stack as a per-layer (model) session.
v1::ConfigureRequest ModelConfigureRequest(const std::vector<LayerSpec>& specs, uint64_t seed);

// GetSession's SessionInfo of `session` (the call is expected to succeed).
v1::SessionInfo SessionInfoOf(v1::AttentionService::Stub& stub, const std::string& session);

// The request's (sequence_length, next_layer) as GetSession reports them; (-1, -1) if absent.
std::pair<int64_t, int> RequestState(v1::AttentionService::Stub& stub, const std::string& session,
                                     const std::string& request_id);

// Layer `layer` of one step of `request_id`: all of `hidden`'s rows (Forward) or its one row
// (Decode).
grpc::Status ForwardLayer(v1::AttentionService::Stub& stub, const std::string& session, int layer,
                          const std::string& request_id, const Tensor& hidden,
                          v1::ForwardResponse* response);
grpc::Status DecodeLayer(v1::AttentionService::Stub& stub, const std::string& session, int layer,
                         const std::string& request_id, const Tensor& hidden,
                         v1::DecodeResponse* response);

// An export as the client received it.
struct Exported {
  v1::ExportedRequest header;
  std::string pages;  // Every KvPageBytes.data, concatenated.
  int chunks = 0;     // KvPageBytes messages.
};

// ExportRequest of `request_id` into `out` (`max_chunk_bytes` 0: the server's default). Expects
// the header first, then only pages, each no larger than a nonzero `max_chunk_bytes`.
grpc::Status Export(v1::AttentionService::Stub& stub, const std::string& session,
                    const std::string& request_id, bool release, Exported* out,
                    int64_t max_chunk_bytes = 0);

// ImportRequest of an export's header and pages (sent in chunks of `chunk_bytes`).
grpc::Status Import(v1::AttentionService::Stub& stub, const std::string& session,
                    const std::string& request_id, const v1::ExportedRequest& header,
                    const std::string& pages, v1::ImportRequestResponse* response,
                    size_t chunk_bytes = 3000);

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_MODEL_SESSION_UTIL_H_
