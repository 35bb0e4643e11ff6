// What a drain (--drain_to, server/fleet/drain.h) must not lose: every request an OK answered is
// on the peer after SIGTERM, or its call was refused UNAVAILABLE (issue 21, items 5 and 6: a
// Forward running at the signal, an ImportRequest whose pages came after it); and the owner of a
// session travels with it, a drain to a peer that cannot keep owners being refused (item 10).
// The peer drains a replica as it would in a rolling restart, so each test runs two servers.
#include <openssl/sha.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/http_get.h"
#include "tests/support/second_server.h"
#include "tests/support/service_test_util.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;
using ::testing::HasSubstr;

LayerSpec Spec() { return FindSpec("gqa2_half_bias_hd16_theta5e5").spec; }

// Waits (bounded: 20 s) until the pool's used bytes pass `above`; true when they do.
bool AwaitPoolAbove(v1::AttentionService::Stub& stub, int64_t above) {
  return AwaitUntil([&] { return PoolUsed(stub) > above; }, std::chrono::seconds(20));
}

// The requests of `session` at `stub` with their lengths, or the call's error; `token` (when
// not empty) authenticates the call.
absl::StatusOr<std::map<std::string, int64_t>> Requests(v1::AttentionService::Stub& stub,
                                                       const std::string& session,
                                                       const std::string& token = "") {
  grpc::ClientContext context;
  SetDeadline(context);
  if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  v1::GetSessionRequest request;
  request.set_session_id(session);
  v1::GetSessionResponse response;
  grpc::Status status = stub.GetSession(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  std::map<std::string, int64_t> requests;
  for (const auto& r : response.session().requests()) requests[r.request_id()] = r.sequence_length();
  return requests;
}

v1::ForwardRequest ForwardOf(const std::string& session, const std::string& request_id,
                             int64_t tokens, std::mt19937_64& rng) {
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  *forward.add_items() = MakeForwardItem(request_id, RandomHidden(tokens, Spec().d_model, rng));
  return forward;
}

// Item 6: a Forward running when SIGTERM arrives creates its request after the drain started
// (was: the drain listed the session's requests once, at its start, so the Forward answered OK
// for a request the peer never got). Now the drain's cut waits, in the session's queue, for the
// calls queued before it: the long Forward and the short one queued behind it are on the peer
// with their lengths, or (the short one, had it come after the cut) refused UNAVAILABLE.
TEST(DrainCutTest, ForwardsRunningOrQueuedAtSigtermAreMovedOrRefused) {
  SecondServer b({"--replica_id=B"});
  ASSERT_TRUE(b.ok());
  // One compute thread and small chunks: the long Forward runs for a while, chunk after chunk.
  // It must finish before the drain's deadline, so the deadline is generous (200 ms, as this was,
  // lost the Forward on a loaded machine); the drain ends as soon as the queued calls are done.
  SecondServer a({"--replica_id=A", absl::StrCat("--drain_to=", b.address()),
                  "--drain_timeout=30s", "--compute_threads=1", "--prefill_chunk_tokens=32"});
  ASSERT_TRUE(a.ok());
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(a.stub(), SeedConfigure(Spec(), 7), &configured).ok());
  const std::string session = configured.session_id();
  std::mt19937_64 rng(3);
  v1::ForwardResponse unused;
  ASSERT_TRUE(Forward(a.stub(), ForwardOf(session, "before", 5, rng), &unused).ok());
  const int64_t used_before = PoolUsed(a.stub());

  constexpr int64_t kLongTokens = 6000;
  const v1::ForwardRequest long_forward = ForwardOf(session, "long", kLongTokens, rng);
  const v1::ForwardRequest queued_forward = ForwardOf(session, "queued", 3, rng);
  v1::ForwardResponse long_response, queued_response;
  std::future<grpc::Status> long_status = std::async(std::launch::async, [&] {
    return Forward(a.stub(), long_forward, &long_response);
  });
  // A chunked Forward reserves its KV bytes when it starts: the event that it runs.
  ASSERT_TRUE(AwaitPoolAbove(a.stub(), used_before)) << "the long Forward never started";
  std::future<grpc::Status> queued_status = std::async(std::launch::async, [&] {
    return Forward(a.stub(), queued_forward, &queued_response);
  });
  a.process().Signal(SIGTERM);
  const grpc::Status long_result = long_status.get();
  const grpc::Status queued_result = queued_status.get();
  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();

  absl::StatusOr<std::map<std::string, int64_t>> on_b = Requests(b.stub(), session);
  ASSERT_TRUE(on_b.ok()) << on_b.status() << "\n" << a.final_log();
  EXPECT_EQ((*on_b)["before"], 5);
  // Running when the signal came: it finishes before the cut and is moved.
  ASSERT_TRUE(long_result.ok()) << Describe(long_result);
  EXPECT_EQ(on_b->count("long"), 1u) << "the long Forward answered OK, its request must be on B\n"
                                     << a.final_log();
  if (on_b->count("long") > 0) {
    EXPECT_EQ((*on_b)["long"], kLongTokens);
  }
  int64_t moved = 2;
  if (queued_result.ok()) {
    ++moved;
    EXPECT_EQ((*on_b)["queued"], 3) << "answered OK, so it must be on B";
  } else {
    EXPECT_EQ(queued_result.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(queued_result);
    EXPECT_THAT(queued_result.error_message(), HasSubstr("draining"));
    EXPECT_EQ(on_b->count("queued"), 0u);
  }
  EXPECT_THAT(a.final_log(), HasSubstr(absl::StrCat("drain: done: 1 sessions moved, 0 lost; ",
                                                    moved, " requests moved, 0 lost")));
}

// A Forward still running when the drain's deadline passes: the session is sealed at once and
// the Forward is undone at its next chunk, answered UNAVAILABLE (not OK for a request that was
// never moved); the session's requests are counted lost, the refused one refused. The Forward is
// a ForwardStream whose rows the test withholds after the first chunk: it holds the session's
// turn (the drain's cut queues behind it) for as long as the test wants, so the deadline passes
// while it runs on any machine (was: a 32000-token unary Forward that had to outlast 200 ms).
TEST(DrainCutTest, AForwardStillRunningAtTheDeadlineIsUndoneAndRefused) {
  SecondServer b({"--replica_id=B"});
  ASSERT_TRUE(b.ok());
  constexpr int64_t kChunk = 32;
  SecondServer a({"--replica_id=A", absl::StrCat("--drain_to=", b.address()),
                  "--drain_timeout=200ms", absl::StrCat("--prefill_chunk_tokens=", kChunk)});
  ASSERT_TRUE(a.ok());
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(a.stub(), SeedConfigure(Spec(), 7), &configured).ok());
  const std::string session = configured.session_id();
  std::mt19937_64 rng(6);
  v1::ForwardResponse unused;
  ASSERT_TRUE(Forward(a.stub(), ForwardOf(session, "before", 5, rng), &unused).ok());

  // Three chunks announced; the first is sent, its output read back (the event that the Forward
  // runs), and the other two withheld until the drain has given up on it.
  const Tensor hidden = RandomHidden(3 * kChunk, Spec().d_model, rng);
  // In a scope of its own: the call's context left alive would keep A's connection open, and
  // A's gRPC shutdown would wait for it (about 5 s).
  grpc::Status status;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    std::unique_ptr<grpc::ClientReaderWriter<v1::ForwardStreamRequest, v1::ForwardStreamResponse>>
        stream = a.stub().ForwardStream(&context);
    ASSERT_TRUE(stream->Write(ForwardStreamHeaderOf(session, "long", hidden)));
    ASSERT_TRUE(stream->Write(ForwardStreamRowsOf(hidden, 0, kChunk)));
    v1::ForwardStreamResponse answer;
    ASSERT_TRUE(stream->Read(&answer) && answer.has_rows()) << "the first chunk never ran";

    a.process().Signal(SIGTERM);
    ASSERT_TRUE(a.AwaitLog("did not finish before --drain_timeout")) << a.LogTail();
    // The drain is over (its last line comes after the session's); the Forward's next chunk now
    // finds the session sealed.
    ASSERT_TRUE(a.AwaitLog("drain: done:")) << a.LogTail();
    stream->Write(ForwardStreamRowsOf(hidden, kChunk, 3 * kChunk));
    stream->WritesDone();
    while (stream->Read(&answer)) {
      EXPECT_FALSE(answer.has_summary()) << "the Forward was answered OK";
    }
    status = stream->Finish();
  }
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("replica 'A' is draining"));
  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  EXPECT_THAT(a.final_log(), HasSubstr("drain: done: 0 sessions moved, 1 lost; 0 requests moved, "
                                       "1 lost"));
  // Counted once the call is over (the drain's own line comes before the Forward's next chunk).
  EXPECT_THAT(a.final_log(),
              HasSubstr("drain: in all, 1 requests of calls after the cut were refused"));
  absl::StatusOr<std::map<std::string, int64_t>> on_b = Requests(b.stub(), session);
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(on_b->count("long"), 0u);
}

