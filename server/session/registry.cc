#include "server/session/registry.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/base/random_id.h"

namespace attnserve::server {

std::string NewSessionId() { return RandomHexId128(); }

namespace {

// One message for "no such id" and "not yours", so a caller cannot tell the two apart.
absl::Status SessionNotFound(const std::string& session_id) {
  return absl::NotFoundError(absl::StrCat("session_id: session '", session_id,
                                          "' not found (never created, released, or expired)"));
}

}  // namespace

absl::Status SessionRegistry::CheckCapacityLocked(const Principal& owner,
                                                  int64_t parameter_bytes) const {
  if (static_cast<int>(sessions_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        sessions_.size(), " sessions are live, the limit is max_sessions = ", max_sessions_,
        " (release a session or wait for session_ttl)"));
  }
  if (owner.is_admin || (quotas_.max_sessions <= 0 && quotas_.max_parameter_bytes <= 0)) {
    return absl::OkStatus();
  }
  int tenant_sessions = 0;
  int64_t tenant_parameter_bytes = 0;
  for (const auto& [id, entry] : sessions_) {
    if (entry.owner != owner.tenant) continue;
    ++tenant_sessions;
    tenant_parameter_bytes += entry.parameter_bytes;
  }
  if (quotas_.max_sessions > 0 && tenant_sessions >= quotas_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session quota exhausted: tenant '", owner.tenant, "' has ", tenant_sessions,
                     " live sessions, its quota is --tenant_max_sessions = ", quotas_.max_sessions,
                     " (release a session or wait for session_ttl)"));
  }
  if (quotas_.max_parameter_bytes > 0 &&
      tenant_parameter_bytes + parameter_bytes > quotas_.max_parameter_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "parameter quota exhausted: this layer needs ", parameter_bytes,
        " bytes of weights, tenant '", owner.tenant, "' holds ", tenant_parameter_bytes,
        ", its quota is --tenant_max_parameter_bytes = ", quotas_.max_parameter_bytes,
        " (release a session)"));
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::CheckCapacity(const Principal& owner, int64_t parameter_bytes) const {
  absl::MutexLock lock(&mu_);
  return CheckCapacityLocked(owner, parameter_bytes);
}

absl::Status SessionRegistry::CheckCapacity() const {
  return CheckCapacity(Principal::Unauthenticated(), 0);
}

absl::Status SessionRegistry::Add(std::shared_ptr<Session> session, const Principal& owner,
                                  int64_t parameter_bytes) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCapacityLocked(owner, parameter_bytes); !s.ok()) return s;
  const std::string id = session->id();
  // Only a client-chosen id (server/fleet/session_affinity.h) can repeat one that is live.
  if (!sessions_
           .try_emplace(std::make_pair(owner.tenant, id),
                        Entry{std::move(session), owner.tenant, parameter_bytes})
           .second) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: session '", id,
                                                 "' already exists; draw a fresh random id"));
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::Add(std::shared_ptr<Session> session) {
  return Add(std::move(session), Principal::Unauthenticated(), 0);
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(const std::string& session_id,
                                                               const Principal& caller) const {
  if (session_id.empty()) return absl::InvalidArgumentError("session_id: must not be empty");
  absl::MutexLock lock(&mu_);
  if (auto it = sessions_.find(std::make_pair(caller.tenant, session_id)); it != sessions_.end()) {
    return it->second.session;
  }
  if (!caller.is_admin) return SessionNotFound(session_id);
  // Another tenant's session for the admin: the first tenant by name, so the answer is stable.
  const Entry* found = nullptr;
  for (const auto& [key, entry] : sessions_) {
    if (key.second == session_id && (found == nullptr || entry.owner < found->owner)) {
      found = &entry;
    }
  }
  if (found == nullptr) return SessionNotFound(session_id);
  return found->session;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(
    const std::string& session_id) const {
  return Find(session_id, Principal::Unauthenticated());
}

std::shared_ptr<Session> SessionRegistry::Remove(const std::shared_ptr<Session>& session) {
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->second.session != session) continue;
    std::shared_ptr<Session> removed = std::move(it->second.session);
    sessions_.erase(it);
    return removed;
  }
  return nullptr;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::All(const Principal& caller) const {
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock lock(&mu_);
    all.reserve(sessions_.size());
    for (const auto& [id, entry] : sessions_) {
      if (caller.MayAccess(entry.owner)) all.push_back(entry.session);
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return all;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::All() const {
  return All(Principal::Unauthenticated());
}

int SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

std::map<std::string, int64_t> SessionRegistry::KvBytesByVariant() const {
  std::map<std::string, int64_t> bytes;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, entry] : sessions_) {
    bytes[std::string(VariantName(entry.session->spec().variant))] +=
        entry.session->kv_bytes_used();
  }
  return bytes;
}

}  // namespace attnserve::server
