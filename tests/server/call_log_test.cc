// Failed calls leave a trace in the server's log (server/observability/call_log.h): the caller's
// address, the RPC, the status code and its message, in the text format and in --log_format=json
// (every line of the log one JSON object), and a flood of failures is rate-limited per status code
// with the suppressed lines counted exactly.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "tests/support/await_until.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

constexpr size_t kWholeLog = 8 << 20;

std::vector<std::string> Lines(const std::string& log) {
  return absl::StrSplit(log, '\n', absl::SkipEmpty());
}

// Calls that fail: an unknown session (NOT_FOUND), an oversized id (INVALID_ARGUMENT), a session
// id with a quote and a newline (a client string that must not break or forge a log line), and
// a checkpoint path escaping --checkpoint_root (a path traversal attempt).
grpc::Status GetUnknownSession(v1::AttentionService::Stub& stub, const std::string& id) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest request;
  request.set_session_id(id);
  v1::GetSessionResponse response;
  return stub.GetSession(&context, request, &response);
}

grpc::Status ConfigureFromPath(v1::AttentionService::Stub& stub, const std::string& path) {
  v1::ConfigureRequest request;
  request.mutable_weights()->mutable_checkpoint()->set_path(path);
  v1::ConfigureResponse response;
  return Configure(stub, request, &response);
}

class CallLogTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    std::vector<std::string> flags = {"--checkpoint_root=" + ::testing::TempDir()};
    for (const std::string& f : Flags()) flags.push_back(f);
    return flags;
  }
  virtual std::vector<std::string> Flags() const { return {}; }

  // The lines of the log holding every one of `parts`, waiting (bounded) for the first.
  std::vector<std::string> Find(const std::vector<std::string>& parts) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::vector<std::string> found;
    while (true) {
      found.clear();
      for (const std::string& line : Lines(server().LogTail(kWholeLog))) {
        bool all = true;
        for (const std::string& part : parts) all = all && absl::StrContains(line, part);
        if (all) found.push_back(line);
      }
      if (!found.empty() || std::chrono::steady_clock::now() > until) return found;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
};

