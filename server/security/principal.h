// Who is calling: the tenant a bearer token maps to (server/security/auth.h), and whether it may
// act on every tenant's sessions. Sessions are owned by the tenant that configured them
// (server/session/registry.h); per-tenant quotas apply to every non-admin tenant.
#ifndef ATTNSERVE_SERVER_SECURITY_PRINCIPAL_H_
#define ATTNSERVE_SERVER_SECURITY_PRINCIPAL_H_

#include <string>

namespace attnserve::server {

struct Principal {
  // The tenant's name from the --auth_tokens file; "" when authentication is off.
  std::string tenant;
  // Sees and acts on every tenant's sessions and is exempt from the tenant quotas. With
  // authentication off every caller is the admin tenant "" (a single-tenant server).
  bool is_admin = false;

  // The caller when no --auth_tokens file is given.
  static Principal Unauthenticated() { return {"", true}; }
  // Whether this principal may see and act on a session owned by `owner`.
  bool MayAccess(const std::string& owner) const { return is_admin || owner == tenant; }
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SECURITY_PRINCIPAL_H_
