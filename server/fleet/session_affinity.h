// Session affinity behind a load balancer (docs/deploy.md): a session's KV cache lives in one
// replica, so every call of a session must reach the replica that configured it. Clients send the
// session id as the gRPC metadata `x-attnserve-session` on every call, and the balancer hashes on
// it. Configure carries it too — a fresh id the client drew itself — and the server adopts that id
// for the new session, so the replica the balancer picked for Configure is the replica the same
// hash picks for every later call. Without the metadata the server draws the id (NewSessionId), as
// a client talking to one replica directly needs nothing else.
#ifndef ATTNSERVE_SERVER_FLEET_SESSION_AFFINITY_H_
#define ATTNSERVE_SERVER_FLEET_SESSION_AFFINITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "proto/session_metadata.h"

namespace attnserve::server {

// The id of the session a Configure call creates: the call's `x-attnserve-session` when present
// (INVALID_ARGUMENT unless it is exactly 32 lowercase hex digits — 128 bits, the form of the
// server's own ids, so an id chosen by a client is as hard to guess), else NewSessionId(). A
// client-chosen id that is already live for the caller's tenant is refused by SessionRegistry::Add
// (ALREADY_EXISTS); one that another tenant uses is no obstacle (ids are scoped by tenant).
absl::StatusOr<std::string> SessionIdForConfigure(const grpc::ServerContextBase& context);

// The replica name reported by Configure and GetServerInfo when --replica_id is empty: this host's
// name and the bound gRPC port, "<hostname>:<port>" (a Kubernetes pod's hostname is its name).
std::string DefaultReplicaId(int port);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FLEET_SESSION_AFFINITY_H_
