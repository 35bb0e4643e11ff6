// Reliability issue item 11: a session's long Forward must not hold an executor thread for its
// whole prefill. Two sessions on a server with one executor thread (--compute_threads=1, so the
// two sessions compete for it): session B decodes one token at a time, over and over; session A
// sends two 8,000-token Forwards one after the other, prefilled in chunks of 512 rows. Every chunk
// is one task on A's queue and the next one is posted to the back of the executor's queue, so B's
// step waits at most about one chunk, not the rest of A's Forward.
//
// The order is asserted in chunks, from the server's own counter, not in milliseconds (issue 18
// item 4; was: B's largest step latency against 6 mean chunk times, which a loaded machine's
// scheduling could break): A's GetSession counts its prefill chunks as each runs, and the test
// reads it all along (tests/support/counter_reads.h), so for every step of B it knows how many
// of A's chunks certainly ran between the step's send and its answer. At most kMaxChunksPerStep:
// the chunk running when the step arrived, one more while the step reaches the executor, and
// room for a loaded machine. Before the change a step that arrived as A's Forward started waited
// for all of its 16 chunks (checked again: 16 with the chunk loop made to run in one turn).
//
// B's p50/p99/max step latency without A's load and during it are printed (docs/reliability.md,
// "Fairness between sessions" records them). Events only: the phases wait for B's answered steps
// and for A's calls to return, never for a sleep.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "tests/support/counter_reads.h"
#include "tests/support/server_fixture.h"

namespace attnserve::server_test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kPromptTokens = 8000;
constexpr int kForwards = 2;
constexpr int kBaselineSteps = 100;  // B's steps without A's load.
constexpr int64_t kMaxChunksPerStep = 4;

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

class FairnessTest : public ServerTest {
 protected:
  std::vector<std::string> ExtraFlags() const override {
    return {"--compute_threads=1", "--prefill_chunk_tokens=512", "--max_sequence_length=16384"};
  }
};