// Item 5: an ImportRequest whose header came before SIGTERM and its pages after the drain's cut
// (was: OK, and the request never reached the peer). Now it is refused UNAVAILABLE saying the
// replica drains, the peer holds the session's other request only, and the drain's last line
// and its metric count the refused request.
TEST(DrainCutTest, AnImportWhosePagesArriveAfterTheCutIsRefused) {
  SecondServer b({"--replica_id=B"});
  ASSERT_TRUE(b.ok());
  const std::string port_file =
      absl::StrCat(::testing::TempDir(), "attnserve_drain_metrics_port_", getpid());
  SecondServer a({"--replica_id=A", absl::StrCat("--drain_to=", b.address()),
                  "--drain_timeout=20s", "--metrics_address=127.0.0.1:0",
                  absl::StrCat("--metrics_port_file=", port_file)});
  ASSERT_TRUE(a.ok());
  int metrics_port = 0;
  ASSERT_TRUE(std::ifstream(port_file) >> metrics_port) << "no port in " << port_file;
  std::remove(port_file.c_str());
  v1::ConfigureResponse configured;
  ASSERT_TRUE(Configure(a.stub(), SeedConfigure(Spec(), 7), &configured).ok());
  const std::string session = configured.session_id();
  // A stream left open keeps A serving (its shutdown waits for it) until the metrics are read.
  grpc::ClientContext stream_context;
  SetDeadline(stream_context);
  std::unique_ptr<grpc::ClientReaderWriter<v1::DecodeRequest, v1::DecodeResponse>> stream =
      a.stub().DecodeStream(&stream_context);
  std::mt19937_64 rng(4);
  v1::ForwardResponse unused;
  ASSERT_TRUE(Forward(a.stub(), ForwardOf(session, "src", 70, rng), &unused).ok());

  // The export to import again under another id.
  v1::ExportedRequest header;
  std::string pages;
  {
    grpc::ClientContext context;
    SetDeadline(context);
    v1::ExportRequestRequest request;
    request.set_session_id(session);
    request.set_request_id("src");
    std::unique_ptr<grpc::ClientReader<v1::ExportRequestResponse>> reader =
        a.stub().ExportRequest(&context, request);
    v1::ExportRequestResponse message;
    while (reader->Read(&message)) {
      if (message.has_header()) header = message.header();
      if (message.has_pages()) pages += message.pages().data();
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_GT(pages.size(), 0u);

  const int64_t used_before = PoolUsed(a.stub());
  grpc::ClientContext import_context;
  SetDeadline(import_context);
  v1::ImportRequestResponse imported;
  std::unique_ptr<grpc::ClientWriter<v1::ImportRequestRequest>> writer =
      a.stub().ImportRequest(&import_context, &imported);
  v1::ImportRequestRequest first;
  first.mutable_header()->set_session_id(session);
  first.mutable_header()->set_request_id("late");
  *first.mutable_header()->mutable_request() = header;
  ASSERT_TRUE(writer->Write(first));
  // The header reserves the pages' pool bytes: the event that it arrived.
  ASSERT_TRUE(AwaitPoolAbove(a.stub(), used_before)) << "the import's header was not taken";

  a.process().Signal(SIGTERM);
  ASSERT_TRUE(a.AwaitLog(absl::StrCat("drain: session ", session, " re-created at")))
      << a.LogTail();
  v1::ImportRequestRequest rest;
  rest.mutable_pages()->set_data(pages);
  writer->Write(rest);
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("replica 'A' is draining"));
  absl::StatusOr<std::string> metrics = ScrapeMetrics(metrics_port);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("attnserve_drain_requests_total{outcome=\"moved\",variant=\"gqa\"} 1\n"));
  EXPECT_THAT(*metrics,
              HasSubstr("attnserve_drain_requests_total{outcome=\"refused\",variant=\"gqa\"} 1\n"));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());

  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  absl::StatusOr<std::map<std::string, int64_t>> on_b = Requests(b.stub(), session);
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(*on_b, (std::map<std::string, int64_t>{{"src", 70}}));
  EXPECT_THAT(a.final_log(), HasSubstr("drain: done: 1 sessions moved, 0 lost; 1 requests moved"));
  EXPECT_THAT(a.final_log(),
              HasSubstr("drain: in all, 1 requests of calls after the cut were refused"));
}

