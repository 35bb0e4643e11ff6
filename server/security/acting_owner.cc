#include "server/security/acting_owner.h"

#include <iterator>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/base/clip_for_message.h"

namespace attnserve::server {

absl::StatusOr<Principal> ActingPrincipal(const Authenticator* authenticator,
                                          const Principal& caller,
                                          const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  const auto range = metadata.equal_range(kOwnerMetadataKey);
  if (range.first == range.second) return caller;
  if (std::next(range.first) != range.second) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOwnerMetadataKey, ": sent more than once; name one tenant"));
  }
  const absl::string_view owner(range.first->second.data(), range.first->second.size());
  if (authenticator == nullptr || !authenticator->enabled()) {
    return absl::FailedPreconditionError(absl::StrCat(
        kOwnerMetadataKey, ": this server does not authenticate its callers (no --auth_tokens), "
        "so it cannot keep a session's owner; move tenants' sessions to a server with tenants"));
  }
  if (owner == caller.tenant) return caller;
  if (!caller.is_admin) {
    return absl::PermissionDeniedError(
        absl::StrCat(kOwnerMetadataKey, ": only an admin token may act for another tenant"));
  }
  std::optional<Principal> acting = authenticator->FindTenant(owner);
  if (!acting.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOwnerMetadataKey, ": tenant '", ClipForMessage(owner),
                     "' has no token on this server, so it could never reach a session kept for "
                     "it here"));
  }
  return *acting;
}

}  // namespace attnserve::server
