// Replicas behind the real balancer (issue 11; docs/deploy.md): three attnserve_server processes
// and HAProxy with deploy/haproxy/haproxy.cfg itself, all on 127.0.0.1.
//
//  - Affinity: 50 sessions driven by 10 client threads through the balancer with the real client
//    code (CreateSecureChannel's session interceptor, AddSessionMetadata for streams); every call
//    succeeds, and each replica's own ListSessions (a direct connection, past the balancer) shows
//    every session on exactly one replica — the one Configure named — with exactly the tokens and
//    decode steps its client sent. A call that reached another replica would have failed
//    NOT_FOUND there, and a session configured twice would show twice.
//  - Failure: one replica is SIGKILLed mid-traffic. The sessions of the others go on bit-exact
//    (against the in-process engine, the same computation with the same seeds and inputs); the
//    lost ones fail UNAVAILABLE (before the balancer's health check notices) or NOT_FOUND (after),
//    and their clients configure anew and go on, bit-exact too.
//  - Health checks speak grpc.health.v1: a "replica" that accepts TCP but is no gRPC server (a
//    replica's /metrics port) is DOWN by a layer-7 check while the real ones are UP.
//  - Configure adopts the client's x-attnserve-session id (the premise of the hashing), refuses a
//    malformed one and a live one.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/common/session_routing.h"
#include "tests/support/await_until.h"
#include "tests/support/scale_fixture.h"

namespace attnserve::scale_test {
namespace {

using server_test::Describe;
using server_test::kBackendThreads;
using server_test::ReferenceSession;
using server_test::ServerProcess;
namespace v1 = ::attnserve::v1;
using Clock = std::chrono::steady_clock;

constexpr int kReplicas = 3;
constexpr int kSessions = 50;
constexpr int kClientThreads = 10;
constexpr int kPromptTokens = 8;
const char* const kRequests[] = {"a", "b"};  // Two requests per session, decoded together.

absl::Status FromGrpc(const std::string& what, const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// A mismatch is DATA_LOSS, a code the server never answers, so it cannot pass for an RPC error.
absl::Status FromAssertion(const std::string& what, const ::testing::AssertionResult& result) {
  if (result) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(what, ": ", result.message()));
}

// One client's session and its in-process twin, driven by one thread at a time.
struct ClientSession {
  int index = 0;
  uint64_t seed = 0;
  std::string id;
  std::string replica;  // As Configure named it.
  std::unique_ptr<ReferenceSession> reference;
  std::mt19937_64 rng;
  int64_t length = 0;        // Tokens in each of its requests.
  int64_t decode_steps = 0;  // Decode steps of all its requests.
  int generation = 0;        // How many times it was configured.

  // Configure through `stub` (the interceptor draws the id), then a Forward of both requests.
  absl::Status Start(v1::AttentionService::Stub& stub) {
    seed = 1000 + index * 16 + generation;
    ++generation;
    rng.seed(seed);
    length = 0;
    decode_steps = 0;
    v1::ConfigureResponse configured;
    grpc::ClientContext context;
    server_test::SetDeadline(context);
    const grpc::Status status =
        stub.Configure(&context, server_test::SeedConfigure(SmallGqa(), seed), &configured);
    if (!status.ok()) return FromGrpc("Configure", status);
    id = configured.session_id();
    replica = configured.replica();
    absl::StatusOr<std::unique_ptr<ReferenceSession>> made =
        ReferenceSession::Create(SmallGqa(), seed);
    if (!made.ok()) return made.status();
    reference = *std::move(made);

    v1::ForwardRequest request;
    request.set_session_id(id);
    std::vector<ReferenceSession::ForwardInput> inputs;
    for (const char* request_id : kRequests) {
      inputs.push_back({request_id, server_test::RandomHidden(kPromptTokens, 64, rng), {}});
      *request.add_items() = server_test::MakeForwardItem(request_id, inputs.back().hidden);
    }
    v1::ForwardResponse response;
    if (grpc::Status s = server_test::Forward(stub, request, &response); !s.ok()) {
      return FromGrpc("Forward", s);
    }
    absl::StatusOr<std::vector<Tensor>> expected = reference->Forward(inputs);
    if (!expected.ok()) return expected.status();
    for (int i = 0; i < 2; ++i) {
      if (absl::Status s =
              FromAssertion("Forward output",
                            server_test::SameBytes(response.results(i).output(), (*expected)[i]));
          !s.ok()) {
        return s;
      }
    }
    length = kPromptTokens;
    return absl::OkStatus();
  }

