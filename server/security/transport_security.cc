#include "server/security/transport_security.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/security/server_credentials.h"

namespace attnserve::server {

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  if (!absl::StrContains(text.str(), "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM block (-----BEGIN ...)"));
  }
  return text.str();
}

// The host part of host:port, [v6]:port or a bare host.
absl::string_view HostOf(absl::string_view address) {
  if (!absl::ConsumePrefix(&address, "ipv4:")) absl::ConsumePrefix(&address, "ipv6:");
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return close == absl::string_view::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  // More than one colon without brackets is a bare IPv6 address.
  if (colon != absl::string_view::npos && address.find(':') == colon) {
    return address.substr(0, colon);
  }
  return address;
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: set both (TLS) or neither (plaintext)");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca requires --tls_cert and --tls_key (mutual TLS is TLS first)");
    }
    return grpc::InsecureServerCredentials();
  }
  absl::StatusOr<std::string> cert = ReadPem(options.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(options.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      options.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                    : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(options.tls_client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  ssl.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(ssl);
}

bool IsLoopbackAddress(absl::string_view listen_address) {
  if (absl::StartsWith(listen_address, "unix:") ||
      absl::StartsWith(listen_address, "unix-abstract:")) {
    return true;
  }
  const std::string host = absl::AsciiStrToLower(HostOf(listen_address));
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8: four decimal octets, the first 127.
  const std::vector<absl::string_view> octets = absl::StrSplit(host, '.');
  if (octets.size() != 4 || octets[0] != "127") return false;
  for (absl::string_view octet : octets) {
    int value = 0;
    if (!absl::SimpleAtoi(octet, &value) || value < 0 || value > 255) return false;
  }
  return true;
}

std::string ExposureWarning(const ServerOptions& options) {
  if (IsLoopbackAddress(options.listen_address)) return "";
  std::vector<std::string> missing;
  if (options.tls_cert.empty()) {
    missing.push_back(
        "TLS is off (--tls_cert/--tls_key): tokens and tensors cross the network "
        "in clear");
  }
  if (options.auth_tokens.empty()) {
    missing.push_back(
        "authentication is off (--auth_tokens): anyone who reaches the port can "
        "list, use and release every session");
  }
  if (missing.empty()) return "";
  return absl::StrCat("--listen = ", options.listen_address, " is not a loopback address and ",
                      absl::StrJoin(missing, "; and "));
}

}  // namespace attnserve::server
