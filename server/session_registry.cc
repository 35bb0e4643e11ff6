#include "server/session_registry.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace attnserve::server {

std::string NewSessionId() {
  unsigned char bytes[16];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    const ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom (very old kernel): /dev/urandom is the same generator.
      std::ifstream urandom("/dev/urandom", std::ios::binary);
      urandom.read(reinterpret_cast<char*>(bytes), sizeof(bytes));
      got = sizeof(bytes);
    }
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

absl::Status SessionRegistry::CheckCapacity() const {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        sessions_.size(), " sessions are live, the limit is max_sessions = ", max_sessions_,
        " (release a session or wait for session_ttl)"));
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::Add(std::shared_ptr<Session> session) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(sessions_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        sessions_.size(), " sessions are live, the limit is max_sessions = ", max_sessions_,
        " (release a session or wait for session_ttl)"));
  }
  const std::string id = session->id();
  sessions_.emplace(id, std::move(session));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(
    const std::string& session_id) const {
  if (session_id.empty()) return absl::InvalidArgumentError("session_id: must not be empty");
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: session '", session_id,
                                            "' not found (never created, released, or expired)"));
  }
  return it->second;
}

std::shared_ptr<Session> SessionRegistry::Remove(const std::string& session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::All() const {
  std::vector<std::shared_ptr<Session>> all;
  {
    absl::MutexLock lock(&mu_);
    all.reserve(sessions_.size());
    for (const auto& [id, session] : sessions_) all.push_back(session);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->id() < b->id(); });
  return all;
}

int SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

std::map<std::string, int64_t> SessionRegistry::KvBytesByVariant() const {
  std::map<std::string, int64_t> bytes;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, session] : sessions_) {
    bytes[std::string(VariantName(session->spec().variant))] += session->kv_bytes_used();
  }
  return bytes;
}

}  // namespace attnserve::server
