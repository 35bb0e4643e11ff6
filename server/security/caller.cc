#include "server/security/caller.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/base/clip_for_message.h"

namespace attnserve::server {

namespace {

constexpr size_t kMaxTenantName = 64;
// Longer bearer tokens are refused without hashing (a cheap bound on the work per call).
constexpr size_t kMaxTokenBytes = 4096;

absl::Status Unauthenticated() {
  return absl::UnauthenticatedError(
      "missing or invalid credentials: send metadata 'authorization: Bearer <token>' with a "
      "token of this server's --auth_tokens file");
}

bool IsValidTenantName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxTenantName) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return false;
    }
  }
  return true;
}

bool IsLowerOrUpperHex(absl::string_view s) {
  for (char c : s) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read a token from '", path, "'"));
  }
  const std::string token(absl::StripAsciiWhitespace(line));
  if (token.empty() || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", path, "' must hold a token of 1-",
                                                   kMaxTokenBytes, " bytes on its first line"));
  }
  for (char c : token) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": the token in '", path,
                                                     "' holds whitespace or a control character"));
    }
  }
  return token;
}

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_tokens: cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("--auth_tokens: cannot read '", path, "'"));
  }
  return FromText(text.str(), path);
}

absl::StatusOr<Authenticator> Authenticator::FromText(absl::string_view text,
                                                      absl::string_view source) {
  Authenticator auth;
  auth.enabled_ = true;
  std::map<std::string, bool> admin_by_tenant;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_tokens: ", source, ":", line_number, ": ", what,
                       " (expected '<sha256 hex of the token> <tenant> [admin]')"));
    };
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() < 2 || fields.size() > 3) {
      return error(absl::StrCat("has ", fields.size(), " fields"));
    }
    if (fields[0].size() != 64 || !IsLowerOrUpperHex(fields[0])) {
      return error("the first field is not 64 hex digits");
    }
    if (!IsValidTenantName(fields[1])) {
      return error("the tenant must be 1-64 characters of [A-Za-z0-9_.-]");
    }
    if (fields.size() == 3 && fields[2] != "admin") {
      return error(absl::StrCat("the third field must be 'admin' or absent"));
    }
    Entry entry;
    const std::string bytes = absl::HexStringToBytes(fields[0]);
    std::copy(bytes.begin(), bytes.end(), entry.hash.begin());
    entry.principal.tenant = std::string(fields[1]);
    entry.principal.is_admin = fields.size() == 3;
    for (const Entry& other : auth.entries_) {
      if (other.hash == entry.hash) return error("the same token hash appears twice");
    }
    const auto [it, inserted] =
        admin_by_tenant.emplace(entry.principal.tenant, entry.principal.is_admin);
    if (!inserted && it->second != entry.principal.is_admin) {
      return error(absl::StrCat("tenant '", entry.principal.tenant,
                                "' has tokens both with and without 'admin'"));
    }
    auth.entries_.push_back(std::move(entry));
  }
  if (auth.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens: ", source, " holds no tokens (nobody could call the server)"));
  }
  return auth;
}

absl::StatusOr<Principal> Authenticator::Authenticate(
    const grpc::ServerContextBase& context) const {
  if (!enabled_) return Principal::Unauthenticated();
  const auto& metadata = context.client_metadata();
  const auto found = metadata.find("authorization");
  // Exactly one authorization entry: with several, which one counts would be ambiguous.
  if (found == metadata.end() || metadata.count("authorization") != 1) return Unauthenticated();
  absl::string_view value(found->second.data(), found->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return Unauthenticated();
  }
  return AuthenticateToken(absl::StripAsciiWhitespace(value.substr(kScheme.size())));
}

absl::StatusOr<Principal> Authenticator::AuthenticateToken(absl::string_view token) const {
  if (!enabled_) return Principal::Unauthenticated();
  if (token.empty() || token.size() > kMaxTokenBytes) return Unauthenticated();
  Sha256 hash;
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), hash.data());
  // Every entry is compared, in constant time, whatever matched before: `match` becomes the
  // index + 1 of the matching entry (hashes are unique) without a data-dependent branch.
  size_t match = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const size_t equal = CRYPTO_memcmp(hash.data(), entries_[i].hash.data(), hash.size()) == 0;
    match |= (i + 1) & (size_t{0} - equal);
  }
  OPENSSL_cleanse(hash.data(), hash.size());
  if (match == 0) return Unauthenticated();
  return entries_[match - 1].principal;
}

std::optional<Principal> Authenticator::FindTenant(absl::string_view tenant) const {
  for (const Entry& entry : entries_) {
    if (entry.principal.tenant == tenant) return entry.principal;
  }
  return std::nullopt;
}

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
        kOwnerMetadataKey,
        ": this server does not authenticate its callers (no --auth_tokens), "
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
