// Session affinity from the client's side (docs/deploy.md): every call to
// attnserve.v1.AttentionService carries the id of the session it concerns as the gRPC metadata
// `x-attnserve-session`, which a load balancer in front of several replicas hashes on, so all calls
// of a session reach the replica that holds its KV cache. A Configure carries a fresh random id
// that the client draws and the server adopts as the new session's id
// (server/fleet/session_affinity.h), so Configure lands where the session's later calls will.
//
// An interceptor on the channel (installed by CreateSecureChannel) tags unary calls by reading the
// request's `session_id` field; streams send their metadata before any message, so their callers
// tag them with AddSessionMetadata.
#ifndef ATTNSERVE_CLIENT_COMMON_SESSION_ROUTING_H_
#define ATTNSERVE_CLIENT_COMMON_SESSION_ROUTING_H_

#include <memory>
#include <string>

#include "grpcpp/client_context.h"
#include "grpcpp/support/client_interceptor.h"
#include "proto/session_metadata.h"

namespace attnserve {

// 128 random bits from the kernel's CSPRNG as 32 lowercase hex digits, the form of the server's
// own session ids (a session id is a capability; it must not be guessable).
std::string NewClientSessionId();

// Tags a call (a stream's, before it starts) with `session_id`. Nothing when it is empty.
void AddSessionMetadata(grpc::ClientContext* context, const std::string& session_id);

// The interceptor factory: for each unary AttentionService call without the metadata, a
// Configure gets NewClientSessionId() and every other method its request's `session_id` (none
// when the request has none, e.g. ListSessions). Other services' calls pass untouched.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
MakeSessionRoutingInterceptorFactory();

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_SESSION_ROUTING_H_
