// How attnctl and attnbench reach a server that uses TLS, mutual TLS or bearer tokens: the
// --tls_ca, --tls_cert, --tls_key and --token flags (with the environment fallbacks
// ATTNSERVE_TLS_CA, ATTNSERVE_TLS_CERT, ATTNSERVE_TLS_KEY and ATTNSERVE_TOKEN), the channel
// credentials they make, and the `authorization: Bearer <token>` metadata added to every call.
#ifndef ATTNSERVE_CLIENT_COMMON_CHANNEL_SECURITY_H_
#define ATTNSERVE_CLIENT_COMMON_CHANNEL_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace attnserve {

struct ChannelSecurity {
  // TLS when non-empty: PEM of the CA(s) that signed the server's certificate.
  std::string ca_pem;
  // Mutual TLS: the client's PEM certificate chain and private key (both or neither).
  std::string cert_pem;
  std::string key_pem;
  // Sent as `authorization: Bearer <token>` on every call when non-empty.
  std::string token;
};

// From the flags, each falling back to its environment variable when empty. INVALID_ARGUMENT
// naming the flag when a file cannot be read, when --tls_cert/--tls_key come without each other,
// or without --tls_ca (the client certificate is only sent over TLS).
absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags();

// A channel to `target`: plaintext or TLS as `security` says, with the bearer token added to every
// call by an interceptor. An interceptor rather than gRPC call credentials, because gRPC refuses
// call credentials on a plaintext channel, and a token without TLS is fine on loopback.
std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& target,
                                                   const ChannelSecurity& security,
                                                   const grpc::ChannelArguments& args);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_CHANNEL_SECURITY_H_