// ---- Owners (item 10) --------------------------------------------------------------------------

std::string Sha256Hex(const std::string& token) {
  unsigned char hash[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), hash);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(hash), sizeof(hash)));
}

constexpr char kAliceToken[] = "alice-drain-test-token";
constexpr char kBobToken[] = "bob-drain-test-token";
constexpr char kOpsToken[] = "ops-drain-test-token";

// Token files in a directory of their own, removed at the end.
class DrainOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/attnserve_drain_owner_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    Write("tokens", absl::StrCat(Sha256Hex(kAliceToken), " alice\n", Sha256Hex(kBobToken),
                                 " bob\n", Sha256Hex(kOpsToken), " ops admin\n"));
    Write("ops_token", absl::StrCat(kOpsToken, "\n"));
    Write("alice_token", absl::StrCat(kAliceToken, "\n"));
  }
  void TearDown() override { std::system(absl::StrCat("rm -rf '", dir_, "'").c_str()); }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(Path(name), std::ios::binary) << text;
  }
  std::string Path(const std::string& name) const { return absl::StrCat(dir_, "/", name); }

  // Alice's session on `a` with one request of 9 tokens; its id.
  std::string AliceSession(SecondServer& a) {
    grpc::ClientContext context;
    SetDeadline(context);
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceToken));
    v1::ConfigureResponse configured;
    grpc::Status status = a.stub().Configure(&context, SeedConfigure(Spec(), 7), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    std::mt19937_64 rng(5);
    grpc::ClientContext forward_context;
    SetDeadline(forward_context);
    forward_context.AddMetadata("authorization", absl::StrCat("Bearer ", kAliceToken));
    v1::ForwardResponse unused;
    status = a.stub().Forward(&forward_context, ForwardOf(configured.session_id(), "r", 9, rng),
                              &unused);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured.session_id();
  }

  // Configure at `server` with `token` acting for `owner` (x-attnserve-owner).
  static grpc::Status ConfigureFor(SecondServer& server, const std::string& token,
                                   const std::string& owner) {
    grpc::ClientContext context;
    SetDeadline(context);
    if (!token.empty()) context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
    context.AddMetadata("x-attnserve-owner", owner);
    v1::ConfigureResponse configured;
    return server.stub().Configure(&context, SeedConfigure(Spec(), 7), &configured);
  }

  std::string dir_;
};

