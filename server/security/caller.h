// Who is calling, and for whom: the tenant a bearer token maps to (Authenticator), whether it may
// act on every tenant's sessions (Principal), and the owner a drain's admin acts for
// (ActingPrincipal). Sessions are owned by the tenant that configured them
// (server/session/registry.h); per-tenant quotas apply to every non-admin tenant.
//
// Bearer-token authentication maps the `authorization: Bearer <token>` metadata of a call to the
// tenant that owns the token, from a file of token hashes (--auth_tokens).
//
// The token file holds one token per line:
//
//   # comment lines and blank lines are ignored
//   <sha256 of the token, 64 hex digits> <tenant> [admin]
//
// e.g. the line for token "s3cret" of tenant "alice" is the output of
//   printf %s s3cret | sha256sum | sed 's/ .*/ alice/'
// Tenant names are 1-64 characters of [A-Za-z0-9_.-]; one tenant may have several tokens (all
// with the same admin marking). The third column `admin` marks a token whose holder sees every
// tenant's sessions and is exempt from the tenant quotas.
//
// Only hashes are stored, so the file (or a memory dump) does not reveal usable tokens. A presented
// token is hashed with SHA-256 and compared against every entry in constant time (no early exit,
// CRYPTO_memcmp), so the time taken does not reveal how much of a guess matched, or which entry.
//
// A session's owner is carried by a drain (server/fleet/drain.h): the draining replica calls its
// peer with an admin token and the metadata x-attnserve-owner naming the tenant whose session it
// moves, and the peer's admin acts for that tenant, so the session it re-creates (and the requests
// imported into it) belong to their owner there too (issue 21, item 10: a drain to a peer that
// dropped owners left moved sessions to any caller). A server that cannot keep the owner refuses
// the metadata instead of ignoring it.
#ifndef ATTNSERVE_SERVER_SECURITY_CALLER_H_
#define ATTNSERVE_SERVER_SECURITY_CALLER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"

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

// The bearer token in the file at `path` (its first line, surrounding whitespace trimmed), as a
// client presents it: INVALID_ARGUMENT naming `flag` for an unreadable file, an empty token, one
// with whitespace or control characters inside, or one longer than a server accepts.
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path, absl::string_view flag);

class Authenticator {
 public:
  // Authentication off: every call is Principal::Unauthenticated().
  Authenticator() = default;

  // Reads a token file (format above). INVALID_ARGUMENT naming --auth_tokens, the file and the
  // line for an unreadable file, a malformed line, a duplicate hash, conflicting admin markings of
  // one tenant, or a file without tokens (all configuration errors, reported at startup).
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);
  // The same from the file's contents; `source` names it in errors.
  static absl::StatusOr<Authenticator> FromText(absl::string_view text, absl::string_view source);

  bool enabled() const { return enabled_; }
  // Number of tokens in the table.
  int size() const { return static_cast<int>(entries_.size()); }

  // The caller of a call, from its `authorization` metadata. UNAUTHENTICATED (the same message
  // whether the token is unknown or malformed, and never echoing it) when authentication is on and
  // the metadata is missing, not "Bearer <token>", or the token is not in the table.
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context) const;
  // The same for a token itself (the part after "Bearer ").
  absl::StatusOr<Principal> AuthenticateToken(absl::string_view token) const;
  // The principal of `tenant` when a token of the table belongs to it (a drain's admin acting for
  // that tenant, ActingPrincipal below), else nullopt.
  std::optional<Principal> FindTenant(absl::string_view tenant) const;

 private:
  using Sha256 = std::array<uint8_t, 32>;
  struct Entry {
    Sha256 hash;
    Principal principal;
  };

  bool enabled_ = false;
  std::vector<Entry> entries_;
};

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

#endif  // ATTNSERVE_SERVER_SECURITY_CALLER_H_
