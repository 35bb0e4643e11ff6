// A server process beside a test's own, for tests of two replicas (moving requests, drains):
// started with the test flags plus the caller's, stopped with SIGTERM at the end (it must exit 0).
#ifndef ATTNSERVE_TESTS_SUPPORT_SECOND_SERVER_H_
#define ATTNSERVE_TESTS_SUPPORT_SECOND_SERVER_H_

#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "tests/support/await_until.h"
#include "tests/support/server_process.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {

class SecondServer {
 public:
  explicit SecondServer(std::vector<std::string> extra_flags = {}) {
    std::vector<std::string> flags = {absl::StrCat("--threads=", kBackendThreads),
                                      "--shutdown_grace=10s"};
    for (std::string& flag : extra_flags) flags.push_back(std::move(flag));
    absl::StatusOr<std::unique_ptr<ServerProcess>> started = ServerProcess::Start(flags);
    EXPECT_TRUE(started.ok()) << started.status();
    if (!started.ok()) return;
    process_ = *std::move(started);
    stub_ = v1::AttentionService::NewStub(process_->NewChannel());
  }
  ~SecondServer() {
    if (process_ == nullptr) {
      if (::testing::Test::HasFailure()) std::cerr << "---- stopped server log ----\n" << log_;
      return;
    }
    stub_.reset();
    absl::StatusOr<ExitState> ended = process_->Terminate(std::chrono::seconds(20));
    EXPECT_TRUE(ended.ok() && ended->exited && ended->exit_code == 0);
    if (::testing::Test::HasFailure()) {
      std::cerr << "---- second server log ----\n" << process_->LogTail() << "\n";
    }
  }
  bool ok() const { return stub_ != nullptr; }
  v1::AttentionService::Stub& stub() { return *stub_; }
  std::string address() const { return process_->address(); }
  std::string LogTail() const { return process_->LogTail(20000); }
  // Waits (bounded by `timeout`) until the log holds `text`; true when it does.
  bool AwaitLog(const std::string& text,
                std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    return AwaitUntil([&] { return absl::StrContains(process_->LogTail(1 << 20), text); },
                      timeout);
  }
  // SIGTERM and a bounded wait; the destructor then has nothing left to stop.
  absl::StatusOr<ExitState> Terminate() {
    stub_.reset();
    absl::StatusOr<ExitState> ended = process_->Terminate(std::chrono::seconds(30));
    log_ = process_->LogTail(1 << 20);
    process_.reset();
    return ended;
  }
  const std::string& final_log() const { return log_; }
  ServerProcess& process() { return *process_; }

 private:
  std::unique_ptr<ServerProcess> process_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::string log_;
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_SECOND_SERVER_H_
