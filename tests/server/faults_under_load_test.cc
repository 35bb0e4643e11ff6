// Issue 14, faults under load: while survivor clients decode steadily, disturbers cancel streams
// and Forwards mid-call, let deadlines expire inside decode batches, exhaust the KV pool with 64
// streams, configure a layer too large for the parameter budget, and finally SIGTERM the server.
// After each: every survivor output is bit-identical to the engine run undisturbed, the KV pool
// is back to its baseline once the disturbers are gone, and the server's resident memory stays
// bounded.
//
// Survivors are bit-exact by construction: each owns a session with one request, so its decode
// batches always hold one step (the CPU engine's rounding depends on the batch's row count), and
// its request's pages are taken before the disturbance (page_size 64, prompt + steps < 64
// tokens), so an exhausted pool cannot refuse its steps.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/reference/test_cases.h"
#include "tests/support/await_until.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using reference::FindSpec;

constexpr int kSurvivors = 4;
constexpr int kSurvivorPrompt = 4;
constexpr int kSurvivorSteps = 48;       // prompt + steps < 64: one page for the whole run.
constexpr int64_t kPoolBytes = 4 << 20;  // Small enough for 64 disturber streams to exhaust.

LayerSpec SurvivorSpec() { return FindSpec("gqa2_half_window7").spec; }

// GQA d_model 64 without window (pages are never evicted: the disturbers fill the pool).
LayerSpec DisturberSpec() {
  LayerSpec spec = FindSpec("gqa2_half_window7").spec;
  spec.sliding_window = 0;
  return spec;
}

// One survivor: its own session and request, decoding kSurvivorSteps steps over a DecodeStream
// at a steady pace, each output compared with the undisturbed engine run.
class Survivor {
 public:
  Survivor(int index, std::shared_ptr<grpc::Channel> channel)
      : index_(index), stub_(v1::AttentionService::NewStub(std::move(channel))) {}

  // Configures the session, prefills, and computes the expected outputs.
  void Prepare() {
    const LayerSpec spec = SurvivorSpec();
    v1::ConfigureRequest configure = SeedConfigure(spec, 40 + index_);
    configure.set_page_size(64);
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(*stub_, configure, &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    session_ = configured.session_id();
    std::mt19937_64 rng(100 + index_);
    const Tensor prompt = RandomHidden(kSurvivorPrompt, spec.d_model, rng);
    for (int s = 0; s < kSurvivorSteps; ++s) steps_.push_back(RandomHidden(1, spec.d_model, rng));
    absl::StatusOr<std::unique_ptr<ReferenceSession>> ref =
        ReferenceSession::Create(spec, 40 + index_, DType::kF32, 64);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_TRUE((*ref)->Forward({{"s", prompt, {}}}).ok());
    for (const Tensor& step : steps_) {
      absl::StatusOr<std::vector<Tensor>> out = (*ref)->Decode({{"s", step, std::nullopt}});
      ASSERT_TRUE(out.ok());
      expected_.push_back((*out)[0]);
    }
    v1::ForwardRequest forward;
    forward.set_session_id(session_);
    *forward.add_items() = MakeForwardItem("s", prompt);
    v1::ForwardResponse forwarded;
    ASSERT_TRUE(Forward(*stub_, forward, &forwarded).ok());
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Joins; returns "" when every step matched, else what went wrong.
  std::string Join() {
    if (thread_.joinable()) thread_.join();
    return failure_;
  }
  int steps_done() const { return done_.load(); }

  // Lets the stream go on to its last step (the test releases the pace once the fault is over).
  void set_pace(std::chrono::milliseconds pace) { pace_ms_.store(static_cast<int>(pace.count())); }

 private:
  void Run() {
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(120));
    auto stream = stub_->DecodeStream(&context);
    for (int s = 0; s < kSurvivorSteps; ++s) {
      v1::DecodeRequest request;
      request.set_session_id(session_);
      *request.add_items() = MakeDecodeItem("s", steps_[s]);
      v1::DecodeResponse response;
      if (!stream->Write(request) || !stream->Read(&response)) {
        failure_ = absl::StrCat("survivor ", index_, " step ", s, ": ", Describe(stream->Finish()));
        return;
      }
      if (!SameBytes(response.results(0).output(), expected_[s])) {
        failure_ = absl::StrCat("survivor ", index_, " step ", s, ": output differs");
        return;
      }
      ++done_;
      std::this_thread::sleep_for(std::chrono::milliseconds(pace_ms_.load()));
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    if (!status.ok()) failure_ = absl::StrCat("survivor ", index_, ": ", Describe(status));
  }

  const int index_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
  std::string session_;
  std::vector<Tensor> steps_;
  std::vector<Tensor> expected_;
  std::thread thread_;
  std::atomic<int> done_{0};
  std::atomic<int> pace_ms_{20};
  std::string failure_;
};

class FaultsUnderLoadTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {absl::StrCat("--kv_pool_bytes=", kPoolBytes), "--max_parameter_bytes=268435456"};
  }

