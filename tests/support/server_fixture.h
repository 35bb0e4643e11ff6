// The gtest fixture of the server tests: one server process per test, started in SetUp with the
// flags the test class chooses, and stopped in TearDown with SIGTERM (the test fails unless it
// exits 0 within kStopTimeout; it is SIGKILLed after that bound).
#ifndef ATTNSERVE_TESTS_SUPPORT_SERVER_FIXTURE_H_
#define ATTNSERVE_TESTS_SUPPORT_SERVER_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "tests/support/server_process.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {

class ServerTest : public ::testing::Test {
 protected:
  static constexpr std::chrono::seconds kStopTimeout{20};

  // Flags every test server gets: the engine's thread count matches the in-process reference
  // (kBackendThreads), and a short shutdown grace keeps TearDown fast.
  static std::vector<std::string> BaseFlags() {
    return {absl::StrCat("--threads=", kBackendThreads), "--shutdown_grace=10s"};
  }
  // Test-specific flags, appended after BaseFlags() (a later flag wins).
  virtual std::vector<std::string> ExtraFlags() const { return {}; }

  void SetUp() override {
    std::vector<std::string> flags = BaseFlags();
    for (std::string& flag : ExtraFlags()) flags.push_back(std::move(flag));
    absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(flags);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
    channel_ = server_->NewChannel();
    stub_ = v1::AttentionService::NewStub(channel_);
  }

  void TearDown() override {
    if (server_ == nullptr) return;
    stub_.reset();
    channel_.reset();
    if (!stopped_) {
      absl::StatusOr<ExitState> ended = server_->Terminate(kStopTimeout);
      EXPECT_TRUE(ended.ok()) << ended.status();
      if (ended.ok()) {
        EXPECT_TRUE(ended->exited && ended->exit_code == 0)
            << "server after SIGTERM: " << ended->ToString();
      }
    }
    if (HasFailure()) {
      std::cerr << "---- server log (" << server_->address() << ") ----\n"
                << server_->LogTail() << "\n---- end of server log ----\n";
    }
    server_.reset();
  }

  v1::AttentionService::Stub& stub() { return *stub_; }
  ServerProcess& server() { return *server_; }

  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  bool stopped_ = false;  // Set by tests that stop the server themselves.
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_SERVER_FIXTURE_H_
