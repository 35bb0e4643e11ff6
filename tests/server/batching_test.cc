// Issue 5, scheduler tests 1 and 2, against the real attnserve_server binary.
//
// 1. Continuous batching: 32 DecodeStream streams decode at once on one session. The session's
//    BatchingStats (GetSession) must show engine Decode calls of more than one step, and every
//    output must equal the engine's *unbatched* result (an in-process reference decoding each
//    request alone, one step per Decode call).
//    Tolerance, not bytes: the CPU decode kernel plans its key splits from the batch size
//    (about 2 work items per thread: ceil(2 * threads / batch) splits per sequence, only for
//    sequences of >= 512 keys), so a step decoded in a batch of 8 may sum its softmax in a
//    different order than the same step decoded alone. Prompts here cross 512 tokens on purpose.
//    The projections differ too: OpenBLAS's sgemm rounds a row differently depending on how many
//    rows the call has. Observed differences are ~1e-7; we require
//    |out - ref| <= 1e-5 + 1e-5 * |ref| per element (float32 results of O(1)), and record how
//    many outputs were nevertheless bit-identical. (Prompts over --prefill_chunk_tokens = 512 run
//    in two chunks, which rounds differently from the reference's one call as well.)
//    Issue 23: 64 streams with their steps ready decode in one batch of 64 (the server's gauges,
//    round by round), a lone stream's steps never wait for a batch to form, and a re-prefill's
//    Release and Forward neither cut the batch being formed nor keep it waiting, and neither
//    does a Forward that fails for having no items.
//    Checked against broken schedulers (each mutation undone after): launching a batch at once
//    fails the batch-of-64 test in every round and the two tests that a batch is not cut;
//    capping batches at 32 fails it in round 0 (the later rounds are left out as inconclusive:
//    the cap's second part waits for the 1 s give-up); no batching at all (a cap of 1) fails the
//    32-stream test, which claims only that steps share engine calls and so passes the other
//    two; a Release of the last awaited stream that does not launch the batch fails the test
//    that it does. A batch also waits for a stream as long as the streams took to come back
//    (ReturnWaitTest): the scheduler before that wait launched d alone in 5 runs of 8 at load
//    7-10 (2 skipped; 1 passed, its batch task not run within three reads of the counters);
//    without a late stream's raise of the wait (rounds alone) it did so in 2 runs of 6.
// 2. Chunked prefill: an 8192-token Forward runs beside 4 decode streams on the same session.
//    With --prefill_chunk_tokens=512 no decode step may wait longer than 8 mean prefill chunks
//    (half the Forward's 16) plus 100 ms of slack (measured: ~2.7 mean chunks on an idle VM); with
//    chunking off (0) a step that arrives during the Forward waits for most of it (which shows the
//    first bound is not trivially met). Measured numbers: docs/benchmarks.md, "Chunked prefill".
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "tests/support/await_until.h"
#include "tests/support/counter_reads.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `f` when it goes out of scope.
class RunAtExit {
 public:
  explicit RunAtExit(std::function<void()> f) : f_(std::move(f)) {}
  RunAtExit(const RunAtExit&) = delete;
  RunAtExit& operator=(const RunAtExit&) = delete;
  ~RunAtExit() { f_(); }

 private:
  std::function<void()> f_;
};


// Elementwise |a - b| <= abs_tol + rel_tol * |b|; `identical` is set when the bytes are equal.
::testing::AssertionResult Close(const v1::Tensor& actual, const Tensor& expected,
                                 bool* identical) {
  absl::StatusOr<Tensor> got = TensorFromProto(actual);
  if (!got.ok()) return ::testing::AssertionFailure() << got.status();
  if (got->shape() != expected.shape() || got->dtype() != DType::kF32 ||
      expected.dtype() != DType::kF32) {
    return ::testing::AssertionFailure() << "shape or dtype differs";
  }
  *identical = std::equal(got->data(), got->data() + got->num_bytes(), expected.data());
  const float* a = reinterpret_cast<const float*>(got->data());
  const float* b = reinterpret_cast<const float*>(expected.data());
  for (int64_t i = 0; i < got->num_elements(); ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-5f + 1e-5f * std::fabs(b[i]))) {
      return ::testing::AssertionFailure()
             << "element " << i << ": " << a[i] << " vs reference " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

absl::StatusOr<v1::SessionInfo> GetSessionInfo(v1::AttentionService::Stub& stub,
                                               const std::string& id) {
  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest request;
  request.set_session_id(id);
  v1::GetSessionResponse response;
  grpc::Status status = stub.GetSession(&context, request, &response);
  if (!status.ok()) return absl::InternalError(Describe(status));
  return response.session();
}

// The session's batching counters (GetSession), or the call's error.
absl::StatusOr<v1::BatchingStats> GetBatchingStats(v1::AttentionService::Stub& stub,
                                                   const std::string& id) {
  absl::StatusOr<v1::SessionInfo> info = GetSessionInfo(stub, id);
  if (!info.ok()) return info.status();
  return info->batching();
}

// ---- 1. Continuous batching ----------------------------------------------------------------

class BatchingTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_requests_per_session=64", "--max_batch_size=64", "--max_queue_delay=500us"};
  }
};

