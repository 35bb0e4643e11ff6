#include "server/fleet/session_affinity.h"

#include <unistd.h>

#include <climits>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/session/registry.h"

namespace attnserve::server {

namespace {

bool IsSessionIdForm(absl::string_view id) {
  if (id.size() != 32) return false;
  for (const char c : id) {
    if (!absl::ascii_isdigit(c) && !(c >= 'a' && c <= 'f')) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> SessionIdForConfigure(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto [first, last] = metadata.equal_range(kSessionMetadataKey);
  if (first == last) return NewSessionId();
  if (std::next(first) != last) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", kSessionMetadataKey, ": sent more than once"));
  }
  const absl::string_view id(first->second.data(), first->second.size());
  if (!IsSessionIdForm(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", kSessionMetadataKey,
                     ": on Configure it is the new session's id and must be "
                     "32 lowercase hex digits (128 random bits), got ",
                     id.size(), " characters"));
  }
  return std::string(id);
}

std::string DefaultReplicaId(int port) {
  char host[HOST_NAME_MAX + 1] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    return absl::StrCat("localhost:", port);
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace attnserve::server