  void SetUp() override {
    ServerTest::SetUp();
    if (HasFatalFailure()) return;
    for (int i = 0; i < kSurvivors; ++i) {
      survivors_.push_back(std::make_unique<Survivor>(i, channel_));
      survivors_.back()->Prepare();
      if (HasFatalFailure()) return;
    }
    absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
    ASSERT_TRUE(info.ok());
    baseline_pool_bytes_ = info->kv_pool_used_bytes();
    baseline_rss_ = server().ResidentBytes();
    for (auto& survivor : survivors_) survivor->Start();
  }

  // Waits for every survivor to finish, checks their outputs, the pool and the memory.
  void FinishAndCheck() {
    for (auto& survivor : survivors_) survivor->set_pace(std::chrono::milliseconds(0));
    for (auto& survivor : survivors_) EXPECT_EQ(survivor->Join(), "");
    absl::StatusOr<v1::GetServerInfoResponse> info = ServerInfo(stub());
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->kv_pool_used_bytes(), baseline_pool_bytes_)
        << "the disturbers' KV pages were not all returned";
    const int64_t rss = server().ResidentBytes();
    EXPECT_LT(rss - baseline_rss_, int64_t{96} << 20)
        << "VmRSS " << baseline_rss_ << " -> " << rss << " bytes";
  }

  // A session for disturbers; returned id.
  std::string DisturberSession(v1::AttentionService::Stub& stub) {
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(stub, SeedConfigure(DisturberSpec(), 9), &configured);
    EXPECT_TRUE(status.ok()) << Describe(status);
    return configured.session_id();
  }

  void ReleaseSession(const std::string& id) { EXPECT_TRUE(Release(stub(), id, "").ok()); }

  std::vector<std::unique_ptr<Survivor>> survivors_;
  int64_t baseline_pool_bytes_ = 0;
  int64_t baseline_rss_ = 0;
  std::mt19937_64 rng_{77};
};

TEST_F(FaultsUnderLoadTest, CancellationsMidStreamAndMidForward) {
  const std::string session = DisturberSession(stub());
  const int d_model = DisturberSpec().d_model;
  std::vector<std::thread> disturbers;
  std::atomic<int> cancelled{0};
  for (int t = 0; t < 8; ++t) {
    disturbers.emplace_back([&, t] {
      auto stub = v1::AttentionService::NewStub(channel_);
      std::mt19937_64 rng(t);
      for (int round = 0; round < 6; ++round) {
        const std::string id = absl::StrCat("c", t, "_", round);
        // A long Forward cancelled while it queues or runs.
        {
          grpc::ClientContext context;
          SetDeadline(context);
          v1::ForwardRequest forward;
          forward.set_session_id(session);
          *forward.add_items() = MakeForwardItem(id, RandomHidden(96, d_model, rng));
          v1::ForwardResponse response;
          std::thread canceller([&context] {
            // Spreads the cancels over the call's stages; either outcome is fine, and the test
            // needs only one of its 48 to land (checked below), not a given order.
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            context.TryCancel();
          });
          const grpc::Status status = stub->Forward(&context, forward, &response);
          canceller.join();
          if (status.error_code() == grpc::StatusCode::CANCELLED) ++cancelled;
        }
        // A stream cancelled after a few steps (it exists only if the Forward ran).
        grpc::ClientContext context;
        SetDeadline(context);
        auto stream = stub->DecodeStream(&context);
        for (int s = 0; s < 3; ++s) {
          v1::DecodeRequest request;
          request.set_session_id(session);
          *request.add_items() = MakeDecodeItem(id, RandomHidden(1, d_model, rng));
          v1::DecodeResponse response;
          if (!stream->Write(request) || !stream->Read(&response)) break;
        }
        context.TryCancel();
        stream->Finish();
        Release(*stub, session, id).ok();  // May be NOT_FOUND when the Forward was cancelled.
      }
    });
  }
  for (std::thread& t : disturbers) t.join();
  ReleaseSession(session);
  FinishAndCheck();
  RecordProperty("forwards_cancelled", cancelled.load());
  EXPECT_GT(cancelled.load(), 0) << "no Forward was cancelled; the test proved nothing";
}

