// Issue 21, item 2: a caller without a valid token is refused from its metadata, before the server
// reads its request, so unauthenticated callers cannot make the server hold their messages; and
// --max_inflight_message_bytes bounds what authenticated callers' unfinished messages hold.
//
// The calls are raw HTTP/2 (tests/support/raw_grpc_call.h): they announce a message of 63 MiB and
// send part of it, which no gRPC client can do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/sha.h>
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/support/raw_grpc_call.h"
#include "tests/support/server_process.h"

namespace attnserve::server_test {
namespace {

constexpr char kToken[] = "alice-5d0e7c1a";
constexpr uint32_t kMessageBytes = 63 << 20;
constexpr int kGrpcUnauthenticated = 16;
constexpr char kService[] = "/attnserve.v1.AttentionService/";

std::string TokenFile() {
  unsigned char hash[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(kToken), sizeof(kToken) - 1, hash);
  std::string path = (std::filesystem::temp_directory_path() / "attnserve_tokens.XXXXXX").string();
  const int fd = mkstemp(path.data());
  EXPECT_GE(fd, 0);
  std::ofstream(path) << absl::BytesToHexString(absl::string_view(
                             reinterpret_cast<const char*>(hash), sizeof(hash)))
                      << " alice\n";
  close(fd);
  return path;
}

class AuthBeforeBodyTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!tokens_.empty()) std::remove(tokens_.c_str());
    if (server_ == nullptr) return;
    absl::StatusOr<ExitState> ended = server_->Terminate(std::chrono::seconds(20));
    EXPECT_TRUE(ended.ok() && ended->exited && ended->exit_code == 0)
        << (ended.ok() ? ended->ToString() : ended.status().ToString());
    if (HasFailure()) std::cerr << "---- server log ----\n" << server_->LogTail() << "\n";
  }

  void StartServer(std::vector<std::string> flags) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        ServerProcess::Start(flags, std::chrono::seconds(30));
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }
  void StartServerWithTokens(std::vector<std::string> flags = {}) {
    tokens_ = TokenFile();
    flags.push_back("--auth_tokens=" + tokens_);
    StartServer(std::move(flags));
  }

  std::unique_ptr<RawGrpcCall> Call(const std::string& method,
                                    std::vector<std::pair<std::string, std::string>> metadata) {
    absl::StatusOr<std::unique_ptr<RawGrpcCall>> call =
        RawGrpcCall::Start(server_->port(), kService + method, metadata, kMessageBytes);
    EXPECT_TRUE(call.ok()) << call.status();
    return call.ok() ? *std::move(call) : nullptr;
  }

  std::string tokens_;
  std::unique_ptr<ServerProcess> server_;
};

// The answer comes while the body is still to come: the server did not wait for it. Before the
// fix, the server read the whole message first, so no answer came while any of it was missing.
TEST_F(AuthBeforeBodyTest, RefusedAtTheMetadataWithoutReadingTheBody) {
  StartServerWithTokens();
  for (const std::string method : {"Configure", "Forward", "Decode", "Fork", "Release",
                                   "GetSession", "ListSessions", "GetServerInfo", "ExportRequest",
                                   "DecodeStream", "ImportRequest"}) {
    for (const auto& metadata : std::vector<std::vector<std::pair<std::string, std::string>>>{
             {}, {{"authorization", "Bearer not-a-token"}}}) {
      std::unique_ptr<RawGrpcCall> call = Call(method, metadata);
      ASSERT_NE(call, nullptr);
      // Only the message's 5-byte prefix was sent: 63 MiB of it are missing.
      absl::StatusOr<RawGrpcCall::End> end = call->AwaitEnd(absl::Now() + absl::Seconds(30));
      ASSERT_TRUE(end.ok()) << method << ": " << end.status();
      EXPECT_EQ(RawGrpcCall::GrpcStatus(end->trailers), kGrpcUnauthenticated)
          << method << ": reset " << end->reset << " code " << end->reset_code;
    }
  }
}

