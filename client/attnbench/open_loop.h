// attnbench --mode=open_loop: requests arrive on their own schedule, as in vLLM's serving
// benchmark (benchmarks/benchmark_serving.py), instead of C streams each waiting for its last
// answer. Arrivals are a Poisson process of rate R (exponential gaps, seeded), for --duration or
// --num_requests; each request, on its own client thread: a Forward of --prompt_tokens (its first
// token), then --steps_per_request decode steps over its own DecodeStream (one outstanding),
// then Release. Reported: time to first token (scheduled arrival to the prefill's answer, so a
// late start counts against the server, not hidden by the client), inter-token latency (one
// decode step, Write to Read), end-to-end latency, and the throughput achieved (requests and
// decode tokens per second from the first arrival to the last answer). At most --max_in_flight
// requests run at once; an arrival past that waits (its TTFT still counts from its scheduled
// time) and is counted as delayed.
#ifndef ATTNSERVE_CLIENT_ATTNBENCH_OPEN_LOOP_H_
#define ATTNSERVE_CLIENT_ATTNBENCH_OPEN_LOOP_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/attnbench/runner.h"
#include "client/common/client.h"
#include "kernels/core/tensor.h"

namespace attnserve {

struct OpenLoopOptions {
  double rate = 1;                                 // Requests per second (Poisson arrivals).
  absl::Duration duration = absl::Seconds(10);     // Arrival window when num_requests == 0.
  int64_t num_requests = 0;                        // > 0: exactly this many arrivals.
  int prompt_tokens = 512;                         // Prefilled per request.
  int64_t decode_steps = 128;                      // Decode steps per request after the prefill.
  int max_in_flight = 256;                         // Requests running at once, at most.
  absl::Duration step_timeout = absl::Seconds(30);  // Deadline of each decode step's answer.
  DType kv_dtype = DType::kF32;
  uint64_t seed = 1;  // Weights, inputs and arrival times.
};

struct LatencySummary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // Milliseconds.
};

struct OpenLoopResult {
  std::string variant, label, spec;
  double rate = 0;  // Requested.
  int prompt_tokens = 0;
  int64_t decode_steps = 0;
  int max_in_flight = 0;

  int64_t requests_sent = 0;       // Arrivals started.
  int64_t requests_completed = 0;  // Every step answered, no error.
  int64_t requests_delayed = 0;    // Started late because max_in_flight requests were running.
  int peak_in_flight = 0;
  int64_t tokens = 0;              // Decode steps answered, all requests.
  double arrival_seconds = 0;      // First to last arrival.
  double seconds = 0;              // First arrival to the last answer.
  double achieved_rate = 0;        // requests_sent / arrival window (what was offered).
  double request_throughput = 0;   // requests_completed / seconds.
  double tokens_per_s = 0;         // tokens / seconds.
  double mean_context = 0;         // Of the decode steps answered.

  LatencySummary ttft_ms, itl_ms, e2e_ms;

  int errors = 0;  // Failed requests (or setup failures).
  std::map<std::string, int> errors_by_code;
  std::vector<std::string> error_messages;
};

// One open-loop run at `options.rate` of the layer `cell` names (its context and concurrency are
// not used). Never throws; failures land in the result.
OpenLoopResult RunOpenLoop(const Client& client, const OpenLoopOptions& options,
                           const BenchCell& cell);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNBENCH_OPEN_LOOP_H_
