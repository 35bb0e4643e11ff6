// A rolling restart that loses nothing (--drain_to, server/fleet/drain.h), with the real balancer:
// three replicas behind HAProxy, each started with --drain_to=<the balancer>; 12 sessions
// configured through the balancer, with decode traffic from 4 client threads; one replica is sent
// SIGTERM. It re-creates its sessions through the balancer (which, once its health checks see
// NOT_SERVING, hashes their ids onto the other replicas), moves every request, and exits 0. Every
// session keeps decoding through the balancer — its calls during the drain are UNAVAILABLE or, on
// the new replica before the import, NOT_FOUND, and are retried — and every output stays bit-exact
// against a twin session (same seed and inputs) configured directly on a replica that is not
// drained.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "tests/support/await_until.h"
#include "tests/support/scale_fixture.h"

namespace attnserve::scale_test {
namespace {

using Clock = std::chrono::steady_clock;
using server_test::ServerProcess;

constexpr int kReplicas = 3;
constexpr int kSessions = 12;
constexpr int kThreads = 4;
constexpr int kPromptTokens = 20;
constexpr int kStepsBeforeDrain = 3;
constexpr int kSteps = 12;  // Decode steps of each session in all.
const char* const kRequests[] = {"a", "b"};

// A session driven through the balancer and its twin on a replica that is not drained.
struct Pair {
  uint64_t seed = 0;
  std::string id;       // Through the balancer.
  std::string replica;  // As Configure named it.
  std::string twin_id;  // On the twin replica.
  std::mt19937_64 rng;
  std::vector<Tensor> prompts;
};

// Calls `call` until it succeeds, retrying the statuses a drain produces (UNAVAILABLE; NOT_FOUND
// while the session or request is not yet on its new replica), for at most 30 s.
grpc::Status WithRetries(const std::function<grpc::Status()>& call, int* retries) {
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(30);
  while (true) {
    grpc::Status status = call();
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::NOT_FOUND;
    if (!retry || Clock::now() > give_up) return status;
    ++*retries;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

using DrainTest = ReplicaSetTest;

TEST_F(DrainTest, DrainedReplicasSessionsContinueBitExactElsewhere) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<int> balancer_port = PickFreePort();
  ASSERT_TRUE(balancer_port.ok()) << balancer_port.status();
  const std::string balancer_address = absl::StrCat("127.0.0.1:", *balancer_port);
  // Every replica drains to the balancer on SIGTERM.
  const auto drain_flags = [&](int i) {
    std::vector<std::string> flags = ReplicaFlags(i);
    flags.push_back(absl::StrCat("--drain_to=", balancer_address));
    flags.push_back("--drain_timeout=30s");
    flags.push_back("--rebalance_period=1s");
    return flags;
  };
  ASSERT_NO_FATAL_FAILURE(StartReplicas(kReplicas, drain_flags));
  const std::vector<std::string> addresses = ReplicaAddresses();
  ASSERT_NO_FATAL_FAILURE(StartBalancer(addresses, *balancer_port));
  // Every replica UP and confirmed by a health check (a fresh balancer counts them UP at once):
  // the balancer's own stats, not a sleep of 1.5 s as this was.
  std::string seen;
  ASSERT_TRUE(AwaitUntil(
      [&] {
        absl::StatusOr<std::map<std::string, BalancerProcess::ServerState>> states =
            balancer_->ServerStates();
        if (!states.ok()) return false;
        seen.clear();
        int confirmed = 0;
        for (const auto& [name, state] : *states) {
          absl::StrAppend(&seen, name, "=", state.status, "/", state.check_status, " ");
          confirmed += state.status == "UP" && state.check_status == "L7OK" ? 1 : 0;
        }
        return confirmed == kReplicas;
      },
      std::chrono::seconds(15), std::chrono::milliseconds(100)))
      << "replicas not all UP behind the balancer: " << seen;
  auto via_balancer = v1::AttentionService::NewStub(ClientChannel(balancer_address));

  // Sessions through the balancer; the victim is the replica of session 0.
  std::vector<Pair> pairs(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    Pair& p = pairs[i];
    p.seed = 500 + i;
    p.rng.seed(p.seed);
    v1::ConfigureResponse configured;
    int retries = 0;
    grpc::Status status = WithRetries(
        [&] {
          grpc::ClientContext context;
          server_test::SetDeadline(context);
          return via_balancer->Configure(&context, server_test::SeedConfigure(SmallGqa(), p.seed),
                                         &configured);
        },
        &retries);
    ASSERT_TRUE(status.ok()) << server_test::Describe(status);
    p.id = configured.session_id();
    p.replica = configured.replica();
  }
  const std::string victim = pairs[0].replica;
  const int victim_index = victim.back() - '0';
  const int twin_index = (victim_index + 1) % kReplicas;
  auto twin_stub = v1::AttentionService::NewStub(ClientChannel(addresses[twin_index]));
  int moved_sessions = 0;
  for (const Pair& p : pairs) moved_sessions += p.replica == victim ? 1 : 0;

  // Twins on the twin replica; both prefilled with the same prompts (one Forward each).
  for (Pair& p : pairs) {
    v1::ConfigureResponse configured;
    grpc::ClientContext context;
    server_test::SetDeadline(context);
    ASSERT_TRUE(
        twin_stub->Configure(&context, server_test::SeedConfigure(SmallGqa(), p.seed), &configured)
            .ok());
    p.twin_id = configured.session_id();
    v1::ForwardRequest forward, twin_forward;
    forward.set_session_id(p.id);
    twin_forward.set_session_id(p.twin_id);
    for (const char* request_id : kRequests) {
      const Tensor prompt = server_test::RandomHidden(kPromptTokens, 64, p.rng);
      *forward.add_items() = server_test::MakeForwardItem(request_id, prompt);
      *twin_forward.add_items() = server_test::MakeForwardItem(request_id, prompt);
    }
    v1::ForwardResponse forwarded, twin_forwarded;
    ASSERT_TRUE(server_test::Forward(*via_balancer, forward, &forwarded).ok());
    ASSERT_TRUE(server_test::Forward(*twin_stub, twin_forward, &twin_forwarded).ok());
  }

  // Decode traffic: each thread drives its sessions in turn, one Decode of both requests per step,
  // the same inputs to the twin; outputs must match bit for bit.
  std::atomic<int> steps_done{0};
  std::atomic<int> retries_total{0};
  absl::Mutex mu;
  std::vector<std::string> failures;
  // Steps [first, first + count) of every session, from kThreads threads.
  const auto traffic = [&](int first, int count) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t, first, count] {
        for (int step = first; step < first + count; ++step) {
          for (int i = t; i < kSessions; i += kThreads) {
            Pair& p = pairs[i];
            v1::DecodeRequest request, twin_request;
            request.set_session_id(p.id);
            twin_request.set_session_id(p.twin_id);
            for (const char* request_id : kRequests) {
              const Tensor hidden = server_test::RandomHidden(1, 64, p.rng);
              *request.add_items() = server_test::MakeDecodeItem(request_id, hidden);
              *twin_request.add_items() = server_test::MakeDecodeItem(request_id, hidden);
            }
            v1::DecodeResponse response, twin_response;
            int retries = 0;
            grpc::Status status = WithRetries(
                [&] { return server_test::Decode(*via_balancer, request, &response); }, &retries);
            retries_total += retries;
            grpc::Status twin_status =
                server_test::Decode(*twin_stub, twin_request, &twin_response);
            std::string failure;
            if (!status.ok() || !twin_status.ok()) {
              failure =
                  absl::StrCat("session ", i, " step ", step, ": ", server_test::Describe(status),
                               " / twin ", server_test::Describe(twin_status));
            } else {
              for (int r = 0; r < 2 && failure.empty(); ++r) {
                if (response.results(r).output().data() !=
                    twin_response.results(r).output().data()) {
                  failure = absl::StrCat("session ", i, " (on ", p.replica, ") step ", step,
                                         ": output differs from its twin's");
                }
                if (response.results(r).sequence_length() != kPromptTokens + step + 1) {
                  failure = absl::StrCat("session ", i, " step ", step, ": sequence_length ",
                                         response.results(r).sequence_length());
                }
              }
            }
            if (!failure.empty()) {
              absl::MutexLock lock(&mu);
              failures.push_back(failure);
              return;
            }
          }
          ++steps_done;
        }
      });
    }
    return threads;
  };
  std::vector<std::thread> threads = traffic(0, kSteps);

  // SIGTERM the victim once every thread has decoded a few steps; it must drain and exit 0.
  AwaitUntil([&] { return steps_done.load() >= kThreads * kStepsBeforeDrain; },
             std::chrono::seconds(60));
  absl::StatusOr<server_test::ExitState> ended =
      replicas_[victim_index]->Terminate(std::chrono::seconds(45));
  for (std::thread& thread : threads) thread.join();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  const std::string victim_log = replicas_[victim_index]->LogTail(20000);
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_EQ(steps_done.load(), kThreads * kSteps);
  ASSERT_GE(moved_sessions, 1);
  EXPECT_NE(
      victim_log.find(absl::StrCat("drain: done: ", moved_sessions, " sessions moved, 0 lost; ",
                                   2 * moved_sessions, " requests moved, 0 lost")),
      std::string::npos)
      << victim_log;

  // Every session that was on the victim is now on another replica, under its own id.
  for (const Pair& p : pairs) {
    if (p.replica != victim) continue;
    int found = 0;
    for (int i = 0; i < kReplicas; ++i) {
      if (i == victim_index) continue;
      auto stub = v1::AttentionService::NewStub(ClientChannel(addresses[i]));
      v1::GetSessionRequest get;
      get.set_session_id(p.id);
      v1::GetSessionResponse got;
      grpc::ClientContext context;
      server_test::SetDeadline(context);
      if (stub->GetSession(&context, get, &got).ok()) {
        ++found;
        EXPECT_EQ(got.session().requests_size(), 2);
      }
    }
    EXPECT_EQ(found, 1) << "session " << p.id << " should live on exactly one other replica";
  }
  // The victim back under its name and address (a rolling restart): the balancer hashes its former
  // ids to it again, and the replicas that took them over move them back
  // (server/fleet/session_rebalancer.h); traffic goes on throughout, bit-exact against the twins.
  std::vector<std::string> back_flags = drain_flags(victim_index);  // --replica_id=<victim>.
  back_flags.push_back(absl::StrCat("--listen=", addresses[victim_index]));
  absl::StatusOr<std::unique_ptr<ServerProcess>> back = ServerProcess::Start(back_flags);
  ASSERT_TRUE(back.ok()) << back.status();
  replicas_[victim_index] = *std::move(back);
  threads = traffic(kSteps, kSteps);
  for (std::thread& thread : threads) thread.join();
  EXPECT_TRUE(failures.empty()) << absl::StrJoin(failures, "\n");
  EXPECT_EQ(steps_done.load(), 2 * kThreads * kSteps);
  auto on_victim = v1::AttentionService::NewStub(ClientChannel(addresses[victim_index]));
  int home = 0;
  AwaitUntil(
      [&] {
        home = 0;
        for (const Pair& p : pairs) {
          if (p.replica != victim) continue;
          v1::GetSessionRequest get;
          get.set_session_id(p.id);
          v1::GetSessionResponse got;
          grpc::ClientContext context;
          server_test::SetDeadline(context);
          if (on_victim->GetSession(&context, get, &got).ok() &&
              got.session().requests_size() == 2) {
            ++home;
          }
        }
        return home == moved_sessions;
      },
      std::chrono::seconds(30), std::chrono::milliseconds(200));
  EXPECT_EQ(home, moved_sessions) << "the sessions went back to the restarted replica";

  std::cerr << "drain_test: " << moved_sessions << " of " << kSessions << " sessions moved off "
            << victim << ", " << retries_total.load() << " client retries, "
            << std::chrono::duration<double>(Clock::now() - start).count() << " s\n";
}

}  // namespace
}  // namespace attnserve::scale_test
