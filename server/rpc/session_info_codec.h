// A session's plain state (server/session/session.h) as the API's messages: SessionCost for
// Configure, SessionInfo for GetSession and ListSessions. The session itself holds no proto types.
#ifndef ATTNSERVE_SERVER_RPC_SESSION_INFO_CODEC_H_
#define ATTNSERVE_SERVER_RPC_SESSION_INFO_CODEC_H_

#include "attnserve/v1/attention_service.pb.h"
#include "server/session/session.h"

namespace attnserve::server {

v1::SessionCost SessionCostToProto(const SessionCost& cost);

// Every field of `info` from `snapshot` (requests only as far as the snapshot has them).
void SessionSnapshotToProto(const SessionSnapshot& snapshot, v1::SessionInfo* info);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_SESSION_INFO_CODEC_H_