TEST_F(BatchingTest, ThirtyTwoStreamsShareDecodeBatchesAndMatchUnbatchedEngine) {
  constexpr int kStreams = 32;
  constexpr int kSteps = 16;
  constexpr uint64_t kSeed = 5;
  const LayerSpec spec = SmallBiasedGqa();
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(spec, kSeed), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const std::string session = configured.session_id();

  struct StreamLog {
    Tensor prompt;
    std::vector<Tensor> steps;
    v1::Tensor prompt_output;
    std::vector<v1::Tensor> outputs;
    std::string failure;
  };
  std::vector<StreamLog> logs(kStreams);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      StreamLog& log = logs[s];
      std::mt19937_64 rng(kSeed * 100 + s);
      // Ragged prompts, some past 512 keys (where the decode split plan depends on batch size).
      log.prompt = RandomHidden(8 + 23 * s, spec.d_model, rng);
      const std::string id = absl::StrCat("s", s);
      std::shared_ptr<grpc::Channel> channel = server().NewChannel();
      auto client = v1::AttentionService::NewStub(channel);
      v1::ForwardRequest forward;
      forward.set_session_id(session);
      *forward.add_items() = MakeForwardItem(id, log.prompt);
      v1::ForwardResponse forwarded;
      grpc::Status st = Forward(*client, forward, &forwarded);
      if (!st.ok()) {
        log.failure = "Forward: " + Describe(st);
        ++ready;
        return;
      }
      log.prompt_output = forwarded.results(0).output();
      // Start decoding together, so the streams overlap.
      ++ready;
      while (ready.load() < kStreams) std::this_thread::yield();
      grpc::ClientContext context;
      SetDeadline(context);
      auto stream = client->DecodeStream(&context);
      for (int step = 0; step < kSteps; ++step) {
        log.steps.push_back(RandomHidden(1, spec.d_model, rng));
        v1::DecodeRequest request;
        request.set_session_id(session);
        *request.add_items() = MakeDecodeItem(id, log.steps.back());
        v1::DecodeResponse response;
        if (!stream->Write(request) || !stream->Read(&response)) break;
        log.outputs.push_back(response.results(0).output());
      }
      stream->WritesDone();
      grpc::Status end = stream->Finish();
      if (!end.ok()) log.failure = "DecodeStream: " + Describe(end);
    });
  }
  for (std::thread& t : threads) t.join();

  // A batch is counted after its answers go out: the last one's count may come after them.
  absl::StatusOr<v1::SessionInfo> info;
  AwaitUntil(
      [&] {
        info = GetSessionInfo(stub(), session);
        return !info.ok() || info->batching().decode_steps() >= kStreams * kSteps;
      },
      std::chrono::seconds(10));
  ASSERT_TRUE(info.ok()) << info.status();
  const v1::BatchingStats& batching = info->batching();
  const double mean = static_cast<double>(batching.decode_steps()) /
                      std::max<int64_t>(1, batching.decode_batches());
  RecordProperty("decode_batches", std::to_string(batching.decode_batches()));
  RecordProperty("decode_steps", std::to_string(batching.decode_steps()));
  RecordProperty("max_decode_batch", std::to_string(batching.max_decode_batch()));
  std::cout << "decode steps " << batching.decode_steps() << " in " << batching.decode_batches()
            << " engine calls: mean batch " << mean << ", max " << batching.max_decode_batch()
            << "\n";
  EXPECT_EQ(batching.decode_steps(), kStreams * kSteps);
  EXPECT_GT(batching.max_decode_batch(), 1);
  EXPECT_GT(mean, 2.0) << "steps of 32 concurrent streams should share engine calls";

  // The unbatched reference: each request alone, one step per engine Decode call.
  absl::StatusOr<std::unique_ptr<ReferenceSession>> ref = ReferenceSession::Create(spec, kSeed);
  ASSERT_TRUE(ref.ok()) << ref.status();
  int identical = 0, compared = 0;
  for (int s = 0; s < kStreams; ++s) {
    SCOPED_TRACE(absl::StrCat("stream ", s));
    const StreamLog& log = logs[s];
    ASSERT_EQ(log.failure, "");
    ASSERT_EQ(log.outputs.size(), static_cast<size_t>(kSteps));
    const std::string id = absl::StrCat("s", s);
    absl::StatusOr<std::vector<Tensor>> prompt_out = (*ref)->Forward({{id, log.prompt, {}}});
    ASSERT_TRUE(prompt_out.ok()) << prompt_out.status();
    // Prompts over 512 tokens ran as two prefill chunks, which rounds differently too.
    bool prompt_same = false;
    EXPECT_TRUE(Close(log.prompt_output, (*prompt_out)[0], &prompt_same));
    for (int step = 0; step < kSteps; ++step) {
      absl::StatusOr<std::vector<Tensor>> out =
          (*ref)->Decode({{id, log.steps[step], std::nullopt}});
      ASSERT_TRUE(out.ok()) << out.status();
      bool same = false;
      EXPECT_TRUE(Close(log.outputs[step], (*out)[0], &same)) << "step " << step;
      identical += same;
      ++compared;
    }
  }
  RecordProperty("bit_identical_outputs", absl::StrCat(identical, "/", compared));
  std::cout << identical << " of " << compared << " decode outputs bit-identical to unbatched\n";
}

// 64 streams, each with its step ready, decode in one batch of 64: the batch being formed waits
// for every stream the previous batch answered and takes all of their steps (launching with those
// that came back first split 64 streams into two cohorts of ~32 that took turns). Shown round by
// round from the server's own gauges, not from a mean batch size: a closed loop's mean depends on
// whether the clients come back within the scheduler's give-up gap, which a loaded 2-core machine
// does not promise (it measured 48 against 56 there, 2 runs in 6). Each round, 63 streams send
// their step and the test waits until the session reports 63 steps waiting (the batch holds for
// the 64th); then the 64th sends, and the round must be one engine call of 64 steps. A round
// whose steps took longer than --max_queue_delay (1 s, the give-up) cannot tell a split from the
// give-up and is left out; the test is skipped when every round was.
class FullBatchTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_requests_per_session=64", "--max_batch_size=64", "--max_queue_delay=1s"};
  }
};

