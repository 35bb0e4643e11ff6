// Issue 14, security: TLS and mutual TLS through gRPC's credentials, bearer tokens mapped to
// tenants, session isolation between tenants (another tenant's id reads exactly as an unknown id),
// the admin's view, and the per-tenant quotas (sessions, parameter bytes, KV bytes).
//
// Certificates are made per test suite with the `openssl` command line in a temporary directory:
// a CA, a server certificate for IP:127.0.0.1 and DNS:localhost, a client certificate, and a client
// certificate of a second, untrusted CA. The clients are the real client code (CreateSecureChannel,
// which attnctl and attnbench use), so the token travels as those tools send it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/sha.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/common/channel_security.h"
#include "tests/reference/test_cases.h"
#include "tests/support/server_process.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-3b1f0c2e9d";
constexpr char kBobToken[] = "bob-77a4e0c15f";
constexpr char kRootToken[] = "root-c0ffee1234";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string Sha256Hex(const std::string& token) {
  unsigned char hash[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), hash);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(hash), sizeof(hash)));
}

// Runs a shell command in `dir`; its output goes to dir/openssl.log.
bool RunIn(const std::string& dir, const std::string& command) {
  const std::string line = absl::StrCat("cd '", dir, "' && ", command, " >>openssl.log 2>&1");
  return std::system(line.c_str()) == 0;
}

