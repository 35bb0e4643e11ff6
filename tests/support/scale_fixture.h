// The fixture of the scale tests (tests/scale/): replicas of the real attnserve_server behind the
// real balancer (HAProxy, balancer_process.h), the small model they serve, and the client's channel
// through the balancer. On failure TearDown prints the balancer's and every replica's log.
#ifndef ATTNSERVE_TESTS_SUPPORT_SCALE_FIXTURE_H_
#define ATTNSERVE_TESTS_SUPPORT_SCALE_FIXTURE_H_

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/common/channel_security.h"
#include "kernels/spec/layer_spec.h"
#include "tests/support/balancer_process.h"
#include "tests/support/server_process.h"
#include "tests/support/service_test_util.h"

namespace attnserve::scale_test {

// The layer every scale test configures: GQA, d_model 64, 4 heads over 2 KV heads of 16, RoPE.
inline LayerSpec SmallGqa() {
  LayerSpec spec;
  spec.variant = AttentionVariant::kGQA;
  spec.d_model = 64;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.head_dim = 16;
  spec.rope = RopeLayout::kHalf;
  return spec;
}

// A client channel as attnctl makes it (CreateSecureChannel: its interceptor tags every unary
// call with x-attnserve-session), receiving up to 64 MiB.
inline std::shared_ptr<grpc::Channel> ClientChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return CreateSecureChannel(address, ChannelSecurity{}, args);
}

// Every replica's flags: the reference's engine thread count (bit-exact comparison needs the same
// work split), a name to be found by ("replica-<index>") and a short shutdown grace.
inline std::vector<std::string> ReplicaFlags(int index) {
  return {absl::StrCat("--threads=", server_test::kBackendThreads),
          absl::StrCat("--replica_id=replica-", index), "--shutdown_grace=5s"};
}

class ReplicaSetTest : public ::testing::Test {
 protected:
  // Starts `count` replicas, replica i with flags(i).
  void StartReplicas(int count, const std::function<std::vector<std::string>(int)>& flags =
                                    ReplicaFlags) {
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<std::unique_ptr<server_test::ServerProcess>> started =
          server_test::ServerProcess::Start(flags(i));
      ASSERT_TRUE(started.ok()) << started.status();
      replicas_.push_back(*std::move(started));
    }
  }

  std::vector<std::string> ReplicaAddresses() const {
    std::vector<std::string> addresses;
    for (const auto& replica : replicas_) addresses.push_back(replica->address());
    return addresses;
  }

  // The balancer in front of `addresses`, listening on `listen_port` (> 0) or a fresh port.
  void StartBalancer(const std::vector<std::string>& addresses, int listen_port = 0) {
    absl::StatusOr<std::unique_ptr<BalancerProcess>> started =
        BalancerProcess::Start(addresses, std::chrono::seconds(20), listen_port);
    ASSERT_TRUE(started.ok()) << started.status();
    balancer_ = *std::move(started);
  }

  void TearDown() override {
    if (HasFailure()) {
      if (balancer_ != nullptr) std::cerr << "---- haproxy log ----\n" << balancer_->LogTail();
      for (const auto& replica : replicas_) {
        if (replica != nullptr) {
          std::cerr << "---- replica log (" << replica->address() << ") ----\n"
                    << replica->LogTail(3000);
        }
      }
    }
    balancer_.reset();
    replicas_.clear();
  }

  std::vector<std::unique_ptr<server_test::ServerProcess>> replicas_;
  std::unique_ptr<BalancerProcess> balancer_;
};

}  // namespace attnserve::scale_test

#endif  // ATTNSERVE_TESTS_SUPPORT_SCALE_FIXTURE_H_