TEST_F(FullBatchTest, SixtyFourReadyStreamsDecodeInOneBatchOfSixtyFour) {
  constexpr int kStreams = 64;
  constexpr int kRounds = 4;
  constexpr auto kGiveUp = std::chrono::seconds(1);  // --max_queue_delay.
  const LayerSpec spec = SmallBiasedGqa();
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(spec, 7), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const std::string session = configured.session_id();
  std::mt19937_64 rng(7);
  auto batching = [&] { return GetBatchingStats(stub(), session); };

  // Every stream prefilled, then one batch of all 64 (a Decode call's items run together): the
  // next batch waits for every one of them.
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  v1::DecodeRequest first;
  first.set_session_id(session);
  std::vector<v1::DecodeRequest> steps(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    const std::string id = absl::StrCat("s", s);
    *forward.add_items() = MakeForwardItem(id, RandomHidden(16, spec.d_model, rng));
    *first.add_items() = MakeDecodeItem(id, RandomHidden(1, spec.d_model, rng));
    steps[s].set_session_id(session);
    *steps[s].add_items() = MakeDecodeItem(id, RandomHidden(1, spec.d_model, rng));
  }
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  Clock::time_point last_launch = Clock::now();  // Before the previous batch could launch.
  v1::DecodeResponse decoded;
  status = Decode(stub(), first, &decoded);
  ASSERT_TRUE(status.ok()) << Describe(status);

  // Stream s sends its step of round r once allowed[s] > r, then reads the answer.
  absl::Mutex mu;
  std::vector<int> allowed(kStreams, 0);
  int answered = 0;
  int over = 0;  // Streams done (a failed one included: the waits below end then too).
  std::vector<std::string> failures(kStreams);
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      auto client = v1::AttentionService::NewStub(server().NewChannel());
      grpc::ClientContext context;
      SetDeadline(context);
      auto stream = client->DecodeStream(&context);
      for (int round = 0; round < kRounds; ++round) {
        {
          absl::MutexLock lock(&mu);
          const auto go = [&] { return allowed[s] > round; };
          mu.Await(absl::Condition(&go));
        }
        v1::DecodeResponse response;
        if (!stream->Write(steps[s]) || !stream->Read(&response)) break;
        absl::MutexLock lock(&mu);
        ++answered;
      }
      stream->WritesDone();
      grpc::Status end = stream->Finish();
      absl::MutexLock lock(&mu);
      if (!end.ok()) failures[s] = Describe(end);
      ++over;
    });
  }
  auto release = [&](int from, int to, int round) {
    absl::MutexLock lock(&mu);
    for (int s = from; s < to; ++s) allowed[s] = round + 1;
  };
  // However the test ends, every stream is let through its rounds and joined: an ASSERT that
  // returns early must not destroy a joinable std::thread (that aborts the binary, leaving its
  // server running).
  const RunAtExit join_streams([&] {
    release(0, kStreams, kRounds - 1);
    for (std::thread& t : threads) {
      if (t.joinable()) t.join();
    }
  });

  int conclusive = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    absl::StatusOr<v1::BatchingStats> before = batching();
    ASSERT_TRUE(before.ok()) << before.status();
    release(1, kStreams, round);
    // The batch being formed holds the 63 steps for stream 0, which the previous batch answered.
    absl::StatusOr<v1::BatchingStats> held;
    AwaitUntil(
        [&] {
          held = batching();
          return !held.ok() || held->decode_steps_waiting() == kStreams - 1 ||
                 held->decode_batches() != before->decode_batches();
        },
        std::chrono::duration_cast<std::chrono::milliseconds>(kRpcTimeout));
    const Clock::time_point now = Clock::now();
    const bool in_time = now - last_launch < kGiveUp;
    last_launch = now;
    release(0, 1, round);
    {
      absl::MutexLock lock(&mu);
      const auto all_back = [&] { return answered == (round + 1) * kStreams || over > 0; };
      mu.Await(absl::Condition(&all_back));
    }
    // The session counts a batch after its answers went out: wait for its 64 steps to count.
    absl::StatusOr<v1::BatchingStats> after;
    AwaitUntil(
        [&] {
          after = batching();
          return !after.ok() || after->decode_steps() >= before->decode_steps() + kStreams;
        },
        std::chrono::seconds(10));
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_TRUE(after.ok()) << after.status();
    if (!in_time) continue;  // The scheduler may have given stream 0 up: inconclusive.
    ++conclusive;
    EXPECT_EQ(held->decode_steps_waiting(), kStreams - 1)
        << "the 63 steps did not wait for the 64th stream";
    EXPECT_EQ(held->decode_batches(), before->decode_batches())
        << "the batch launched without stream 0, which the previous batch answered";
    EXPECT_EQ(after->decode_batches() - before->decode_batches(), 1)
        << "64 ready steps were split into several engine calls";
    EXPECT_EQ(after->decode_steps() - before->decode_steps(), kStreams);
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < kStreams; ++s) EXPECT_EQ(failures[s], "") << "stream " << s;
  RecordProperty("conclusive_rounds", conclusive);
  std::cout << conclusive << " of " << kRounds << " rounds within --max_queue_delay\n";
  if (conclusive == 0) GTEST_SKIP() << "every round took longer than --max_queue_delay";
}

