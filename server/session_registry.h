// The live sessions by id, with the max_sessions limit and KV accounting by session and variant.
//
// All methods are thread-safe and quick (a map under a mutex), so gRPC handlers may call them.
#ifndef ATTNSERVE_SERVER_SESSION_REGISTRY_H_
#define ATTNSERVE_SERVER_SESSION_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/session.h"

namespace attnserve::server {

// 128 random bits from the kernel's CSPRNG (getrandom), as 32 lowercase hex digits: session ids
// are the only capability a client needs, so they must not be guessable.
std::string NewSessionId();

class SessionRegistry {
 public:
  explicit SessionRegistry(int max_sessions) : max_sessions_(max_sessions) {}

  // RESOURCE_EXHAUSTED when max_sessions are live.
  absl::Status CheckCapacity() const;
  // Adds a session; RESOURCE_EXHAUSTED (and nothing added) when max_sessions are live.
  absl::Status Add(std::shared_ptr<Session> session);
  // INVALID_ARGUMENT for an empty id, NOT_FOUND for an unknown one.
  absl::StatusOr<std::shared_ptr<Session>> Find(const std::string& session_id) const;
  // Removes and returns the session; nullptr when absent.
  std::shared_ptr<Session> Remove(const std::string& session_id);
  // Every live session, ordered by id.
  std::vector<std::shared_ptr<Session>> All() const;
  int size() const;

  // KV bytes held per variant name ("mha", "gqa", ...) and in total, for metrics and logs.
  std::map<std::string, int64_t> KvBytesByVariant() const;

 private:
  const int max_sessions_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_REGISTRY_H_