// Was: the drain's calls carried no token (a peer with tenants refused them, the sessions were
// lost) and no owner. Now the drain's admin token re-creates the session for alice: on B alice
// finds it with its request, bob gets NOT_FOUND as for an unknown id.
TEST_F(DrainOwnerTest, TheOwnerTravelsWithAMovedSession) {
  SecondServer b({"--replica_id=B", absl::StrCat("--auth_tokens=", Path("tokens"))});
  ASSERT_TRUE(b.ok());
  SecondServer a({"--replica_id=A", absl::StrCat("--auth_tokens=", Path("tokens")),
                  absl::StrCat("--drain_to=", b.address()), "--drain_timeout=20s",
                  absl::StrCat("--drain_token_file=", Path("ops_token"))});
  ASSERT_TRUE(a.ok());
  const std::string session = AliceSession(a);
  absl::StatusOr<ExitState> ended = a.Terminate();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  EXPECT_THAT(a.final_log(), HasSubstr("drain: done: 1 sessions moved, 0 lost; 1 requests moved"));

  absl::StatusOr<std::map<std::string, int64_t>> alice = Requests(b.stub(), session, kAliceToken);
  ASSERT_TRUE(alice.ok()) << alice.status() << "\n" << a.final_log();
  EXPECT_EQ(*alice, (std::map<std::string, int64_t>{{"r", 9}}));
  absl::StatusOr<std::map<std::string, int64_t>> bob = Requests(b.stub(), session, kBobToken);
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kNotFound) << bob.status();
  // Only an admin acts for another tenant, and only for a tenant with a token here.
  grpc::Status status = ConfigureFor(b, kAliceToken, "bob");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << Describe(status);
  status = ConfigureFor(b, kOpsToken, "nobody");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
  EXPECT_THAT(status.error_message(), HasSubstr("tenant 'nobody' has no token on this server"));
}