// Issue 23: a re-prefill (Release of a stream's finished request, Forward of its next one) does
// not cut the batch being formed. With --max_queue_delay=1s (the flag's maximum) a batch launches
// only when every stream the previous batch answered is back, or 1 s after the last came back; each
// wait below is for an event the server reports (decode_steps_waiting), never a sleep. A case
// whose RPCs took longer than that 1 s (a badly overloaded machine) cannot tell a cut from the
// give-up and is skipped rather than failed.
class ReprefillTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_batch_size=64", "--max_queue_delay=1s"};
  }

  void SetUp() override {
    ServerTest::SetUp();
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(spec_, 11), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    session_ = configured.session_id();
    // Three streams prefilled, then one batch of all three: the next batch waits for a, b and d.
    v1::ForwardRequest forward;
    forward.set_session_id(session_);
    v1::DecodeRequest step;
    step.set_session_id(session_);
    for (const char* id : {"a", "b", "d"}) {
      *forward.add_items() = MakeForwardItem(id, RandomHidden(16, spec_.d_model, rng_));
      *step.add_items() = MakeDecodeItem(id, RandomHidden(1, spec_.d_model, rng_));
    }
    v1::ForwardResponse forwarded;
    status = Forward(stub(), forward, &forwarded);
    ASSERT_TRUE(status.ok()) << Describe(status);
    v1::DecodeResponse decoded;
    status = Decode(stub(), step, &decoded);
    ASSERT_TRUE(status.ok()) << Describe(status);
  }

  void TearDown() override {
    JoinSteps();
    ServerTest::TearDown();
  }

  // A step sent on its own thread; its answer comes when its batch runs.
  struct AsyncStep {
    grpc::Status status;
    v1::DecodeResponse response;
    std::thread thread;
  };

  // One step of `id` on its own thread. The fixture owns it and joins it however the test ends:
  // an ASSERT that returns early (a broken scheduler) must not destroy a joinable std::thread,
  // which aborts the binary and every test after it.
  AsyncStep& StepAsync(const std::string& id) {
    v1::DecodeRequest request;
    request.set_session_id(session_);
    *request.add_items() = MakeDecodeItem(id, RandomHidden(1, spec_.d_model, rng_));
    AsyncStep& step = steps_.emplace_back();
    step.thread = std::thread([this, request, &step] {
      auto client = v1::AttentionService::NewStub(server().NewChannel());
      step.status = Decode(*client, request, &step.response);
    });
    return step;
  }

  void JoinSteps() {
    for (AsyncStep& step : steps_) {
      if (step.thread.joinable()) step.thread.join();
    }
  }

  absl::StatusOr<v1::BatchingStats> Batching() {
    absl::StatusOr<v1::SessionInfo> info = GetSessionInfo(stub(), session_);
    if (!info.ok()) return info.status();
    return info->batching();
  }

  // Returns once `steps` decode steps wait in the session's scheduler (each poll is one GetSession
  // round trip; bounded by the RPC deadline of the steps in flight).
  absl::StatusOr<v1::BatchingStats> AwaitWaiting(int64_t steps) {
    const auto give_up = Clock::now() + kRpcTimeout;
    while (Clock::now() < give_up) {
      absl::StatusOr<v1::BatchingStats> batching = Batching();
      if (!batching.ok() || batching->decode_steps_waiting() == steps) return batching;
    }
    return absl::DeadlineExceededError(absl::StrCat(steps, " steps never waited together"));
  }

  // The counters once at least `steps` decode steps are counted: a batch is counted after its
  // answers go out, so a client that has its answers may read the counters before the count.
  absl::StatusOr<v1::BatchingStats> AwaitCounted(int64_t steps) {
    const auto give_up = Clock::now() + kRpcTimeout;
    absl::StatusOr<v1::BatchingStats> batching;
    do {
      batching = Batching();
    } while (batching.ok() && batching->decode_steps() < steps && Clock::now() < give_up);
    return batching;
  }

  // The re-prefill of stream d: Release its request, Forward its next one (d2).
  void Reprefill() {
    grpc::Status status = Release(stub(), session_, "d");
    ASSERT_TRUE(status.ok()) << Describe(status);
    v1::ForwardRequest forward;
    forward.set_session_id(session_);
    *forward.add_items() = MakeForwardItem("d2", RandomHidden(16, spec_.d_model, rng_));
    v1::ForwardResponse forwarded;
    status = Forward(stub(), forward, &forwarded);
    ASSERT_TRUE(status.ok()) << Describe(status);
  }

  static constexpr std::chrono::seconds kGiveUp{1};  // --max_queue_delay.
  const LayerSpec spec_ = SmallBiasedGqa();
  std::mt19937_64 rng_{11};
  std::string session_;
  std::deque<AsyncStep> steps_;  // A deque: a step's address stays put while its thread runs.
};

