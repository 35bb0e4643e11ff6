// The live sessions by id, with the max_sessions limit and KV accounting by session and variant.
//
// Each session belongs to the tenant that configured it (server/security/caller.h). Lookups on
// behalf of a caller see only the caller's own sessions (an admin sees all): another tenant's
// session id is answered exactly as an unknown id, so ids neither leak nor work across tenants.
// Session ids are scoped by tenant: the same id may name one session of each tenant, so that
// Configure with a client-chosen id (server/fleet/session_affinity.h) answers the same whether or
// not another tenant uses that id — ALREADY_EXISTS only when the caller's own tenant has it (issue
// 21, item 10: no existence oracle). The
// registry also enforces the per-tenant session and parameter-byte quotas (TenantQuotas) of
// non-admins.
//
// All methods are thread-safe and quick (a map under a mutex), so gRPC handlers may call them.
#ifndef ATTNSERVE_SERVER_SESSION_REGISTRY_H_
#define ATTNSERVE_SERVER_SESSION_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/security/caller.h"
#include "server/server_options.h"
#include "server/session/session.h"

namespace attnserve::server {

// 128 random bits from the kernel's CSPRNG (getrandom), as 32 lowercase hex digits: session ids
// are the only capability a client needs, so they must not be guessable.
std::string NewSessionId();

class SessionRegistry {
 public:
  explicit SessionRegistry(int max_sessions, const TenantQuotas& tenant_quotas = {})
      : max_sessions_(max_sessions), quotas_(tenant_quotas) {}

  // RESOURCE_EXHAUSTED when max_sessions are live, or when one more session holding
  // `parameter_bytes` of weights would pass a quota of the non-admin `owner` (the message names
  // the quota's flag, the tenant and the numbers). The overload without an owner is the admin's.
  absl::Status CheckCapacity(const Principal& owner, int64_t parameter_bytes) const;
  absl::Status CheckCapacity() const;
  // Adds a session owned by `owner`, holding `parameter_bytes` of weights; the same checks as
  // CheckCapacity, atomically with the insertion (nothing added on error). ALREADY_EXISTS when
  // `owner`'s tenant already has a session of that id (other tenants' sessions do not count).
  absl::Status Add(std::shared_ptr<Session> session, const Principal& owner,
                   int64_t parameter_bytes);
  absl::Status Add(std::shared_ptr<Session> session);
  // INVALID_ARGUMENT for an empty id; NOT_FOUND for an unknown id and, with the very same message,
  // for a session that `caller` may not access. A non-admin finds its own tenant's session of that
  // id; an admin its own tenant's, else the one of the first tenant by name that has it. The
  // overload without a caller is the admin's.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id,
                                                const Principal& caller) const;
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id) const;
  // Removes and returns `session`; nullptr when it is no longer registered.
  std::shared_ptr<Session> Remove(const std::shared_ptr<Session>& session);
  // The live sessions `caller` may access, ordered by id; without a caller, every live session.
  std::vector<std::shared_ptr<Session>> All(const Principal& caller) const;
  std::vector<std::shared_ptr<Session>> All() const;
  int size() const;
  const TenantQuotas& tenant_quotas() const { return quotas_; }

  // KV bytes held per variant name ("mha", "gqa", ...) and in total, for metrics and logs.
  std::map<std::string, int64_t> KvBytesByVariant() const;

 private:
  struct Entry {
    std::shared_ptr<Session> session;
    std::string owner;  // The tenant that configured it.
    int64_t parameter_bytes = 0;
  };

  absl::Status CheckCapacityLocked(const Principal& owner, int64_t parameter_bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int max_sessions_;
  const TenantQuotas quotas_;
  mutable absl::Mutex mu_;
  // By (owner tenant, session id).
  absl::flat_hash_map<std::pair<std::string, std::string>, Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_REGISTRY_H_
