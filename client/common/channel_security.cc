#include "client/common/channel_security.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "client/common/session_routing.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"

ABSL_FLAG(std::string, tls_ca, "",
          "TLS: PEM CA certificate that signed the server's certificate (env ATTNSERVE_TLS_CA); "
          "empty = plaintext.");
ABSL_FLAG(std::string, tls_cert, "",
          "Mutual TLS: this client's PEM certificate (env ATTNSERVE_TLS_CERT); needs --tls_ca.");
ABSL_FLAG(std::string, tls_key, "",
          "Mutual TLS: the private key of --tls_cert (env ATTNSERVE_TLS_KEY).");
ABSL_FLAG(std::string, token, "",
          "Bearer token sent as 'authorization: Bearer TOKEN' on every call (env ATTNSERVE_TOKEN; "
          "the environment keeps it out of the process list).");

namespace attnserve {

namespace {

// The flag's value, or the environment variable's when the flag is empty.
std::string FlagOrEnv(const absl::Flag<std::string>& flag, const char* env) {
  std::string value = absl::GetFlag(flag);
  if (value.empty()) {
    if (const char* from_env = std::getenv(env); from_env != nullptr) value = from_env;
  }
  return value;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read '", path, "'"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Adds the authorization metadata to every call of the channel.
class BearerTokenInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;  // Owned by the factory, which outlives the channel's calls.
};

class BearerTokenInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

}  // namespace

absl::StatusOr<ChannelSecurity> ChannelSecurityFromFlags() {
  ChannelSecurity security;
  const std::string ca = FlagOrEnv(FLAGS_tls_ca, "ATTNSERVE_TLS_CA");
  const std::string cert = FlagOrEnv(FLAGS_tls_cert, "ATTNSERVE_TLS_CERT");
  const std::string key = FlagOrEnv(FLAGS_tls_key, "ATTNSERVE_TLS_KEY");
  security.token = FlagOrEnv(FLAGS_token, "ATTNSERVE_TOKEN");
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together (mutual TLS)");
  }
  if (!cert.empty() && ca.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert/--tls_key need --tls_ca: a client certificate is only sent over TLS");
  }
  if (!ca.empty()) {
    absl::StatusOr<std::string> pem = ReadFile(ca, "--tls_ca");
    if (!pem.ok()) return pem.status();
    security.ca_pem = *std::move(pem);
  }
  if (!cert.empty()) {
    absl::StatusOr<std::string> cert_pem = ReadFile(cert, "--tls_cert");
    if (!cert_pem.ok()) return cert_pem.status();
    absl::StatusOr<std::string> key_pem = ReadFile(key, "--tls_key");
    if (!key_pem.ok()) return key_pem.status();
    security.cert_pem = *std::move(cert_pem);
    security.key_pem = *std::move(key_pem);
  }
  return security;
}

std::shared_ptr<grpc::Channel> CreateSecureChannel(const std::string& target,
                                                   const ChannelSecurity& security,
                                                   const grpc::ChannelArguments& args) {
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.ca_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = security.ca_pem;
    ssl.pem_cert_chain = security.cert_pem;
    ssl.pem_private_key = security.key_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  // Every call names its session for a balancer's affinity (client/common/session_routing.h).
  interceptors.push_back(MakeSessionRoutingInterceptorFactory());
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

}  // namespace attnserve
