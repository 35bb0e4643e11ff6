// The pieces of server security on their own: the token file's parser (every malformed form is
// refused at startup, naming the line), token lookup (right tenant and admin bit, unknown and
// near-miss tokens refused), the loopback test behind the startup warning, and the tenant KV
// budget chained to the pool's (charged to both or neither).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/kv/sequence_table.h"
#include "server/security/caller.h"
#include "server/security/transport_security.h"

namespace attnserve::server {
namespace {

using ::testing::HasSubstr;

// A well-formed hash (of no token in particular), for the malformed-file cases.
constexpr char kSomeHash[] = "29a8a5a2d5a78ec9aab7d02bd0b1fb1dc1eda7c8d6b12e2d1b0ee1b7c1d5c3b4";

TEST(AuthenticatorTest, DisabledMeansEveryCallerIsTheAdmin) {
  const Authenticator auth;
  EXPECT_FALSE(auth.enabled());
  absl::StatusOr<Principal> who = auth.AuthenticateToken("");
  ASSERT_TRUE(who.ok());
  EXPECT_TRUE(who->is_admin);
  EXPECT_EQ(who->tenant, "");
}

TEST(AuthenticatorTest, MapsTokensToTenants) {
  // Hashes computed here with the same function the server uses would prove nothing; these are
  // sha256sum's, so the test fails if the server hashed differently (or not at all).
  const std::string text =
      "# tenants\n"
      "\n"
      "  c0ea1d4b5fbb3ec25ee1ff4ee4a6a5a5e3cd4ba9c3aa4ad2c6c5b1a2f55e7b5c  nobody\n"
      "8d3f9f6e9c1f3a39b1ad2f2fb8d3f2dfa2f3e6d8e1c5b9a2a4c1f0e7d6b5a4c3 other-tenant\n"
      "4813494d137e1631bba301d5acab6e7bb7aa74ce1185d456565ef51d737677b2 root admin\n"
      "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90 alice\n";
  absl::StatusOr<Authenticator> auth = Authenticator::FromText(text, "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ(auth->size(), 4);
  // printf %s root | sha256sum = 4813494d...
  absl::StatusOr<Principal> root = auth->AuthenticateToken("root");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(root->tenant, "root");
  EXPECT_TRUE(root->is_admin);
  // printf %s alice | sha256sum = 2bd806c9...
  absl::StatusOr<Principal> alice = auth->AuthenticateToken("alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_FALSE(alice->is_admin);
  for (const char* bad : {"", "alic", "alice ", "Alice", "root\n",
                          "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90"}) {
    absl::StatusOr<Principal> who = auth->AuthenticateToken(bad);
    EXPECT_EQ(who.status().code(), absl::StatusCode::kUnauthenticated) << "'" << bad << "'";
  }
  EXPECT_EQ(auth->AuthenticateToken(std::string(5000, 'a')).status().code(),
            absl::StatusCode::kUnauthenticated);
}

// A drain's admin acts for the owner of the session it moves (server/security/caller.h):
// the owner is found by tenant name, with its own admin marking.
TEST(AuthenticatorTest, FindsTenantsByName) {
  absl::StatusOr<Authenticator> auth = Authenticator::FromText(
      "4813494d137e1631bba301d5acab6e7bb7aa74ce1185d456565ef51d737677b2 root admin\n"
      "2bd806c97f0e00af1a1fc3328fa763a9269723c8db8fac4f93af71db186d6e90 alice\n",
      "tokens");
  ASSERT_TRUE(auth.ok()) << auth.status();
  std::optional<Principal> alice = auth->FindTenant("alice");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->tenant, "alice");
  EXPECT_FALSE(alice->is_admin);
  ASSERT_TRUE(auth->FindTenant("root").has_value());
  EXPECT_TRUE(auth->FindTenant("root")->is_admin);
  EXPECT_FALSE(auth->FindTenant("bob").has_value());
  EXPECT_FALSE(auth->FindTenant("").has_value());
}

// --drain_token_file: the token on the first line, trimmed; a file that cannot serve as a token
// is a startup error naming the flag.
TEST(BearerTokenFileTest, ReadsTheFirstLineAndRefusesWhatIsNoToken) {
  const std::string path = absl::StrCat(::testing::TempDir(), "drain_token_", getpid());
  const auto write = [&path](const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  };
  write("  s3cret-token\t\nsecond line\n");
  absl::StatusOr<std::string> token = ReadBearerTokenFile(path, "--drain_token_file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret-token");
  for (const std::string& bad : {std::string(""), std::string("\n"), std::string("two words\n"),
                                 std::string(5000, 'a')}) {
    write(bad);
    token = ReadBearerTokenFile(path, "--drain_token_file");
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_THAT(token.status().message(), HasSubstr("--drain_token_file"));
  }
  std::remove(path.c_str());
  EXPECT_EQ(ReadBearerTokenFile(path, "--drain_token_file").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(AuthenticatorTest, RefusesMalformedFiles) {
  const std::string hash(kSomeHash);
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {"", "holds no tokens"},
      {"# only a comment\n\n", "holds no tokens"},
      {hash + "\n", "tokens:1: has 1 fields"},
      {"\n" + hash + " alice admin extra\n", "tokens:2: has 4 fields"},
      {hash.substr(1) + " alice\n", "not 64 hex digits"},
      {std::string(63, 'a') + "g alice\n", "not 64 hex digits"},
      {hash + " al/ice\n", "the tenant must be"},
      {hash + " " + std::string(65, 'a') + "\n", "the tenant must be"},
      {hash + " alice root\n", "the third field must be 'admin'"},
      {hash + " alice\n" + hash + " bob\n", "tokens:2: the same token hash appears twice"},
      {hash + " alice\n" + std::string(64, 'b') + " alice admin\n",
       "tenant 'alice' has tokens both with and without 'admin'"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Authenticator> auth = Authenticator::FromText(c.text, "tokens");
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(auth.status().message(), HasSubstr(c.error)) << c.text;
    EXPECT_THAT(auth.status().message(), HasSubstr("--auth_tokens")) << c.text;
  }
  EXPECT_THAT(Authenticator::FromFile("/nonexistent/tokens").status().message(),
              HasSubstr("--auth_tokens: cannot read '/nonexistent/tokens'"));
}

TEST(TransportSecurityTest, LoopbackAddresses) {
  for (const char* address : {"127.0.0.1:50051", "127.0.0.1:0", "127.1.2.3:1", "localhost:80",
                              "LOCALHOST:80", "[::1]:50051", "unix:/tmp/attnserve.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(address)) << address;
  }
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:50051", "128.0.0.1:1",
                              "127.0.0.256:1", "127.0.0:1", "example.com:443", "[::2]:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(address)) << address;
  }
}

TEST(TransportSecurityTest, WarnsBeyondLoopbackWithoutTlsOrAuth) {
  ServerOptions options;
  EXPECT_EQ(ExposureWarning(options), "") << "the default is loopback";
  options.listen_address = "0.0.0.0:50051";
  EXPECT_THAT(ExposureWarning(options), HasSubstr("TLS is off"));
  EXPECT_THAT(ExposureWarning(options), HasSubstr("authentication is off"));
  options.tls_cert = "c.pem";
  options.tls_key = "k.pem";
  EXPECT_THAT(ExposureWarning(options), ::testing::Not(HasSubstr("TLS is off")));
  EXPECT_THAT(ExposureWarning(options), HasSubstr("authentication is off"));
  options.auth_tokens = "tokens";
  EXPECT_EQ(ExposureWarning(options), "");
  options.tls_cert = options.tls_key = "";
  EXPECT_THAT(ExposureWarning(options), HasSubstr("TLS is off"));
}

TEST(TransportSecurityTest, RefusesIncompleteTlsFlags) {
  ServerOptions options;
  ASSERT_TRUE(MakeServerCredentials(options).ok());
  options.tls_key = "k.pem";
  EXPECT_THAT(MakeServerCredentials(options).status().message(), HasSubstr("go together"));
  options.tls_key = "";
  options.tls_client_ca = "ca.pem";
  EXPECT_THAT(MakeServerCredentials(options).status().message(),
              HasSubstr("--tls_client_ca requires --tls_cert"));
  options.tls_cert = "/nonexistent/c.pem";
  options.tls_key = "/nonexistent/k.pem";
  EXPECT_THAT(MakeServerCredentials(options).status().message(),
              HasSubstr("--tls_cert: cannot read '/nonexistent/c.pem'"));
}

TEST(TenantKvBudgetTest, ChargesBothOrNeither) {
  auto pool = std::make_shared<KvMemoryBudget>(1000);
  KvMemoryBudget alice(300, pool, "tenant 'alice'");
  KvMemoryBudget bob(900, pool, "tenant 'bob'");
  EXPECT_TRUE(alice.TryCharge(200));
  EXPECT_EQ(pool->used_bytes(), 200);
  EXPECT_FALSE(alice.TryCharge(101)) << "over alice's quota";
  EXPECT_EQ(alice.Refuser(101), &alice);
  EXPECT_EQ(alice.used_bytes(), 200);
  EXPECT_EQ(pool->used_bytes(), 200) << "nothing charged to the pool either";
  EXPECT_TRUE(bob.TryCharge(750));
  EXPECT_EQ(alice.free_bytes(), 50) << "the pool has less room than alice's quota";
  EXPECT_FALSE(alice.TryCharge(60)) << "over the pool";
  EXPECT_EQ(alice.Refuser(60), pool.get());
  EXPECT_EQ(alice.used_bytes(), 200) << "alice's charge was rolled back";
  alice.Release(200);
  bob.Release(750);
  EXPECT_EQ(pool->used_bytes(), 0);
  EXPECT_EQ(alice.free_bytes(), 300);
}

}  // namespace
}  // namespace attnserve::server