TEST_F(FaultsUnderLoadTest, DeadlinesExpiringMidBatch) {
  const std::string session = DisturberSession(stub());
  const int d_model = DisturberSpec().d_model;
  // 16 requests decoded by unary calls whose deadlines (1-4 ms) expire while they wait in or run
  // with their batch.
  {
    v1::ForwardRequest forward;
    forward.set_session_id(session);
    for (int r = 0; r < 16; ++r) {
      *forward.add_items() = MakeForwardItem(absl::StrCat("d", r), RandomHidden(8, d_model, rng_));
    }
    v1::ForwardResponse response;
    ASSERT_TRUE(Forward(stub(), forward, &response).ok());
  }
  std::atomic<int> expired{0}, answered{0};
  std::vector<std::thread> disturbers;
  for (int r = 0; r < 16; ++r) {
    disturbers.emplace_back([&, r] {
      auto stub = v1::AttentionService::NewStub(channel_);
      std::mt19937_64 rng(r);
      for (int s = 0; s < 20; ++s) {
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::milliseconds(1 + (r + s) % 4));
        v1::DecodeRequest request;
        request.set_session_id(session);
        *request.add_items() = MakeDecodeItem(absl::StrCat("d", r), RandomHidden(1, d_model, rng));
        v1::DecodeResponse response;
        const grpc::Status status = stub->Decode(&context, request, &response);
        if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) ++expired;
        if (status.ok()) ++answered;
      }
    });
  }
  for (std::thread& t : disturbers) t.join();
  ReleaseSession(session);
  FinishAndCheck();
  RecordProperty("decodes_expired", expired.load());
  RecordProperty("decodes_answered", answered.load());
  EXPECT_GT(expired.load(), 0) << "no deadline expired; the test proved nothing";
}

TEST_F(FaultsUnderLoadTest, PoolExhaustedBy64Streams) {
  const std::string session = DisturberSession(stub());
  const int d_model = DisturberSpec().d_model;
  std::atomic<int> exhausted{0};
  std::vector<std::thread> disturbers;
  for (int t = 0; t < 64; ++t) {
    disturbers.emplace_back([&, t] {
      auto stub = v1::AttentionService::NewStub(channel_);
      std::mt19937_64 rng(t);
      const std::string id = absl::StrCat("p", t);
      // Each stream grows its request until the pool refuses it.
      for (int chunk = 0; chunk < 64; ++chunk) {
        v1::ForwardRequest forward;
        forward.set_session_id(session);
        *forward.add_items() = MakeForwardItem(id, RandomHidden(64, d_model, rng));
        v1::ForwardResponse response;
        const grpc::Status status = Forward(*stub, forward, &response);
        if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
          ++exhausted;
          break;
        }
        if (!status.ok()) break;  // OUT_OF_RANGE at max_sequence_length would end it too.
      }
    });
  }
  for (std::thread& t : disturbers) t.join();
  EXPECT_GT(exhausted.load(), 0) << "the pool was never exhausted; the test proved nothing";
  ReleaseSession(session);
  FinishAndCheck();
}

TEST_F(FaultsUnderLoadTest, AHugeConfigureDuringLoad) {
  LayerSpec huge;
  huge.variant = AttentionVariant::kMHA;
  huge.d_model = 16384;
  huge.num_heads = huge.num_kv_heads = 128;
  huge.head_dim = 128;
  huge.causal = true;
  for (int i = 0; i < 4; ++i) {
    v1::ConfigureResponse configured;
    const grpc::Status status = Configure(stub(), SeedConfigure(huge, i), &configured);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << Describe(status);
  }
  FinishAndCheck();
}

TEST_F(FaultsUnderLoadTest, SigtermDuringLoadDrainsAndExitsZero) {
  // Let the survivors get going, then stop the server under them: every step answered before the
  // stop must be right, the rest fail with a clear status, and the server exits 0.
  ASSERT_TRUE(AwaitUntil([&] { return survivors_[0]->steps_done() >= 5; },
                         std::chrono::seconds(60), std::chrono::milliseconds(5)))
      << "the survivors made no progress";
  const absl::StatusOr<ExitState> ended = server().Terminate(kStopTimeout);
  stopped_ = true;
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(ended->exited && ended->exit_code == 0) << ended->ToString();
  for (auto& survivor : survivors_) {
    const std::string failure = survivor->Join();
    // Either finished before the stop, or ended by it: never a wrong output.
    EXPECT_THAT(failure, ::testing::Not(::testing::HasSubstr("output differs")));
  }
}

}  // namespace
}  // namespace attnserve::server_test