  // The next decode step of both requests, as the request to send and the twin's expectation.
  absl::StatusOr<std::pair<v1::DecodeRequest, std::vector<Tensor>>> NextStep() {
    v1::DecodeRequest request;
    request.set_session_id(id);
    std::vector<ReferenceSession::DecodeInput> inputs;
    for (const char* request_id : kRequests) {
      inputs.push_back({request_id, server_test::RandomHidden(1, 64, rng), std::nullopt});
      *request.add_items() = server_test::MakeDecodeItem(request_id, inputs.back().hidden);
    }
    absl::StatusOr<std::vector<Tensor>> expected = reference->Decode(inputs);
    if (!expected.ok()) return expected.status();
    return std::make_pair(std::move(request), *std::move(expected));
  }

  absl::Status CheckStep(const v1::DecodeResponse& response, const std::vector<Tensor>& expected) {
    if (response.results_size() != 2) {
      return absl::DataLossError(absl::StrCat("Decode: ", response.results_size(), " results"));
    }
    for (int i = 0; i < 2; ++i) {
      if (absl::Status s = FromAssertion(
              "Decode output", server_test::SameBytes(response.results(i).output(), expected[i]));
          !s.ok()) {
        return s;
      }
    }
    ++length;
    decode_steps += 2;
    return absl::OkStatus();
  }