// The small layer every test configures.
LayerSpec Spec() { return reference::FindSpec("gqa2_half_bias_hd16_theta5e5").spec; }

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string dir = (std::filesystem::temp_directory_path() / "attnserve_auth.XXXXXX").string();
    dir_ = new std::string;
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    *dir_ = dir;
    // EC keys: quick to make. Each certificate is signed by the CA, servers with their SANs.
    const std::string key = "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256";
    const auto sign = [&](const std::string& name, const std::string& ca, const std::string& ext) {
      WriteFile(absl::StrCat(dir, "/", name, ".ext"), ext);
      return RunIn(dir, absl::StrCat(key, " -out ", name, ".key")) &&
             RunIn(dir, absl::StrCat("openssl req -new -key ", name, ".key -subj /CN=", name,
                                     " -out ", name, ".csr")) &&
             RunIn(dir, absl::StrCat("openssl x509 -req -in ", name, ".csr -CA ", ca,
                                     ".pem -CAkey ", ca, ".key -CAcreateserial -days 2 -extfile ",
                                     name, ".ext -out ", name, ".pem"));
    };
    const auto make_ca = [&](const std::string& name) {
      return RunIn(dir, absl::StrCat(key, " -out ", name, ".key")) &&
             RunIn(dir, absl::StrCat("openssl req -x509 -new -key ", name, ".key -subj /CN=", name,
                                     " -days 2 -out ", name, ".pem"));
    };
    ASSERT_TRUE(make_ca("ca") && make_ca("other_ca")) << ReadFile(dir + "/openssl.log");
    ASSERT_TRUE(sign("server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\n") &&
                sign("client", "ca", "extendedKeyUsage=clientAuth\n") &&
                sign("stranger", "other_ca", "extendedKeyUsage=clientAuth\n"))
        << ReadFile(dir + "/openssl.log");
    certificates_made_ = true;
    WriteFile(dir + "/tokens", absl::StrCat("# test tokens\n", Sha256Hex(kAliceToken), " alice\n\n",
                                            Sha256Hex(kBobToken), "  bob\n", Sha256Hex(kRootToken),
                                            " root admin\n"));
  }
  static void TearDownTestSuite() {
    std::error_code ignored;
    if (!dir_->empty()) std::filesystem::remove_all(*dir_, ignored);
    delete dir_;
  }

  void SetUp() override { ASSERT_TRUE(certificates_made_) << "see SetUpTestSuite's failure"; }

  static std::string Path(const std::string& name) { return absl::StrCat(*dir_, "/", name); }

  void TearDown() override {
    if (server_ == nullptr) return;
    absl::StatusOr<ExitState> ended = server_->Terminate(std::chrono::seconds(20));
    EXPECT_TRUE(ended.ok() && ended->exited && ended->exit_code == 0)
        << (ended.ok() ? ended->ToString() : ended.status().ToString());
    if (HasFailure()) std::cerr << "---- server log ----\n" << server_->LogTail() << "\n";
  }

  void StartServer(std::vector<std::string> flags,
                   std::shared_ptr<grpc::ChannelCredentials> health_credentials = nullptr) {
    flags.push_back(absl::StrCat("--threads=", kBackendThreads));
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        ServerProcess::Start(flags, std::chrono::seconds(30), std::move(health_credentials));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }

  // A stub over the real client channel code; PEM contents and token as attnctl would load them.
  std::unique_ptr<v1::AttentionService::Stub> Stub(const ChannelSecurity& security) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    return v1::AttentionService::NewStub(CreateSecureChannel(server_->address(), security, args));
  }
  std::unique_ptr<v1::AttentionService::Stub> TokenStub(const std::string& token) {
    ChannelSecurity security;
    security.token = token;
    return Stub(security);
  }

  static ChannelSecurity Tls(bool with_client_cert, const std::string& client = "client") {
    ChannelSecurity security;
    security.ca_pem = ReadFile(Path("ca.pem"));
    if (with_client_cert) {
      security.cert_pem = ReadFile(Path(client + ".pem"));
      security.key_pem = ReadFile(Path(client + ".key"));
    }
    return security;
  }
  static std::shared_ptr<grpc::ChannelCredentials> SslCredentials(bool with_client_cert) {
    const ChannelSecurity security = Tls(with_client_cert);
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = security.ca_pem;
    ssl.pem_cert_chain = security.cert_pem;
    ssl.pem_private_key = security.key_pem;
    return grpc::SslCredentials(ssl);
  }

  static grpc::Status Info(v1::AttentionService::Stub& stub) {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(10));
    v1::GetServerInfoResponse response;
    return stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  }
  static std::string NewSession(v1::AttentionService::Stub& stub) {
    v1::ConfigureResponse response;
    grpc::Status status = Configure(stub, SeedConfigure(Spec(), 1), &response);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return response.session_id();
  }
  grpc::Status Prefill(v1::AttentionService::Stub& stub, const std::string& session,
                       const std::string& request_id, int64_t tokens) {
    v1::ForwardRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeForwardItem(request_id, RandomHidden(tokens, Spec().d_model, rng_));
    v1::ForwardResponse response;
    return Forward(stub, request, &response);
  }
  grpc::Status DecodeStep(v1::AttentionService::Stub& stub, const std::string& session,
                          const std::string& request_id) {
    v1::DecodeRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeDecodeItem(request_id, RandomHidden(1, Spec().d_model, rng_));
    v1::DecodeResponse response;
    return Decode(stub, request, &response);
  }
  grpc::Status StreamStep(v1::AttentionService::Stub& stub, const std::string& session,
                          const std::string& request_id) {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(10));
    auto stream = stub.DecodeStream(&context);
    v1::DecodeRequest request;
    request.set_session_id(session);
    *request.add_items() = MakeDecodeItem(request_id, RandomHidden(1, Spec().d_model, rng_));
    stream->Write(request);
    stream->WritesDone();
    v1::DecodeResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }
  static grpc::Status GetSession(v1::AttentionService::Stub& stub, const std::string& session) {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(10));
    v1::GetSessionRequest request;
    request.set_session_id(session);
    v1::GetSessionResponse response;
    return stub.GetSession(&context, request, &response);
  }
  static grpc::Status List(v1::AttentionService::Stub& stub, v1::ListSessionsResponse* response) {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(10));
    return stub.ListSessions(&context, v1::ListSessionsRequest(), response);
  }
  static std::vector<std::string> ListIds(v1::AttentionService::Stub& stub) {
    v1::ListSessionsResponse response;
    grpc::Status status = List(stub, &response);
    EXPECT_TRUE(status.ok()) << Describe(status);
    std::vector<std::string> ids;
    for (const v1::SessionInfo& info : response.sessions()) ids.push_back(info.session_id());
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  static std::string* dir_;
  static bool certificates_made_;
  std::unique_ptr<ServerProcess> server_;
  std::mt19937_64 rng_{14};
};

std::string* SecurityTest::dir_ = nullptr;
bool SecurityTest::certificates_made_ = false;

// ---- TLS ---------------------------------------------------------------------------------------

