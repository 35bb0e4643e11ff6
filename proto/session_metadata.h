// The gRPC metadata of the attnserve.v1 API that is not in attention_service.proto: the key that
// carries a call's session id (session affinity, docs/deploy.md). The server reads it
// (server/fleet/session_affinity.h) and the clients send it (client/common/session_routing.h).
#ifndef ATTNSERVE_PROTO_SESSION_METADATA_H_
#define ATTNSERVE_PROTO_SESSION_METADATA_H_

namespace attnserve {

// The metadata key (gRPC keys are lowercase ASCII).
inline constexpr char kSessionMetadataKey[] = "x-attnserve-session";

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_SESSION_METADATA_H_