  // `unary` Decode calls, then `streamed` steps over one DecodeStream (tagged by the caller's
  // AddSessionMetadata, as attnctl and attnbench do). A failed call ends the run with its status;
  // the twin has then advanced past the server, so the session must be configured anew.
  absl::Status Decode(v1::AttentionService::Stub& stub, int unary, int streamed) {
    for (int step = 0; step < unary; ++step) {
      absl::StatusOr<std::pair<v1::DecodeRequest, std::vector<Tensor>>> next = NextStep();
      if (!next.ok()) return next.status();
      v1::DecodeResponse response;
      if (grpc::Status s = server_test::Decode(stub, next->first, &response); !s.ok()) {
        return FromGrpc("Decode", s);
      }
      if (absl::Status s = CheckStep(response, next->second); !s.ok()) return s;
    }
    if (streamed == 0) return absl::OkStatus();
    grpc::ClientContext context;
    server_test::SetDeadline(context);
    AddSessionMetadata(&context, id);
    std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>> stream =
        stub.DecodeStream(&context);
    absl::Status result = absl::OkStatus();
    for (int step = 0; step < streamed && result.ok(); ++step) {
      absl::StatusOr<std::pair<v1::DecodeRequest, std::vector<Tensor>>> next = NextStep();
      if (!next.ok()) return next.status();
      v1::DecodeResponse response;
      if (!stream->Write(next->first) || !stream->Read(&response)) {
        result = absl::UnknownError("stream broken");  // Finish() below says why.
        break;
      }
      result = CheckStep(response, next->second);
    }
    stream->WritesDone();
    const grpc::Status finished = stream->Finish();
    if (!finished.ok()) return FromGrpc("DecodeStream", finished);
    return result;
  }
};

// Runs `work(session, stub)` for every session, kClientThreads threads each with its own channel
// to the balancer and its share of the sessions; returns each session's status.
std::vector<absl::Status> ForEachSession(
    const std::string& balancer, std::vector<ClientSession>& sessions,
    const std::function<absl::Status(ClientSession&, v1::AttentionService::Stub&)>& work) {
  std::vector<absl::Status> results(sessions.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < kClientThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<v1::AttentionService::Stub> stub =
          v1::AttentionService::NewStub(ClientChannel(balancer));
      for (size_t i = t; i < sessions.size(); i += kClientThreads) {
        results[i] = work(sessions[i], *stub);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

// Every session a replica holds, with its requests, asked past the balancer.
absl::StatusOr<std::vector<v1::SessionInfo>> ListDirect(ServerProcess& replica) {
  std::unique_ptr<v1::AttentionService::Stub> stub =
      v1::AttentionService::NewStub(replica.NewChannel());
  grpc::ClientContext context;
  server_test::SetDeadline(context);
  v1::ListSessionsResponse response;
  const grpc::Status status = stub->ListSessions(&context, v1::ListSessionsRequest(), &response);
  if (!status.ok()) return FromGrpc("ListSessions", status);
  // ListSessions leaves out the requests; GetSession has them.
  std::vector<v1::SessionInfo> sessions;
  for (const v1::SessionInfo& listed : response.sessions()) {
    grpc::ClientContext get_context;
    server_test::SetDeadline(get_context);
    v1::GetSessionRequest request;
    request.set_session_id(listed.session_id());
    v1::GetSessionResponse got;
    const grpc::Status get_status = stub->GetSession(&get_context, request, &got);
    if (!get_status.ok()) return FromGrpc("GetSession", get_status);
    sessions.push_back(got.session());
  }
  return sessions;
}

// Polls the balancer's stats until `ready` holds for its server states; false after `timeout`.
bool WaitForStates(
    const BalancerProcess& balancer, std::chrono::seconds timeout,
    const std::function<bool(const std::map<std::string, BalancerProcess::ServerState>&)>& ready,
    std::string* last_seen) {
  return AwaitUntil(
      [&] {
        absl::StatusOr<std::map<std::string, BalancerProcess::ServerState>> states =
            balancer.ServerStates();
        if (!states.ok()) {
          *last_seen = states.status().ToString();
          return false;
        }
        last_seen->clear();
        for (const auto& [name, state] : *states) {
          absl::StrAppend(last_seen, name, "=", state.status, "/", state.check_status, " ");
        }
        return ready(*states);
      },
      std::chrono::duration_cast<std::chrono::milliseconds>(timeout),
      std::chrono::milliseconds(100));
}

bool AllUp(const std::map<std::string, BalancerProcess::ServerState>& states, int count) {
  int up = 0;
  for (const auto& [name, state] : states) up += state.status == "UP" ? 1 : 0;
  return up == count;
}

// Within 15 s the balancer counts replica-0 and replica-1 UP and its third server, replica-2,
// DOWN; else a failure naming the states it saw.
::testing::AssertionResult TwoUpAndReplica2Down(const BalancerProcess& balancer) {
  std::string seen;
  const bool reached = WaitForStates(
      balancer, std::chrono::seconds(15),
      [](const auto& states) {
        return AllUp(states, 2) && states.count("replica-2") &&
               states.at("replica-2").status == "DOWN";
      },
      &seen);
  if (reached) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << seen;
}

using ScaleTest = ReplicaSetTest;

TEST_F(ScaleTest, SessionsStayOnTheirReplicaAndSurviveTheLossOfAnother) {
  const Clock::time_point start = Clock::now();
  ASSERT_NO_FATAL_FAILURE(StartReplicas(kReplicas));
  ASSERT_NO_FATAL_FAILURE(StartBalancer(ReplicaAddresses()));
  std::string seen;
  ASSERT_TRUE(WaitForStates(
      *balancer_, std::chrono::seconds(15),
      [](const auto& states) { return AllUp(states, kReplicas); }, &seen))
      << "replicas not all UP behind the balancer: " << seen;

  // 1. Traffic through the balancer: configure, prefill, 3 unary and 3 streamed decode steps.
  std::vector<ClientSession> sessions(kSessions);
  for (int i = 0; i < kSessions; ++i) sessions[i].index = i;
  std::vector<absl::Status> results =
      ForEachSession(balancer_->address(), sessions, [](ClientSession& s, auto& stub) {
        if (absl::Status status = s.Start(stub); !status.ok()) return status;
        return s.Decode(stub, 3, 3);
      });
  for (int i = 0; i < kSessions; ++i) ASSERT_TRUE(results[i].ok()) << i << ": " << results[i];

  // 2. Each replica's own view, past the balancer.
  std::map<std::string, int> holder;  // session id -> replica index
  std::vector<int> held(kReplicas, 0);
  for (int r = 0; r < kReplicas; ++r) {
    absl::StatusOr<std::vector<v1::SessionInfo>> listed = ListDirect(*replicas_[r]);
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const v1::SessionInfo& info : *listed) {
      EXPECT_TRUE(holder.emplace(info.session_id(), r).second)
          << "session " << info.session_id() << " on two replicas";
      ++held[r];
    }
  }
  ASSERT_EQ(holder.size(), static_cast<size_t>(kSessions)) << "sessions configured twice or lost";
  for (int r = 0; r < kReplicas; ++r) {
    EXPECT_GE(held[r], 1) << "replica-" << r << " got no session: the balancer does not spread";
  }
  for (const ClientSession& s : sessions) {
    ASSERT_TRUE(holder.count(s.id)) << s.id;
    EXPECT_EQ(s.replica, absl::StrCat("replica-", holder[s.id]))
        << "Configure named another replica than the one holding the session";
  }
  for (int r = 0; r < kReplicas; ++r) {
    absl::StatusOr<std::vector<v1::SessionInfo>> listed = ListDirect(*replicas_[r]);
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const v1::SessionInfo& info : *listed) {
      const auto it = std::find_if(sessions.begin(), sessions.end(), [&](const ClientSession& s) {
        return s.id == info.session_id();
      });
      ASSERT_NE(it, sessions.end());
      // Every call of the session was counted here, so all of them reached this replica.
      EXPECT_EQ(info.batching().decode_steps(), it->decode_steps) << info.session_id();
      ASSERT_EQ(info.requests_size(), 2);
      for (const v1::RequestInfo& request : info.requests()) {
        EXPECT_EQ(request.sequence_length(), it->length) << info.session_id();
      }
    }
  }

  // 3. Kill the replica holding the most sessions while the clients keep going.
  const int victim = static_cast<int>(std::max_element(held.begin(), held.end()) - held.begin());
  const std::string victim_name = absl::StrCat("replica-", victim);
  replicas_[victim]->Signal(SIGKILL);
  std::atomic<int> unavailable{0}, not_found{0};
  results = ForEachSession(balancer_->address(), sessions, [&](ClientSession& s, auto& stub) {
    absl::Status status = s.Decode(stub, 2, 2);
    if (s.replica != victim_name) return status;  // Must be fine: checked below.
    if (status.ok()) return absl::InternalError("a lost session still answered");
    if (status.code() == absl::StatusCode::kUnavailable) {
      ++unavailable;
    } else if (status.code() == absl::StatusCode::kNotFound &&
               absl::StrContains(status.message(), "not found")) {
      ++not_found;
    } else {
      return absl::InternalError(
          absl::StrCat("unclear status for a lost session: ", status.ToString()));
    }
    // The client's way on: a new session (a fresh id each try; until the balancer's health check
    // has taken the dead replica out, an id that hashes to it fails UNAVAILABLE again).
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(20);
    while (true) {
      status = s.Start(stub);
      if (status.ok() || status.code() != absl::StatusCode::kUnavailable ||
          Clock::now() > give_up) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!status.ok()) return status;
    if (s.replica == victim_name) return absl::InternalError("re-configured on the dead replica");
    return s.Decode(stub, 2, 2);
  });
  int lost = 0;
  for (int i = 0; i < kSessions; ++i) {
    EXPECT_TRUE(results[i].ok()) << "session " << i << ": " << results[i];
    lost += sessions[i].generation > 1 ? 1 : 0;
  }
  EXPECT_EQ(lost, held[victim]) << "only the dead replica's sessions may be lost";
  EXPECT_EQ(unavailable + not_found, held[victim]);
  std::cout << "killed " << victim_name << " holding " << held[victim] << " of " << kSessions
            << " sessions (held per replica: " << held[0] << ", " << held[1] << ", " << held[2]
            << "); their first call after the kill: " << unavailable << " UNAVAILABLE, "
            << not_found << " NOT_FOUND\n";

  // 4. The balancer took it out by its health check; a lost id is NOT_FOUND with its reason.
  ASSERT_TRUE(WaitForStates(
      *balancer_, std::chrono::seconds(10),
      [&](const auto& states) {
        return states.count(victim_name) && states.at(victim_name).status == "DOWN" &&
               AllUp(states, kReplicas - 1);
      },
      &seen))
      << seen;
  // 5. The survivors hold exactly the surviving and the re-configured sessions, at their lengths.
  std::set<std::string> expected_ids;
  for (const ClientSession& s : sessions) expected_ids.insert(s.id);
  std::set<std::string> listed_ids;
  for (int r = 0; r < kReplicas; ++r) {
    if (r == victim) continue;
    absl::StatusOr<std::vector<v1::SessionInfo>> listed = ListDirect(*replicas_[r]);
    ASSERT_TRUE(listed.ok()) << listed.status();
    for (const v1::SessionInfo& info : *listed) {
      listed_ids.insert(info.session_id());
      const auto it = std::find_if(sessions.begin(), sessions.end(), [&](const ClientSession& s) {
        return s.id == info.session_id();
      });
      ASSERT_NE(it, sessions.end()) << "unexpected session " << info.session_id();
      EXPECT_EQ(it->replica, absl::StrCat("replica-", r));
      EXPECT_EQ(info.batching().decode_steps(), it->decode_steps) << info.session_id();
      for (const v1::RequestInfo& request : info.requests()) {
        EXPECT_EQ(request.sequence_length(), it->length) << info.session_id();
      }
    }
  }
  EXPECT_EQ(listed_ids, expected_ids);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::cout << "scale test: " << kReplicas << " replicas, " << kSessions << " sessions, "
            << kClientThreads << " client threads, " << seconds << " s\n";
}

TEST_F(ScaleTest, LostSessionIsNotFoundByNameOnceItsReplicaIsOut) {
  ASSERT_NO_FATAL_FAILURE(StartReplicas(2));
  ASSERT_NO_FATAL_FAILURE(
      StartBalancer({replicas_[0]->address(), replicas_[1]->address(), "127.0.0.1:1"}));
  // At start HAProxy counts every server in until its checks fail: wait for replica-2's DOWN.
  ASSERT_TRUE(TwoUpAndReplica2Down(*balancer_));
  std::unique_ptr<v1::AttentionService::Stub> stub =
      v1::AttentionService::NewStub(ClientChannel(balancer_->address()));
  // Sessions until one lands on replica-1, which is then killed.
  std::vector<ClientSession> sessions(1);
  for (int attempt = 0; attempt < 64; ++attempt) {
    sessions[0].index = attempt;
    const absl::Status started = sessions[0].Start(*stub);
    ASSERT_TRUE(started.ok()) << started;
    if (sessions[0].replica == "replica-1") break;
  }
  ASSERT_EQ(sessions[0].replica, "replica-1");
  replicas_[1]->Signal(SIGKILL);
  std::string seen;
  ASSERT_TRUE(WaitForStates(
      *balancer_, std::chrono::seconds(10),
      [](const auto& states) {
        // "UP 1/2" is still in the hash: wait for DOWN.
        return states.count("replica-1") && states.at("replica-1").status == "DOWN";
      },
      &seen))
      << seen;
  v1::GetSessionRequest request;
  request.set_session_id(sessions[0].id);
  v1::GetSessionResponse response;
  grpc::ClientContext context;
  server_test::SetDeadline(context);
  const grpc::Status status = stub->GetSession(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << Describe(status);
  EXPECT_NE(status.error_message().find(sessions[0].id), std::string::npos) << Describe(status);
}

TEST_F(ScaleTest, HealthChecksAskGrpcHealthNotJustTcp) {
  ASSERT_NO_FATAL_FAILURE(StartReplicas(2));
  // A third "replica" that accepts TCP but speaks no gRPC: a replica's own /metrics HTTP port.
  const std::string metrics_port_file = replicas_[0]->temp_dir() + "/metrics_port";
  std::vector<std::string> flags = ReplicaFlags(2);
  flags.push_back("--metrics_address=127.0.0.1:0");
  flags.push_back("--metrics_port_file=" + metrics_port_file);
  absl::StatusOr<std::unique_ptr<ServerProcess>> with_metrics = ServerProcess::Start(flags);
  ASSERT_TRUE(with_metrics.ok()) << with_metrics.status();
  replicas_.push_back(*std::move(with_metrics));
  std::ifstream port_in(metrics_port_file);
  int metrics_port = 0;
  ASSERT_TRUE(port_in >> metrics_port) << "no port in " << metrics_port_file;
  ASSERT_NO_FATAL_FAILURE(StartBalancer({replicas_[0]->address(), replicas_[1]->address(),
                                         absl::StrCat("127.0.0.1:", metrics_port)}));
  ASSERT_TRUE(TwoUpAndReplica2Down(*balancer_));
  std::map<std::string, BalancerProcess::ServerState> states = *balancer_->ServerStates();
  EXPECT_EQ(states["replica-0"].check_status, "L7OK");
  EXPECT_EQ(states["replica-1"].check_status, "L7OK");
  // Connected, then no SERVING answer: a layer-7 failure (L7RSP / L7TOUT), not a layer-4 one.
  EXPECT_TRUE(absl::StartsWith(states["replica-2"].check_status, "L7"))
      << states["replica-2"].check_status;
}

TEST_F(ScaleTest, ConfigureAdoptsTheClientsSessionId) {
  ASSERT_NO_FATAL_FAILURE(StartReplicas(1));
  std::unique_ptr<v1::AttentionService::Stub> stub =
      v1::AttentionService::NewStub(replicas_[0]->NewChannel());  // No interceptor: by hand.
  const auto configure = [&](const std::string& header, v1::ConfigureResponse* response) {
    grpc::ClientContext context;
    server_test::SetDeadline(context);
    if (!header.empty()) context.AddMetadata(kSessionMetadataKey, header);
    return stub->Configure(&context, server_test::SeedConfigure(SmallGqa(), 7), response);
  };
  const std::string id = NewClientSessionId();
  v1::ConfigureResponse response;
  grpc::Status status = configure(id, &response);
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(response.session_id(), id);
  EXPECT_EQ(response.replica(), "replica-0");
  status = configure(id, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << Describe(status);
  status = configure("not-an-id", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  status = configure(absl::AsciiStrToUpper(NewClientSessionId()), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  status = configure("", &response);  // Without the header the server draws the id.
  ASSERT_TRUE(status.ok()) << Describe(status);
  EXPECT_EQ(response.session_id().size(), 32u);
  EXPECT_NE(response.session_id(), id);
  absl::StatusOr<v1::GetServerInfoResponse> info = server_test::ServerInfo(*stub);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->replica(), "replica-0");
  EXPECT_EQ(info->sessions(), 2);
}

}  // namespace
}  // namespace attnserve::scale_test