// A peer that cannot keep owners gets nothing: B without --auth_tokens (was: the session was
// re-created there as its admin's, open to any caller), and B with tenants that refuses the
// drain's token. A logs why, keeps the session, and exits 0 as in a shutdown without a drain.
TEST_F(DrainOwnerTest, ADrainToAPeerThatCannotAuthenticateItIsRefused) {
  struct Case {
    std::vector<std::string> peer_flags;
    std::string token_file;
    std::string why;
  };
  const std::vector<Case> cases = {
      {{}, "ops_token", "does not authenticate its callers"},
      {{absl::StrCat("--auth_tokens=", Path("tokens"))}, "alice_token",
       "takes this replica's token as tenant 'alice', not an admin"},
      {{absl::StrCat("--auth_tokens=", Path("tokens"))}, "stranger_token",
       "the peer refuses this replica's credentials"},
  };
  Write("stranger_token", "not-a-token-of-b\n");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.why);
    std::vector<std::string> peer_flags = c.peer_flags;
    peer_flags.push_back("--replica_id=B");
    SecondServer b(peer_flags);
    ASSERT_TRUE(b.ok());
    SecondServer a({"--replica_id=A", absl::StrCat("--auth_tokens=", Path("tokens")),
                    absl::StrCat("--drain_to=", b.address()), "--drain_timeout=20s",
                    absl::StrCat("--drain_token_file=", Path(c.token_file))});
    ASSERT_TRUE(a.ok());
    AliceSession(a);
    if (c.peer_flags.empty()) {
      // The peer without tenants refuses an owner rather than dropping it.
      const grpc::Status status = ConfigureFor(b, "", "alice");
      EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << Describe(status);
      EXPECT_THAT(status.error_message(), HasSubstr("cannot keep a session's owner"));
    }
    absl::StatusOr<ExitState> ended = a.Terminate();
    ASSERT_TRUE(ended.ok()) << ended.status();
    EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
    EXPECT_THAT(a.final_log(), HasSubstr("drain: refused, no session is moved"));
    EXPECT_THAT(a.final_log(), HasSubstr(c.why));
    EXPECT_THAT(a.final_log(), HasSubstr("the 1 sessions (1 requests) stay here"));
    grpc::ClientContext context;
    SetDeadline(context);
    context.AddMetadata("authorization", absl::StrCat("Bearer ", kOpsToken));
    v1::ListSessionsResponse listed;
    ASSERT_TRUE(b.stub().ListSessions(&context, v1::ListSessionsRequest(), &listed).ok());
    EXPECT_EQ(listed.sessions_size(), 0) << "nothing reached the peer";
  }
}

}  // namespace
}  // namespace attnserve::server_test