TEST_F(CallLogTest, FailedCallsAreLoggedWithPeerRpcCodeAndMessage) {
  const std::string unknown = "0123456789abcdef0123456789abcdef";
  ASSERT_EQ(GetUnknownSession(stub(), unknown).error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<std::string> lines =
      Find({" W call failed", "rpc=get_session", "code=NOT_FOUND", "peer=ipv4:127.0.0.1:"});
  ASSERT_EQ(lines.size(), 1u) << server().LogTail();
  EXPECT_TRUE(absl::StrContains(lines[0], unknown)) << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "error=\"")) << lines[0];

  ASSERT_EQ(GetUnknownSession(stub(), std::string(1000, 'x')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  lines = Find({"call failed", "rpc=get_session", "code=INVALID_ARGUMENT", "session_id: has 1000"});
  EXPECT_EQ(lines.size(), 1u) << server().LogTail();

  // A path traversal attempt: the path is in the line, the server's answer too.
  const grpc::Status traversal = ConfigureFromPath(stub(), "../../../etc/passwd");
  ASSERT_FALSE(traversal.ok());
  lines = Find({"call failed", "rpc=configure", "../../../etc/passwd"});
  ASSERT_EQ(lines.size(), 1u) << server().LogTail();
  EXPECT_TRUE(absl::StrContains(
      lines[0], absl::StrCat("code=", traversal.error_code() == grpc::StatusCode::NOT_FOUND
                                          ? "NOT_FOUND"
                                          : "FAILED_PRECONDITION")))
      << lines[0];

  // A client string with a quote and a newline stays inside its quoted value on one line.
  ASSERT_FALSE(GetUnknownSession(stub(), "evil\"\nW call failed rpc=forged").ok());
  lines = Find({"call failed", "rpc=get_session", "evil\\\"\\nW call failed rpc=forged"});
  EXPECT_EQ(lines.size(), 1u) << server().LogTail();
  EXPECT_TRUE(Find({"rpc=forged"}).size() == 1u) << "a forged line appeared";

  // Successful calls are not logged as failures.
  ASSERT_TRUE(ServerInfo(stub()).ok());
  EXPECT_FALSE(absl::StrContains(server().LogTail(kWholeLog), "rpc=get_server_info"));
}

class JsonCallLogTest : public CallLogTest {
 protected:
  std::vector<std::string> Flags() const override { return {"--log_format=json"}; }
};

// Every line of the log (startup, failures, shutdown not yet) is one JSON object with ts, level
// and msg; a failed call's has rpc, code, peer and error.
TEST_F(JsonCallLogTest, EveryLineIsAJsonObjectAndFailuresCarryTheirFields) {
  ASSERT_EQ(GetUnknownSession(stub(), "evil\"\n{\"level\":\"forged\"} \x01").error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_FALSE(ConfigureFromPath(stub(), "../outside/model.safetensors").ok());
  ASSERT_FALSE(Find({"\"rpc\":\"configure\""}).empty()) << server().LogTail();

  int failures = 0;
  const std::vector<std::string> lines = Lines(server().LogTail(kWholeLog));
  ASSERT_GE(lines.size(), 3u);
  for (const std::string& line : lines) {
    google::protobuf::Struct object;
    const auto parsed = google::protobuf::util::JsonStringToMessage(line, &object);
    ASSERT_TRUE(parsed.ok()) << "not a JSON object: " << line;
    const auto& fields = object.fields();
    ASSERT_TRUE(fields.contains("ts") && fields.contains("level") && fields.contains("msg"))
        << line;
    EXPECT_TRUE(absl::EndsWith(fields.at("ts").string_value(), "Z")) << line;
    const std::string level = fields.at("level").string_value();
    EXPECT_TRUE(level == "INFO" || level == "WARNING" || level == "ERROR") << line;
    if (fields.at("msg").string_value() != "call failed") continue;
    ++failures;
    for (const char* key : {"rpc", "code", "peer", "error"}) {
      EXPECT_TRUE(fields.contains(key)) << key << " missing: " << line;
    }
    EXPECT_EQ(level, "WARNING") << line;
    EXPECT_TRUE(absl::StartsWith(fields.at("peer").string_value(), "ipv4:127.0.0.1:")) << line;
    if (fields.at("rpc").string_value() == "get_session") {
      EXPECT_EQ(fields.at("code").string_value(), "NOT_FOUND");
      // The client's bytes come back intact once the JSON is decoded.
      EXPECT_TRUE(absl::StrContains(fields.at("error").string_value(),
                                    "evil\"\n{\"level\":\"forged\"} \x01"))
          << line;
    } else {
      EXPECT_EQ(fields.at("rpc").string_value(), "configure") << line;
      EXPECT_TRUE(absl::StrContains(fields.at("error").string_value(), "../outside")) << line;
    }
  }
  EXPECT_EQ(failures, 2) << server().LogTail();
}

class RateLimitedCallLogTest : public CallLogTest {
 protected:
  std::vector<std::string> Flags() const override {
    return {absl::StrCat("--log_failed_calls_per_second=", kPerSecond)};
  }
  static constexpr int kPerSecond = 5;
};

// A flood of NOT_FOUND is cut to kPerSecond lines a second; every suppressed one is counted and
// reported once the code logs again, so lines + suppressed = calls exactly; another code in the
// same second still gets its line.
TEST_F(RateLimitedCallLogTest, AFloodIsRateLimitedPerCodeAndTheRestCounted) {
  constexpr int kFlood = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kFlood; ++i) {
    ASSERT_EQ(GetUnknownSession(stub(), absl::StrCat("flood", i)).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  const double flood_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Another code right after: its own budget.
  ASSERT_EQ(GetUnknownSession(stub(), std::string(100, 'y')).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Find({"call failed", "code=INVALID_ARGUMENT"}).size(), 1u) << server().LogTail();
  // A new window for NOT_FOUND: the pending count is reported, then this call's line. The test
  // waits for that event, not for a second to pass (was: a sleep of 1.1 s): it sends NOT_FOUND
  // calls, 50 ms apart, until one is logged; those still in the old window are suppressed and
  // counted like the flood's. GetServerInfo answered means the log holds the call before it.
  int after = 0;
  const bool logged_again = AwaitUntil(
      [&] {
        const std::string id = absl::StrCat("after", after++, "_the_flood");
        if (GetUnknownSession(stub(), id).error_code() != grpc::StatusCode::NOT_FOUND) return false;
        if (!ServerInfo(stub()).ok()) return false;
        return absl::StrContains(server().LogTail(kWholeLog), id);
      },
      std::chrono::seconds(10), std::chrono::milliseconds(50));
  ASSERT_TRUE(logged_again) << server().LogTail();
  ASSERT_EQ(Find({"call failed", "_the_flood"}).size(), 1u) << server().LogTail();

  const std::vector<std::string> logged = Find({"call failed", "code=NOT_FOUND"});
  int64_t suppressed = 0;
  for (const std::string& line : Find({"call failures suppressed", "code=NOT_FOUND"})) {
    const size_t at = line.find("suppressed=");
    ASSERT_NE(at, std::string::npos) << line;
    int64_t n = 0;
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(at + 11), &n)) << line;
    suppressed += n;
  }
  SCOPED_TRACE(absl::StrCat("flood of ", kFlood, " in ", flood_s, " s: ", logged.size(), " lines, ",
                            suppressed, " suppressed"));
  EXPECT_EQ(static_cast<int64_t>(logged.size()) + suppressed, kFlood + after);
  EXPECT_GT(suppressed, 0);
  // At most kPerSecond lines in each one-second window the flood touched, plus the last call.
  EXPECT_LE(static_cast<double>(logged.size()), kPerSecond * (std::floor(flood_s) + 2) + 1);
}

class SilentCallLogTest : public CallLogTest {
 protected:
  std::vector<std::string> Flags() const override { return {"--log_failed_calls_per_second=0"}; }
};

TEST_F(SilentCallLogTest, ZeroTurnsItOff) {
  ASSERT_FALSE(GetUnknownSession(stub(), "0123456789abcdef0123456789abcdef").ok());
  ASSERT_TRUE(ServerInfo(stub()).ok());  // The log has caught up with the call before it.
  EXPECT_FALSE(absl::StrContains(server().LogTail(kWholeLog), "call failed"));
}

TEST(CallLogFlagsTest, AnUnknownLogFormatFailsStartup) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::Start({"--log_format=xml", "--threads=1"}, std::chrono::seconds(10));
  EXPECT_FALSE(started.ok());
}

}  // namespace
}  // namespace attnserve::server_test