TEST_F(ReprefillTest, ReleaseAndForwardLeaveTheBatchBeingFormed) {
  const Clock::time_point start = Clock::now();
  AsyncStep& a = StepAsync("a");
  absl::StatusOr<v1::BatchingStats> before = AwaitWaiting(1);  // a waits for b (and d).
  ASSERT_TRUE(before.ok()) << before.status();
  Reprefill();
  absl::StatusOr<v1::BatchingStats> after_ops = Batching();
  const bool conclusive = Clock::now() - start < kGiveUp;
  // b comes back: every stream the last batch answered is here, so a and b run as one batch.
  AsyncStep& b = StepAsync("b");
  JoinSteps();
  ASSERT_TRUE(a.status.ok()) << Describe(a.status);
  ASSERT_TRUE(b.status.ok()) << Describe(b.status);
  ASSERT_TRUE(after_ops.ok()) << after_ops.status();
  absl::StatusOr<v1::BatchingStats> end = AwaitCounted(before->decode_steps() + 2);
  ASSERT_TRUE(end.ok()) << end.status();
  if (!conclusive) GTEST_SKIP() << "the RPCs took longer than --max_queue_delay";
  // Both ops were answered while a still waited: they did not launch it alone.
  EXPECT_EQ(after_ops->decode_batches(), before->decode_batches()) << "the re-prefill cut the batch";
  EXPECT_EQ(after_ops->decode_steps_waiting(), 1);
  EXPECT_EQ(end->decode_batches() - before->decode_batches(), 1);
  EXPECT_EQ(end->decode_steps() - before->decode_steps(), 2);
}

// A Forward without items names no request, which the scheduler reads as an op on every request
// (as a whole-session Release is): posted as one, it flushed the batch being formed and launched a
// alone, although the call then failed INVALID_ARGUMENT. It is refused before it reaches the
// scheduler now, so a failed call leaves the batch as it was.
TEST_F(ReprefillTest, AForwardWithoutItemsFailsWithoutCuttingTheBatch) {
  const Clock::time_point start = Clock::now();
  AsyncStep& a = StepAsync("a");
  absl::StatusOr<v1::BatchingStats> before = AwaitWaiting(1);  // a waits for b and d.
  ASSERT_TRUE(before.ok()) << before.status();
  v1::ForwardRequest empty;
  empty.set_session_id(session_);
  v1::ForwardResponse refused;
  const grpc::Status status = Forward(stub(), empty, &refused);
  absl::StatusOr<v1::BatchingStats> after_call = Batching();
  const bool conclusive = Clock::now() - start < kGiveUp;
  // b and d come back: a, b and d run as one batch.
  AsyncStep& b = StepAsync("b");
  AsyncStep& d = StepAsync("d");
  JoinSteps();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << Describe(status);
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("items: must not be empty"));
  ASSERT_TRUE(a.status.ok()) << Describe(a.status);
  ASSERT_TRUE(b.status.ok()) << Describe(b.status);
  ASSERT_TRUE(d.status.ok()) << Describe(d.status);
  ASSERT_TRUE(after_call.ok()) << after_call.status();
  absl::StatusOr<v1::BatchingStats> end = AwaitCounted(before->decode_steps() + 3);
  ASSERT_TRUE(end.ok()) << end.status();
  if (!conclusive) GTEST_SKIP() << "the RPCs took longer than --max_queue_delay";
  EXPECT_EQ(after_call->decode_batches(), before->decode_batches())
      << "the failed Forward launched the batch being formed";
  EXPECT_EQ(after_call->decode_steps_waiting(), 1);
  EXPECT_EQ(end->decode_batches() - before->decode_batches(), 1);
  EXPECT_EQ(end->decode_steps() - before->decode_steps(), 3);
}

TEST_F(ReprefillTest, ReleaseOfTheLastAwaitedStreamLaunchesTheBatch) {
  const Clock::time_point start = Clock::now();
  AsyncStep& a = StepAsync("a");
  AsyncStep& b = StepAsync("b");
  absl::StatusOr<v1::BatchingStats> before = AwaitWaiting(2);  // a and b wait for d.
  ASSERT_TRUE(before.ok()) << before.status();
  // d's request is released: nothing is left to wait for, so a and b run then, before the
  // Release is answered, not at the give-up 1 s after they came back.
  Reprefill();
  const Clock::duration released = Clock::now() - start;
  JoinSteps();
  ASSERT_TRUE(a.status.ok()) << Describe(a.status);
  ASSERT_TRUE(b.status.ok()) << Describe(b.status);
  absl::StatusOr<v1::BatchingStats> end = AwaitCounted(before->decode_steps() + 2);
  ASSERT_TRUE(end.ok()) << end.status();
  if (released >= kGiveUp) GTEST_SKIP() << "the RPCs took longer than --max_queue_delay";
  EXPECT_EQ(end->decode_batches() - before->decode_batches(), 1);
  EXPECT_EQ(end->decode_steps() - before->decode_steps(), 2);
  const int64_t released_ns = std::chrono::nanoseconds(released).count();
  EXPECT_LT(a.response.timing().queue_ns(), released_ns) << "a waited for its give-up";
  EXPECT_LT(b.response.timing().queue_ns(), released_ns) << "b waited for its give-up";
}

// Issue 23, third round: a batch waits for the streams still out for as long as the streams took
// to come back before, not only for the gap of --max_queue_delay or a batch's engine time (64 MQA
// streams on 2 cores came back in bursts, with pauses longer than a 1.5 ms batch: the batches split
// at about 45). Here the gap is 1 us, so only that return wait can hold a batch: the streams ab
// (one call of two steps) and d were answered together; d stays out for kTeachingRounds rounds of
// ab, then comes back, late, which tells the scheduler that a stream may be that late (at most 4
// rounds); ab then comes back after d and the counters have been read, about a round later, and
// finds d still waiting for it: one batch of three. Each wait is for an answer or for the server's
// counters, never a sleep. The check (four reads of the counters and two steps, as long as a
// teaching round's four reads and one step, far longer than the 1 us gap or a batch's engine time)
// is skipped as inconclusive when its client-side time from the answers to ab's step is not below
// 2.5 of the last teaching round's: the server waits about 4.
class ReturnWaitTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--max_batch_size=64", "--max_queue_delay=1us"};
  }
};

