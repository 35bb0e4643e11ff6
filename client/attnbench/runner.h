// attnbench's measurement: for one layer variant, one context length and one concurrency C, a
// fresh session holds C requests at a time, each decoded over its stream's DecodeStream, one step
// at a time (send a step, wait for its answer, send the next: autoregressive use), by C client
// threads started together. The context is held steady: each request is prefilled to
// context - steps_per_request / 2 tokens, decodes steps_per_request steps, is released and a fresh
// one is prefilled in its place on the same stream, so the contexts the steps ran at average the
// requested context and never exceed context + steps_per_request / 2 (the first request of stream
// i starts i / C of the way into its steps, so the streams do not re-prefill in lock step). The
// time a stream spends releasing and re-prefilling is reported apart and not counted as decode
// time. The run stops after a duration or a number of steps per stream. Every wait is bounded: each call has a
// deadline and a watchdog cancels a stream whose step has been outstanding for --step_timeout; a
// failed stream is counted and reported, never waited on.
#ifndef ATTNSERVE_CLIENT_ATTNBENCH_RUNNER_H_
#define ATTNSERVE_CLIENT_ATTNBENCH_RUNNER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/attnbench/server_stats.h"
#include "client/common/client.h"
#include "client/common/demo_variants.h"
#include "kernels/core/tensor.h"

namespace attnserve {

struct BenchCell {
  NamedSpec variant;    // One of DemoVariants().
  int context = 512;    // Mean context the decode steps run at.
  int concurrency = 1;  // Streams (= requests) decoding at once.
  // Weights from a checkpoint under the server's --checkpoint_root instead of a seed; with
  // spec_from_checkpoint the spec is the one the server reads from the checkpoint.
  std::string checkpoint;
  int layer = 0;
  bool spec_from_checkpoint = false;
};

// Decode steps per request when --steps_per_request is 0: a quarter of the context (at least 1),
// so the steps run within context +- 12.5%.
int64_t DefaultStepsPerRequest(int context);
// Tokens each request is prefilled to: context - steps_per_request / 2, at least 1.
int64_t PrefillTokens(int context, int64_t steps_per_request);

struct BenchOptions {
  absl::Duration duration = absl::Seconds(10);      // Used when steps == 0.
  int64_t steps = 0;                                // > 0: exactly this many steps per stream.
  int64_t steps_per_request = 0;  // Decode steps before a request is replaced; 0 = default.
  absl::Duration step_timeout = absl::Seconds(30);  // A step outstanding longer is cancelled.
  DType kv_dtype = DType::kF32;
  uint64_t seed = 1;      // Weights and inputs.
  bool progress = false;  // A \r-updated line on stderr.
};

struct BenchResult {
  std::string variant;  // "mha", "gqa", "mqa", "mla"
  std::string label;    // "GQA-4"
  std::string spec;     // LayerSpecSummary
  int context = 0;
  int concurrency = 0;
  int64_t kv_bytes_per_token = 0;

  int64_t steps = 0;   // Decode steps answered (= tokens decoded), all streams.
  double seconds = 0;  // From the common start to the last stream's last answer.
  // steps / (seconds - reprefill_seconds): decode only, the streams' re-prefills left out.
  double tokens_per_s = 0;
  double wall_tokens_per_s = 0;  // steps / seconds, re-prefills included.
  int64_t tokens_cap = 0;        // The per-request token cap that applied.

  // The context held steady: every request is prefilled to prefill_tokens and decodes
  // steps_per_request steps; mean/max over the answered steps of the sequence length each step
  // produced (the tokens its attention read, its own included).
  int64_t steps_per_request = 0;
  int64_t prefill_tokens = 0;
  double mean_context = 0;
  int64_t max_context = 0;
  // Re-prefills inside the timed window (the first prefill of each stream is before it): how
  // many, their Forward latency, and the mean time per stream spent releasing and re-prefilling.
  int64_t reprefills = 0;
  double prefill_p50_ms = 0, prefill_p99_ms = 0, prefill_mean_ms = 0;
  double reprefill_seconds = 0;

  // Client-measured step latency (Write to Read of one step), milliseconds.
  double latency_mean_ms = 0, latency_p50_ms = 0, latency_p90_ms = 0, latency_p99_ms = 0,
         latency_max_ms = 0;
  // Server Timing per step, mean, milliseconds.
  double queue_ms = 0, compute_ms = 0, server_total_ms = 0;

  BatchSummary batch;
  // Mean over this run's steps of Timing.batch_size (the batch each step rode in), when the
  // server reports it; 0 otherwise. Step-weighted, so >= the mean batch size of the server.
  double step_batch_size = 0;

  int errors = 0;  // Failed streams (or setup failures).
  std::map<std::string, int> errors_by_code;
  std::vector<std::string> error_messages;  // The first few, "stream 3 step 17: CODE: message".
};

// Configures the cell's layer (its spec, or the checkpoint's) with max_requests; on success
// `spec` is the layer the server configured.
grpc::Status ConfigureSession(const Client& client, const BenchCell& cell, DType kv_dtype,
                              uint64_t seed, int max_requests, v1::ConfigureResponse* configured,
                              LayerSpec* spec);

// The p-quantile (0 < p <= 1, nearest rank) of sorted values; 0 when empty.
double Percentile(const std::vector<double>& sorted, double p);

// Runs one cell against `client`'s server. Never throws or aborts; failures land in the result.
BenchResult RunCell(const Client& client, const ServerBatchStats& batch_stats,
                    const BenchOptions& options, const BenchCell& cell);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNBENCH_RUNNER_H_
