// A session's owner, carried by a drain (server/fleet/drain.h): the draining replica calls its
// peer with an admin token and the metadata x-attnserve-owner naming the tenant whose session it
// moves, and the peer's admin acts for that tenant, so the session it re-creates (and the requests
// imported into it) belong to their owner there too (issue 21, item 10: a drain to a peer that
// dropped owners left moved sessions to any caller). A server that cannot keep the owner refuses
// the metadata instead of ignoring it.
#ifndef ATTNSERVE_SERVER_SECURITY_ACTING_OWNER_H_
#define ATTNSERVE_SERVER_SECURITY_ACTING_OWNER_H_

#include "absl/status/statusor.h"
#include "grpcpp/server_context.h"
#include "server/security/auth.h"
#include "server/security/principal.h"

namespace attnserve::server {

inline constexpr char kOwnerMetadataKey[] = "x-attnserve-owner";

// Who a call of `caller` acts as: `caller` itself without x-attnserve-owner (or when it names the
// caller's own tenant), else the tenant it names, as the --auth_tokens file defines it. Refused:
//   FAILED_PRECONDITION when this server does not authenticate callers (`authenticator` null or
//     off): it has no owners to keep;
//   PERMISSION_DENIED when `caller` is not an admin;
//   INVALID_ARGUMENT when the metadata is sent more than once;
//   FAILED_PRECONDITION for a tenant with no token here (it could never reach its session).
absl::StatusOr<Principal> ActingPrincipal(const Authenticator* authenticator,
                                          const Principal& caller,
                                          const grpc::ServerContextBase& context);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SECURITY_ACTING_OWNER_H_