TEST_F(ReturnWaitTest, ABatchWaitsForAStreamAsLongAsStreamsTookToComeBack) {
  constexpr int kTeachingRounds = 6;
  const LayerSpec spec = SmallBiasedGqa();
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(spec, 13), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const std::string session = configured.session_id();
  std::mt19937_64 rng(13);
  auto batching = [&] { return GetBatchingStats(stub(), session); };
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  v1::DecodeRequest all, ab, d;
  for (v1::DecodeRequest* request : {&all, &ab, &d}) request->set_session_id(session);
  for (const char* id : {"a", "b", "d"}) {
    *forward.add_items() = MakeForwardItem(id, RandomHidden(16, spec.d_model, rng));
    *all.add_items() = MakeDecodeItem(id, RandomHidden(1, spec.d_model, rng));
    *(id[0] == 'd' ? d : ab).add_items() = MakeDecodeItem(id, RandomHidden(1, spec.d_model, rng));
  }
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  v1::DecodeResponse decoded;
  status = Decode(stub(), all, &decoded);  // One batch answers a, b and d.
  ASSERT_TRUE(status.ok()) << Describe(status);

  grpc::ClientContext ab_context, d_context;
  SetDeadline(ab_context);
  SetDeadline(d_context);
  auto ab_stream = stub().DecodeStream(&ab_context);
  auto d_stream = stub().DecodeStream(&d_context);
  v1::DecodeResponse response;
  // The counters once `steps` steps are counted (a batch is counted after its answers go out).
  auto counted = [&](int64_t steps) -> absl::StatusOr<v1::BatchingStats> {
    absl::StatusOr<v1::BatchingStats> counters;
    for (const Clock::time_point give_up = Clock::now() + kRpcTimeout; Clock::now() < give_up;) {
      counters = batching();
      if (!counters.ok() || counters->decode_steps() >= steps) break;
    }
    return counters;
  };
  // Round 0 gives up on d (nothing measured yet, a 1 us gap); rounds 1.. are ab's alone, one
  // batch each. A round reads the counters kReads times before ab's step, as the check below
  // does: the round's length is what the scheduler learns, and it is made of RPCs, not sleeps.
  constexpr int kReads = 4;
  using Duration = Clock::duration;
  int64_t steps = 3, batches = 1;  // `all`: one batch of 3.
  Clock::time_point answered = Clock::now();
  Duration last_round{};
  for (int round = 0; round <= kTeachingRounds; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    for (int read = 0; read < kReads; ++read) {
      absl::StatusOr<v1::BatchingStats> counters = counted(steps);
      ASSERT_TRUE(counters.ok()) << counters.status();
      ASSERT_EQ(counters->decode_steps(), steps);
      ASSERT_EQ(counters->decode_batches(), batches) << "ab's call did not run as one batch";
      ASSERT_EQ(counters->decode_steps_waiting(), 0) << "a step of d before its time";
    }
    ASSERT_TRUE(ab_stream->Write(ab));
    last_round = Clock::now() - answered;
    ASSERT_TRUE(ab_stream->Read(&response));
    answered = Clock::now();
    steps += 2;
    ++batches;
  }
  absl::StatusOr<v1::BatchingStats> before = counted(steps);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(before->decode_steps(), steps);
  ASSERT_EQ(before->decode_batches(), batches);

  // d comes back, late; the batch it joins waits for ab, which the last batch answered: d is seen
  // waiting on kReads - 1 reads in a row (the gap alone, a batch's engine time of 10-20 us here,
  // is far shorter than one read).
  ASSERT_TRUE(d_stream->Write(d));
  absl::StatusOr<v1::BatchingStats> held;
  const Clock::time_point give_up = Clock::now() + kRpcTimeout;
  for (int seen = 0; seen < kReads - 1 && Clock::now() < give_up;) {
    held = batching();
    if (!held.ok() || held->decode_steps() > steps) break;
    seen = held->decode_steps_waiting() == 1 ? seen + 1 : 0;
  }
  ASSERT_TRUE(ab_stream->Write(ab));
  const Duration check = Clock::now() - answered;
  ASSERT_TRUE(ab_stream->Read(&response));
  ASSERT_TRUE(d_stream->Read(&response));
  ab_stream->WritesDone();
  d_stream->WritesDone();
  status = ab_stream->Finish();
  EXPECT_TRUE(status.ok()) << Describe(status);
  status = d_stream->Finish();
  EXPECT_TRUE(status.ok()) << Describe(status);
  absl::StatusOr<v1::BatchingStats> end = counted(steps + 3);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(end.ok()) << end.status();
  if (check >= 5 * last_round / 2) {
    GTEST_SKIP() << "ab came back " << std::chrono::duration<double, std::micro>(check).count()
                 << " us after the answers, not within 2.5 teaching rounds of "
                 << std::chrono::duration<double, std::micro>(last_round).count() << " us";
  }
  EXPECT_EQ(held->decode_steps_waiting(), 1) << "d did not wait for ab";
  EXPECT_LE(held->decode_steps(), steps)
      << "d ran without ab, which came back within the streams' return time";
  EXPECT_EQ(end->decode_steps(), steps + 3);
  EXPECT_EQ(end->decode_batches(), batches + 1) << "d and ab ran in separate batches";
}

