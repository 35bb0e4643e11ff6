// The gRPC server credentials of --tls_cert/--tls_key/--tls_client_ca (TLS, mutual TLS or
// plaintext) and the startup warning for a port reachable beyond loopback without TLS or auth.
#ifndef ATTNSERVE_SERVER_SECURITY_TRANSPORT_SECURITY_H_
#define ATTNSERVE_SERVER_SECURITY_TRANSPORT_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/security/server_credentials.h"
#include "server/server_options.h"

namespace attnserve::server {

// Plaintext when no TLS flag is set; TLS with the certificate chain and key of tls_cert/tls_key;
// with tls_client_ca also, every client must present a certificate that this CA signed (mutual
// TLS), and the handshake fails otherwise. INVALID_ARGUMENT naming the flag when tls_key is set
// without tls_cert (or the reverse), tls_client_ca without them, or a file cannot be read or holds
// no PEM block. gRPC itself checks that the key matches the certificate when the port is bound.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options);

// Whether a --listen address only accepts connections from this machine: 127.0.0.0/8, [::1],
// localhost, or a unix: socket. "0.0.0.0", "[::]", other hosts and names are not loopback.
bool IsLoopbackAddress(absl::string_view listen_address);

// The warning to log at startup, or "" when none is due: the address is not loopback and either
// TLS (tokens and tensors cross the network in clear) or authentication (anyone who can reach
// the port can use and release every session) is off.
std::string ExposureWarning(const ServerOptions& options);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SECURITY_TRANSPORT_SECURITY_H_