TEST_F(SecurityTest, TlsServerRefusesPlaintextAndServesTlsClients) {
  StartServer({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key")},
              SslCredentials(false));
  grpc::Status plaintext = Info(*Stub({}));
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(plaintext);
  grpc::Status tls = Info(*Stub(Tls(false)));
  EXPECT_TRUE(tls.ok()) << Describe(tls);
  EXPECT_THAT(server_->LogTail(), HasSubstr("transport: TLS;"));
}

TEST_F(SecurityTest, MutualTlsRequiresAClientCertificateOfTheTrustedCa) {
  StartServer({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"),
               "--tls_client_ca=" + Path("ca.pem")},
              SslCredentials(true));
  grpc::Status no_cert = Info(*Stub(Tls(false)));
  EXPECT_EQ(no_cert.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(no_cert);
  grpc::Status untrusted = Info(*Stub(Tls(true, "stranger")));
  EXPECT_EQ(untrusted.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(untrusted);
  grpc::Status with_cert = Info(*Stub(Tls(true)));
  EXPECT_TRUE(with_cert.ok()) << Describe(with_cert);
}

TEST_F(SecurityTest, TlsAndTokensTogether) {
  StartServer({"--tls_cert=" + Path("server.pem"), "--tls_key=" + Path("server.key"),
               "--auth_tokens=" + Path("tokens")},
              SslCredentials(false));
  EXPECT_EQ(Info(*Stub(Tls(false))).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  ChannelSecurity alice = Tls(false);
  alice.token = kAliceToken;
  grpc::Status status = Info(*Stub(alice));
  EXPECT_TRUE(status.ok()) << Describe(status);
}

// ---- Tokens ------------------------------------------------------------------------------------

TEST_F(SecurityTest, MissingOrWrongTokenIsUnauthenticated) {
  StartServer({"--auth_tokens=" + Path("tokens")});
  for (const std::string& token : {std::string(""), std::string("alice-3b1f0c2e9"),
                                   std::string(kAliceToken) + "x", std::string("Bearer")}) {
    auto stub = TokenStub(token);
    grpc::Status info = Info(*stub);
    EXPECT_EQ(info.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "token '" << token << "': " << Describe(info);
    EXPECT_THAT(info.error_message(), ::testing::Not(HasSubstr(kAliceToken)));
    v1::ConfigureResponse configured;
    EXPECT_EQ(Configure(*stub, SeedConfigure(Spec(), 1), &configured).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListSessionsResponse listed;
    EXPECT_EQ(List(*stub, &listed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(GetSession(*stub, "0123").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(DecodeStep(*stub, "0123", "a").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(StreamStep(*stub, "0123", "a").error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Prefill(*stub, "0123", "a", 4).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(Release(*stub, "0123", "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Another scheme than Bearer.
  grpc::ClientContext context;
  SetDeadline(context, std::chrono::seconds(10));
  context.AddMetadata("authorization", absl::StrCat("Basic ", kAliceToken));
  v1::GetServerInfoResponse response;
  EXPECT_EQ(TokenStub("")->GetServerInfo(&context, {}, &response).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Info(*TokenStub(kAliceToken)).ok());
}

// ---- Isolation ---------------------------------------------------------------------------------

TEST_F(SecurityTest, TenantsCannotSeeOrTouchEachOthersSessions) {
  StartServer({"--auth_tokens=" + Path("tokens")});
  auto alice = TokenStub(kAliceToken);
  auto bob = TokenStub(kBobToken);
  auto root = TokenStub(kRootToken);
  const std::string a = NewSession(*alice);
  ASSERT_TRUE(Prefill(*alice, a, "r", 20).ok());
  const std::string b = NewSession(*bob);
  const std::string unknown(a.size(), '7');

  // Bob's answer about Alice's session must read exactly as his answer about an unknown id.
  const auto same_as_unknown = [&](auto call, const char* rpc) {
    const grpc::Status on_a = call(a);
    const grpc::Status on_unknown = call(unknown);
    EXPECT_EQ(on_a.error_code(), grpc::StatusCode::NOT_FOUND) << rpc << ": " << Describe(on_a);
    EXPECT_EQ(on_unknown.error_code(), grpc::StatusCode::NOT_FOUND) << rpc;
    EXPECT_EQ(absl::StrReplaceAll(on_a.error_message(), {{a, "ID"}}),
              absl::StrReplaceAll(on_unknown.error_message(), {{unknown, "ID"}}))
        << rpc;
  };
  same_as_unknown([&](const std::string& id) { return Prefill(*bob, id, "r", 3); }, "Forward");
  same_as_unknown([&](const std::string& id) { return DecodeStep(*bob, id, "r"); }, "Decode");
  same_as_unknown([&](const std::string& id) { return StreamStep(*bob, id, "r"); }, "DecodeStream");
  same_as_unknown([&](const std::string& id) { return GetSession(*bob, id); }, "GetSession");
  same_as_unknown([&](const std::string& id) { return Release(*bob, id, "r"); }, "Release(req)");
  same_as_unknown([&](const std::string& id) { return Release(*bob, id, ""); }, "Release");

  EXPECT_EQ(ListIds(*alice), std::vector<std::string>{a});
  EXPECT_EQ(ListIds(*bob), std::vector<std::string>{b});
  std::vector<std::string> both = {a, b};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(ListIds(*root), both) << "the admin sees every tenant's sessions";
  // GetServerInfo counts the caller's own sessions (all of them for the admin).
  for (const auto& [stub, expected] : {std::pair{bob.get(), 1}, std::pair{root.get(), 2}}) {
    absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(*stub);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->sessions(), expected);
  }

  // Alice's session is untouched: her request still decodes at length 21.
  v1::DecodeRequest request;
  request.set_session_id(a);
  *request.add_items() = MakeDecodeItem("r", RandomHidden(1, Spec().d_model, rng_));
  v1::DecodeResponse response;
  grpc::Status decoded = Decode(*alice, request, &response);
  ASSERT_TRUE(decoded.ok()) << Describe(decoded);
  EXPECT_EQ(response.results(0).sequence_length(), 21);
  // The admin may act on it (server-wide operations).
  EXPECT_TRUE(GetSession(*root, a).ok());
  EXPECT_TRUE(Release(*root, a, "").ok());
  EXPECT_EQ(GetSession(*alice, a).error_code(), grpc::StatusCode::NOT_FOUND);
}

// Issue 21, item 10: Configure with another tenant's live id in x-attnserve-session answers as a
// never-used id does (a new session of the caller's own), so it cannot tell whether the id is
// live; only the caller's own live id is ALREADY_EXISTS.
TEST_F(SecurityTest, ConfigureWithAnotherTenantsIdIsNoExistenceOracle) {
  StartServer({"--auth_tokens=" + Path("tokens")});
  auto alice = TokenStub(kAliceToken);
  auto bob = TokenStub(kBobToken);
  const std::string a = NewSession(*alice);
  ASSERT_TRUE(Prefill(*alice, a, "r", 20).ok());
  const std::string unused(a.size(), 'e');
  const auto configure_as_bob = [&](const std::string& id, v1::ConfigureResponse* response) {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(30));
    context.AddMetadata("x-attnserve-session", id);
    return bob->Configure(&context, SeedConfigure(Spec(), 2), response);
  };
  v1::ConfigureResponse on_a;
  v1::ConfigureResponse on_unused;
  const grpc::Status taken = configure_as_bob(a, &on_a);
  const grpc::Status fresh = configure_as_bob(unused, &on_unused);
  EXPECT_TRUE(fresh.ok()) << Describe(fresh);
  EXPECT_EQ(taken.error_code(), fresh.error_code()) << Describe(taken);
  EXPECT_EQ(on_a.session_id(), a);
  // Bob's own ids are his to refuse: a second Configure of either is ALREADY_EXISTS alike.
  v1::ConfigureResponse again;
  EXPECT_EQ(configure_as_bob(a, &again).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(configure_as_bob(unused, &again).error_code(), grpc::StatusCode::ALREADY_EXISTS);
  // Two sessions of one id, one per tenant, neither touching the other.
  ASSERT_TRUE(Prefill(*bob, a, "r", 5).ok());
  v1::GetSessionResponse alices;
  grpc::ClientContext context;
  SetDeadline(context, std::chrono::seconds(10));
  v1::GetSessionRequest request;
  request.set_session_id(a);
  ASSERT_TRUE(alice->GetSession(&context, request, &alices).ok());
  ASSERT_EQ(alices.session().requests_size(), 1);
  EXPECT_EQ(alices.session().requests(0).sequence_length(), 20);
  EXPECT_TRUE(Release(*bob, a, "").ok());
  EXPECT_TRUE(GetSession(*alice, a).ok()) << "Bob's Release freed his session, not Alice's";
}

// ---- Quotas ------------------------------------------------------------------------------------

TEST_F(SecurityTest, SessionQuotaPerTenant) {
  StartServer({"--auth_tokens=" + Path("tokens"), "--tenant_max_sessions=2"});
  auto alice = TokenStub(kAliceToken);
  const std::string first = NewSession(*alice);
  NewSession(*alice);
  v1::ConfigureResponse response;
  grpc::Status third = Configure(*alice, SeedConfigure(Spec(), 1), &response);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(third);
  EXPECT_THAT(third.error_message(), HasSubstr("--tenant_max_sessions = 2"));
  EXPECT_THAT(third.error_message(), HasSubstr("tenant 'alice' has 2 live sessions"));
  // Other tenants and the admin are not limited by Alice's use.
  NewSession(*TokenStub(kBobToken));
  auto root = TokenStub(kRootToken);
  for (int i = 0; i < 3; ++i) NewSession(*root);
  // Released, the quota frees.
  ASSERT_TRUE(Release(*alice, first, "").ok());
  NewSession(*alice);
}

TEST_F(SecurityTest, ParameterQuotaPerTenant) {
  const int64_t layer_bytes = ParameterCount(Spec()) * 4;  // fp32 weights on the CPU backend
  StartServer({"--auth_tokens=" + Path("tokens"),
               absl::StrCat("--tenant_max_parameter_bytes=", layer_bytes * 3 / 2)});
  auto alice = TokenStub(kAliceToken);
  const std::string first = NewSession(*alice);
  v1::ConfigureResponse response;
  grpc::Status second = Configure(*alice, SeedConfigure(Spec(), 1), &response);
  EXPECT_EQ(second.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(second);
  EXPECT_THAT(second.error_message(),
              HasSubstr(absl::StrCat("--tenant_max_parameter_bytes = ", layer_bytes * 3 / 2)));
  EXPECT_THAT(second.error_message(), HasSubstr(absl::StrCat("needs ", layer_bytes,
                                                             " bytes of weights, tenant 'alice' "
                                                             "holds ",
                                                             layer_bytes)));
  NewSession(*TokenStub(kBobToken));
  ASSERT_TRUE(Release(*alice, first, "").ok());
  NewSession(*alice);
}

TEST_F(SecurityTest, KvQuotaPerTenant) {
  // The default page size (16 tokens here); a quota of 4 pages per tenant, well inside the pool.
  ASSERT_EQ(DefaultPageSize(Spec()), 16);
  const int64_t page_bytes = 16 * KvBytesPerToken(Spec(), DType::kF32);
  StartServer(
      {"--auth_tokens=" + Path("tokens"), absl::StrCat("--tenant_max_kv_bytes=", 4 * page_bytes)});
  auto alice = TokenStub(kAliceToken);
  const std::string s1 = NewSession(*alice);
  const std::string s2 = NewSession(*alice);
  ASSERT_TRUE(Prefill(*alice, s1, "a", 48).ok());  // 3 pages
  // The quota spans all of the tenant's sessions: 2 more pages do not fit in the 4th.
  grpc::Status over = Prefill(*alice, s2, "b", 20);
  EXPECT_EQ(over.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(over);
  EXPECT_THAT(over.error_message(), HasSubstr("tenant 'alice' (--tenant_max_kv_bytes)"));
  EXPECT_THAT(over.error_message(),
              HasSubstr(absl::StrCat(page_bytes, " of ", 4 * page_bytes, " bytes are free")));
  // Bob has his own quota.
  auto bob = TokenStub(kBobToken);
  ASSERT_TRUE(Prefill(*bob, NewSession(*bob), "a", 60).ok());
  // Released, the bytes come back to Alice's quota.
  ASSERT_TRUE(Release(*alice, s1, "a").ok());
  grpc::Status after = Prefill(*alice, s2, "b", 60);
  EXPECT_TRUE(after.ok()) << Describe(after);
}

}  // namespace
}  // namespace attnserve::server_test