// The report: 16 connections each sending 63 of 64 MiB without a token held +1 GiB. Now
// each is refused at once and the server's memory does not grow by their bodies.
TEST_F(AuthBeforeBodyTest, UnauthenticatedBodiesDoNotGrowTheServer) {
  StartServerWithTokens();
  const int64_t before = server_->ResidentBytes();
  ASSERT_GT(before, 0);
  std::vector<std::unique_ptr<RawGrpcCall>> calls;
  int64_t sent = 0;
  for (int i = 0; i < 16; ++i) {
    calls.push_back(Call("Configure", {}));
    ASSERT_NE(calls.back(), nullptr);
    // Sends until the server ends the stream (or stops opening its window for 3 s).
    absl::StatusOr<int64_t> n = calls.back()->SendBody(kMessageBytes - (1 << 20), absl::Seconds(3));
    ASSERT_TRUE(n.ok()) << n.status();
    sent += *n;
  }
  // The peak, not the resident size now: memory held for a while and freed counts too.
  const int64_t growth = server_->PeakResidentBytes() - before;
  std::cout << "16 unauthenticated calls: client sent " << sent << " body bytes; server peak RSS +"
            << growth << " bytes\n";
  EXPECT_LT(growth, int64_t{64} << 20);
  for (const auto& call : calls) {
    absl::StatusOr<RawGrpcCall::End> end = call->AwaitEnd(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_EQ(RawGrpcCall::GrpcStatus(end->trailers), kGrpcUnauthenticated);
  }
}

// Authenticated callers' unfinished messages are bounded by --max_inflight_message_bytes. gRPC
// opens its windows for the whole of a message it is reading, so each caller sends all but 1 MiB
// of its 63 MiB; but two such bodies do not fit in the quota, and as a second one arrives gRPC
// cancels the oldest call (its destructive reclaimer: RST_STREAM ENHANCE_YOUR_CALM, which a gRPC
// client sees as RESOURCE_EXHAUSTED), so 8 such callers never make the server hold 8 x 62 MiB.
TEST_F(AuthBeforeBodyTest, InflightMessagesAreBoundedByTheQuota) {
  constexpr int64_t kQuota = int64_t{96} << 20;
  constexpr uint32_t kEnhanceYourCalm = 0xb;
  StartServerWithTokens({"--max_inflight_message_bytes=" + std::to_string(kQuota)});
  const int64_t before = server_->ResidentBytes();
  ASSERT_GT(before, 0);
  std::vector<std::unique_ptr<RawGrpcCall>> calls;
  int64_t sent = 0;
  for (int i = 0; i < 8; ++i) {
    calls.push_back(Call("Configure", {{"authorization", absl::StrCat("Bearer ", kToken)}}));
    ASSERT_NE(calls.back(), nullptr);
    absl::StatusOr<int64_t> n = calls.back()->SendBody(kMessageBytes - (1 << 20), absl::Seconds(3));
    ASSERT_TRUE(n.ok()) << n.status();
    sent += *n;
  }
  // Every call but the last was cancelled when the next one's body pushed gRPC past the quota.
  for (int i = 0; i + 1 < static_cast<int>(calls.size()); ++i) {
    absl::StatusOr<RawGrpcCall::End> end = calls[i]->AwaitEnd(absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(end.ok()) << "call " << i << ": " << end.status();
    EXPECT_TRUE(end->reset && end->reset_code == kEnhanceYourCalm)
        << "call " << i << ": reset " << end->reset << " code " << end->reset_code << " status "
        << RawGrpcCall::GrpcStatus(end->trailers);
  }
  const int64_t growth = server_->PeakResidentBytes() - before;
  std::cout << "8 authenticated unfinished calls: client sent " << sent
            << " body bytes; server peak RSS +" << growth << " bytes (quota " << kQuota << ")\n";
  EXPECT_LT(growth, 2 * kQuota);
}

}  // namespace
}  // namespace attnserve::server_test