// A lone stream never waits for a batch to form, however long --max_queue_delay is: its request is
// the only one the previous batch answered, so its next step finds nothing else to wait for.
class LoneStreamTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--max_queue_delay=1s"}; }
};

TEST_F(LoneStreamTest, StepsLaunchAtOnce) {
  constexpr int kSteps = 16;
  const LayerSpec spec = SmallBiasedGqa();
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub(), SeedConfigure(spec, 3), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  std::mt19937_64 rng(3);
  v1::ForwardRequest forward;
  forward.set_session_id(configured.session_id());
  *forward.add_items() = MakeForwardItem("only", RandomHidden(16, spec.d_model, rng));
  v1::ForwardResponse forwarded;
  status = Forward(stub(), forward, &forwarded);
  ASSERT_TRUE(status.ok()) << Describe(status);
  grpc::ClientContext context;
  SetDeadline(context);
  auto stream = stub().DecodeStream(&context);
  v1::DecodeRequest request;
  request.set_session_id(configured.session_id());
  *request.add_items() = MakeDecodeItem("only", RandomHidden(1, spec.d_model, rng));
  int64_t longest_queue_ns = 0;
  for (int step = 0; step < kSteps; ++step) {
    v1::DecodeResponse response;
    ASSERT_TRUE(stream->Write(request) && stream->Read(&response)) << "step " << step;
    longest_queue_ns = std::max(longest_queue_ns, response.timing().queue_ns());
  }
  stream->WritesDone();
  status = stream->Finish();
  ASSERT_TRUE(status.ok()) << Describe(status);
  // Far below the 1 s a wait for the batch to fill would take.
  EXPECT_LT(longest_queue_ns, 500'000'000) << "a lone stream's step waited for its batch";
}

// ---- 2. Chunked prefill ----------------------------------------------------------------------

// Runs an 8192-token Forward beside 4 decode streams (on other requests of the same session) and
// returns the longest decode step (client round trip) that overlapped the Forward, the Forward's
// server compute time and its chunk count.
struct PrefillRun {
  double max_step_ms = 0;     // Longest decode step that overlapped the Forward.
  double median_step_ms = 0;  // Of the steps before the Forward.
  double forward_ms = 0;      // Forward compute (all chunks).
  int64_t chunks = 0;
  int overlapping_steps = 0;
  // The most of the Forward's chunks that certainly ran while one decode step waited (from the
  // session's own count, read all along: tests/support/counter_reads.h), and how many distinct
  // counts the reads saw.
  int64_t most_chunks_per_step = 0;
  int64_t chunk_counts_seen = 0;
};

void RunPrefillBesideDecodes(ServerTest& test, v1::AttentionService::Stub& stub,
                             ServerProcess& server, PrefillRun* run) {
  constexpr int kStreams = 4;
  constexpr int64_t kPromptTokens = 8192;
  // A bound on each wait for the streams below, so a broken server fails the test, not hangs it.
  constexpr std::chrono::seconds kWaitLimit{60};
  const LayerSpec spec = SmallBiasedGqa();
  v1::ConfigureResponse configured;
  grpc::Status status = Configure(stub, SeedConfigure(spec, 9), &configured);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const std::string session = configured.session_id();
  std::mt19937_64 rng(9);
  for (int s = 0; s < kStreams; ++s) {
    v1::ForwardRequest forward;
    forward.set_session_id(session);
    *forward.add_items() = MakeForwardItem(absl::StrCat("d", s), RandomHidden(64, 64, rng));
    v1::ForwardResponse ignored;
    status = Forward(stub, forward, &ignored);
    ASSERT_TRUE(status.ok()) << Describe(status);
  }
  absl::StatusOr<v1::SessionInfo> before = GetSessionInfo(stub, session);
  ASSERT_TRUE(before.ok());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> forward_begin_ns{0}, forward_end_ns{0};
  struct Step {
    int64_t begin_ns, end_ns;
  };
  std::vector<std::vector<Step>> steps(kStreams);
  std::vector<std::string> failures(kStreams);
  // Every stream's first answered steps: the decode is in steady state once each stream has 3.
  std::vector<std::atomic<int>> answered(kStreams);
  const Clock::time_point t0 = Clock::now();
  const auto now_ns = [t0] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  std::vector<std::thread> threads;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 local(100 + s);
      auto client = v1::AttentionService::NewStub(server.NewChannel());
      grpc::ClientContext context;
      SetDeadline(context);
      auto stream = client->DecodeStream(&context);
      while (!stop.load()) {
        v1::DecodeRequest request;
        request.set_session_id(session);
        *request.add_items() = MakeDecodeItem(absl::StrCat("d", s), RandomHidden(1, 64, local));
        v1::DecodeResponse response;
        const int64_t begin = now_ns();
        if (!stream->Write(request) || !stream->Read(&response)) break;
        steps[s].push_back({begin, now_ns()});
        answered[s].fetch_add(1);
      }
      stream->WritesDone();
      grpc::Status end = stream->Finish();
      if (!end.ok()) failures[s] = Describe(end);
    });
  }
  // Decodes in steady state: wait until every stream has had 3 steps answered (or has ended).
  for (int s = 0; s < kStreams; ++s) {
    while (answered[s].load() < 3 && Clock::now() < t0 + kWaitLimit) {
      std::this_thread::yield();
    }
  }
  v1::ForwardRequest forward;
  forward.set_session_id(session);
  *forward.add_items() = MakeForwardItem("long", RandomHidden(kPromptTokens, 64, rng));
  v1::ForwardResponse long_response;
  auto reader = v1::AttentionService::NewStub(server.NewChannel());
  CounterReads chunk_count(
      [&]() -> absl::StatusOr<int64_t> {
        absl::StatusOr<v1::SessionInfo> info = GetSessionInfo(*reader, session);
        if (!info.ok()) return info.status();
        return info->batching().prefill_chunks();
      },
      t0);
  forward_begin_ns = now_ns();
  status = Forward(stub, forward, &long_response);
  forward_end_ns = now_ns();
  // Two more steps of every stream after the Forward, so the decodes around its end are measured.
  for (int s = 0; s < kStreams; ++s) {
    const int target = answered[s].load() + 2;
    const Clock::time_point waited = Clock::now();
    while (answered[s].load() < target && Clock::now() < waited + kWaitLimit) {
      std::this_thread::yield();
    }
  }
  stop = true;
  for (std::thread& t : threads) t.join();
  chunk_count.Stop();
  ASSERT_TRUE(status.ok()) << Describe(status);
  ASSERT_EQ(chunk_count.failure(), "");
  for (const std::string& f : failures) EXPECT_EQ(f, "");
  ASSERT_EQ(long_response.results(0).sequence_length(), kPromptTokens);

  absl::StatusOr<v1::SessionInfo> after = GetSessionInfo(stub, session);
  ASSERT_TRUE(after.ok());
  run->chunks = after->batching().prefill_chunks() - before->batching().prefill_chunks();
  run->forward_ms = long_response.timing().compute_ns() * 1e-6;
  std::vector<double> before_forward;
  for (const auto& stream_steps : steps) {
    for (const Step& step : stream_steps) {
      if (step.end_ns < forward_begin_ns)
        before_forward.push_back((step.end_ns - step.begin_ns) * 1e-6);
      if (step.end_ns > forward_begin_ns && step.begin_ns < forward_end_ns) {
        run->max_step_ms = std::max(run->max_step_ms, (step.end_ns - step.begin_ns) * 1e-6);
        run->most_chunks_per_step = std::max(
            run->most_chunks_per_step, chunk_count.CertainlyBetween(step.begin_ns, step.end_ns));
        ++run->overlapping_steps;
      }
    }
  }
  std::sort(before_forward.begin(), before_forward.end());
  if (!before_forward.empty()) run->median_step_ms = before_forward[before_forward.size() / 2];
  run->chunk_counts_seen = chunk_count.DistinctValues();
  (void)test;
}

class ChunkedPrefillTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--prefill_chunk_tokens=512", "--max_sequence_length=16384"};
  }
};

TEST_F(ChunkedPrefillTest, LongForwardDoesNotStallDecodes) {
  PrefillRun run;
  RunPrefillBesideDecodes(*this, stub(), server(), &run);
  if (HasFatalFailure()) return;
  const double chunk_ms = run.forward_ms / std::max<int64_t>(1, run.chunks);
  // In chunks, not milliseconds (was: 8 mean chunks plus 100 ms, which a loaded machine's
  // scheduling could break): one batch of the decodes runs before every chunk after the first, so
  // a step waits for the chunk running when it arrives and perhaps the next, while it reaches the
  // queue; the rest is room for a loaded machine. Far below the whole Forward's 16 chunks, which
  // a step that arrived as it started would wait without chunking.
  constexpr int64_t kMaxChunksPerStep = 4;
  std::cout << "chunked (512): forward " << run.forward_ms << " ms in " << run.chunks << " chunks ("
            << chunk_ms << " ms each); decode step median before " << run.median_step_ms
            << " ms; max during forward " << run.max_step_ms << " ms over " << run.overlapping_steps
            << " steps; at most " << run.most_chunks_per_step << " chunks ran during one step ("
            << run.chunk_counts_seen << " distinct counts read)\n";
  RecordProperty("max_step_ms", std::to_string(run.max_step_ms));
  RecordProperty("chunk_ms", std::to_string(chunk_ms));
  RecordProperty("max_chunks_per_step", std::to_string(run.most_chunks_per_step));
  EXPECT_EQ(run.chunks, 16);
  EXPECT_GT(run.overlapping_steps, run.chunks) << "decodes ran between the chunks";
  // The reads saw the Forward chunk by chunk (else the count below would see nothing).
  EXPECT_GE(run.chunk_counts_seen, run.chunks / 2);
  EXPECT_LE(run.most_chunks_per_step, kMaxChunksPerStep);
}

class UnchunkedPrefillTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--prefill_chunk_tokens=0", "--max_sequence_length=16384"};
  }
};

TEST_F(UnchunkedPrefillTest, LongForwardStallsDecodesWithoutChunking) {
  PrefillRun run;
  RunPrefillBesideDecodes(*this, stub(), server(), &run);
  if (HasFatalFailure()) return;
  std::cout << "unchunked: forward " << run.forward_ms << " ms in " << run.chunks
            << " chunk; decode step median before " << run.median_step_ms
            << " ms; max during forward " << run.max_step_ms << " ms over " << run.overlapping_steps
            << " steps\n";
  RecordProperty("max_step_ms", std::to_string(run.max_step_ms));
  EXPECT_EQ(run.chunks, 1);
  EXPECT_GT(run.max_step_ms, 0.5 * run.forward_ms);
}

}  // namespace
}  // namespace attnserve::server_test
