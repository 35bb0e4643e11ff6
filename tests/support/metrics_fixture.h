// The fixture of the tests that read the server's Prometheus endpoint: ServerTest with
// --metrics_address=127.0.0.1:0, the bound port read from --metrics_port_file in SetUp (it is
// written before the gRPC port, so it is there once the server is SERVING).
#ifndef ATTNSERVE_TESTS_SUPPORT_METRICS_FIXTURE_H_
#define ATTNSERVE_TESTS_SUPPORT_METRICS_FIXTURE_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/support/http_get.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {

class MetricsServerTest : public ServerTest {
 protected:
  MetricsServerTest()
      : metrics_port_file_(absl::StrCat(::testing::TempDir(), "attnserve_metrics_port_", getpid(),
                                        "_", next_metrics_id_++)) {}

  // The metrics flags, then ServerFlags().
  std::vector<std::string> ExtraFlags() const override {
    std::vector<std::string> flags = {"--metrics_address=127.0.0.1:0",
                                      "--metrics_port_file=" + metrics_port_file_};
    for (std::string& flag : ServerFlags()) flags.push_back(std::move(flag));
    return flags;
  }
  // The test's own flags.
  virtual std::vector<std::string> ServerFlags() const { return {}; }

  void SetUp() override {
    ServerTest::SetUp();
    if (HasFatalFailure()) return;
    std::ifstream in(metrics_port_file_);
    ASSERT_TRUE(in >> metrics_port_) << "no port in " << metrics_port_file_;
    ASSERT_GT(metrics_port_, 0);
  }
  void TearDown() override {
    ServerTest::TearDown();
    std::remove(metrics_port_file_.c_str());
  }

  static inline int next_metrics_id_ = 0;
  const std::string metrics_port_file_;
  int metrics_port_ = 0;
};

}  // namespace attnserve::server_test

#endif  // ATTNSERVE_TESTS_SUPPORT_METRICS_FIXTURE_H_
