// Moving one request between replicas from the client's side: ExportRequest from the source is
// piped into ImportRequest on the target message by message (the header, then each chunk of page
// bytes as it arrives), so no more than one chunk is held here. Used by `attnctl move`; the
// server's drain (server/fleet/drain.h) exports on its own session's queue and sends the
// ImportRequest itself. Both streams carry x-attnserve-session (client/common/session_routing.h),
// so either end may be a balancer.
#ifndef ATTNSERVE_CLIENT_COMMON_REQUEST_MOVER_H_
#define ATTNSERVE_CLIENT_COMMON_REQUEST_MOVER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.grpc.pb.h"

namespace attnserve {

struct MoveSpec {
  std::string source_session;
  std::string request_id;
  std::string target_session;  // Empty: the source's id (a session re-created under its id).
  std::string new_request_id;  // Empty: request_id.
  // ExportRequestRequest.release_after_export: the source frees the request as it copies it. Off,
  // the source keeps it (release it once the move succeeded, as the drain does).
  bool release_after_export = false;
  absl::Duration timeout = absl::Seconds(60);  // Deadline of both streams.
};

struct MoveOutcome {
  int64_t sequence_length = 0;
  int64_t page_bytes_moved = 0;  // Page bytes sent (held pages only).
  int64_t kv_bytes_added = 0;    // As the target reported.
};

// The export's failure (its status, prefixed "ExportRequest: ") or the import's ("ImportRequest:
// "). A failed export cancels the import, so the target frees what it had reserved.
absl::StatusOr<MoveOutcome> MoveRequest(v1::AttentionService::Stub& source,
                                        v1::AttentionService::Stub& target, const MoveSpec& spec);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_REQUEST_MOVER_H_