TEST_F(FairnessTest, DecodeWaitsAboutOneChunkBehindAnotherSessionsLongForward) {
  const LayerSpec spec = SmallBiasedGqa();
  std::string sessions[2];
  for (int s = 0; s < 2; ++s) {
    v1::ConfigureResponse configured;
    grpc::Status status = Configure(stub(), SeedConfigure(spec, 21 + s), &configured);
    ASSERT_TRUE(status.ok()) << Describe(status);
    sessions[s] = configured.session_id();
  }
  const std::string& session_a = sessions[0];
  const std::string& session_b = sessions[1];
  std::mt19937_64 rng(21);
  {
    v1::ForwardRequest forward;
    forward.set_session_id(session_b);
    *forward.add_items() = MakeForwardItem("b", RandomHidden(64, spec.d_model, rng));
    v1::ForwardResponse ignored;
    grpc::Status status = Forward(stub(), forward, &ignored);
    ASSERT_TRUE(status.ok()) << Describe(status);
  }

  // B's decode loop: one-token Decode calls, back to back, until told to stop.
  struct Step {
    int64_t begin_ns, end_ns;
  };
  const Clock::time_point t0 = Clock::now();
  const auto now_ns = [t0] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
  };
  absl::Mutex mu;
  std::vector<Step> steps;  // Guarded by mu.
  bool stop = false;        // Guarded by mu.
  std::string failure;      // Guarded by mu.
  std::thread decoder([&] {
    std::mt19937_64 local(22);
    auto client = v1::AttentionService::NewStub(server().NewChannel());
    while (true) {
      {
        absl::MutexLock lock(&mu);
        if (stop) return;
      }
      v1::DecodeRequest request;
      request.set_session_id(session_b);
      *request.add_items() = MakeDecodeItem("b", RandomHidden(1, spec.d_model, local));
      v1::DecodeResponse response;
      const int64_t begin = now_ns();
      grpc::Status status = Decode(*client, request, &response);
      const int64_t end = now_ns();
      absl::MutexLock lock(&mu);
      if (!status.ok()) {
        failure = Describe(status);
        return;
      }
      steps.push_back({begin, end});
    }
  });
  // Waits (no sleeping) until B has `count` answered steps or failed.
  const auto await_steps = [&](size_t count) {
    absl::MutexLock lock(&mu);
    struct Wait {
      const std::vector<Step>* steps;
      const std::string* failure;
      size_t count;
      bool Ready() const { return steps->size() >= count || !failure->empty(); }
    } wait{&steps, &failure, count};
    mu.Await(absl::Condition(&wait, &Wait::Ready));
  };

  // Phase 1: B alone.
  await_steps(kBaselineSteps);
  int64_t load_begin_ns = 0, load_end_ns = 0;
  {
    absl::MutexLock lock(&mu);
    load_begin_ns = now_ns();
  }
  // A's chunk count, read all along from phase 2 on.
  auto reader = v1::AttentionService::NewStub(server().NewChannel());
  CounterReads a_chunks(
      [&]() -> absl::StatusOr<int64_t> {
        grpc::ClientContext context;
        SetDeadline(context);
        v1::GetSessionRequest get;
        get.set_session_id(session_a);
        v1::GetSessionResponse info;
        const grpc::Status status = reader->GetSession(&context, get, &info);
        if (!status.ok()) return absl::InternalError(Describe(status));
        return info.session().batching().prefill_chunks();
      },
      t0);
  // Phase 2: A's long Forwards, one after the other, while B keeps decoding.
  int64_t compute_ns = 0;
  grpc::Status forward_status;
  for (int f = 0; f < kForwards && forward_status.ok(); ++f) {
    v1::ForwardRequest forward;
    forward.set_session_id(session_a);
    *forward.add_items() =
        MakeForwardItem(absl::StrCat("a", f), RandomHidden(kPromptTokens, spec.d_model, rng));
    v1::ForwardResponse response;
    grpc::ClientContext context;
    SetDeadline(context, std::chrono::seconds(120));
    forward_status = stub().Forward(&context, forward, &response);
    if (forward_status.ok()) compute_ns += response.timing().compute_ns();
  }
  load_end_ns = now_ns();
  // Two more steps of B after the load, so the steps around its end are measured.
  size_t after_load = 0;
  {
    absl::MutexLock lock(&mu);
    after_load = steps.size() + 2;
  }
  await_steps(after_load);
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  decoder.join();
  a_chunks.Stop();
  ASSERT_TRUE(forward_status.ok()) << Describe(forward_status);
  ASSERT_EQ(failure, "");
  ASSERT_EQ(a_chunks.failure(), "");

  grpc::ClientContext context;
  SetDeadline(context);
  v1::GetSessionRequest get;
  get.set_session_id(session_a);
  v1::GetSessionResponse info;
  grpc::Status status = stub().GetSession(&context, get, &info);
  ASSERT_TRUE(status.ok()) << Describe(status);
  const int64_t chunks = info.session().batching().prefill_chunks();
  ASSERT_EQ(chunks, kForwards * ((kPromptTokens + 511) / 512));
  const double chunk_ms = compute_ns * 1e-6 / static_cast<double>(chunks);

  std::vector<double> alone, loaded;
  for (const Step& step : steps) {
    const double ms = (step.end_ns - step.begin_ns) * 1e-6;
    if (step.end_ns < load_begin_ns) alone.push_back(ms);
    if (step.end_ns > load_begin_ns && step.begin_ns < load_end_ns) loaded.push_back(ms);
  }
  ASSERT_FALSE(alone.empty());
  const double max_loaded = Percentile(loaded, 1.0);

  // For each of B's steps during the load, the chunks of A that certainly ran while it waited.
  int64_t most_chunks = 0;
  for (const Step& step : steps) {
    if (step.end_ns > load_begin_ns && step.begin_ns < load_end_ns) {
      most_chunks = std::max(most_chunks, a_chunks.CertainlyBetween(step.begin_ns, step.end_ns));
    }
  }
  std::cout << "A: " << kForwards << " Forwards of " << kPromptTokens << " tokens in " << chunks
            << " chunks of 512, mean chunk " << chunk_ms << " ms, load lasted "
            << (load_end_ns - load_begin_ns) * 1e-6 << " ms\n"
            << "B alone (" << alone.size() << " steps): p50 " << Percentile(alone, 0.5)
            << " ms, p99 " << Percentile(alone, 0.99) << " ms, max " << Percentile(alone, 1.0)
            << " ms\n"
            << "B during A's Forwards (" << loaded.size() << " steps): p50 "
            << Percentile(loaded, 0.5) << " ms, p99 " << Percentile(loaded, 0.99) << " ms, max "
            << max_loaded << " ms\n"
            << "A's chunks run during one step of B: at most " << most_chunks << " (bound "
            << kMaxChunksPerStep << "; " << a_chunks.size() << " reads of A's count, "
            << a_chunks.DistinctValues()
            << " distinct)\n";
  RecordProperty("chunk_ms", std::to_string(chunk_ms));
  RecordProperty("max_step_ms", std::to_string(max_loaded));
  RecordProperty("max_chunks_per_step", std::to_string(most_chunks));
  // B kept being served during the load: more than one step per chunk of A.
  EXPECT_GT(loaded.size(), static_cast<size_t>(chunks));
  // The reads saw A's Forwards chunk by chunk (else the count below would see nothing).
  EXPECT_GE(a_chunks.DistinctValues(), chunks / 2);
  EXPECT_LE(most_chunks, kMaxChunksPerStep);
}

}  // namespace
}  // namespace attnserve::server_test
