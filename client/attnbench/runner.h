// attnbench's measurement: for one layer variant, one context length and one concurrency C, a
// fresh session holds C requests, each prefilled to the context length by its own Forward call
// and then decoded over its own DecodeStream, one step at a time (send a step, wait for its
// answer, send the next: autoregressive use), by C client threads started together. The run
// stops after a duration or a number of steps per stream. Every wait is bounded: each call has a
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
#include "kernels/core/dtype.h"

namespace attnserve {

struct BenchCell {
  NamedSpec variant;    // One of DemoVariants().
  int context = 512;    // Prompt tokens prefilled per request before decoding.
  int concurrency = 1;  // Streams (= requests) decoding at once.
};

struct BenchOptions {
  absl::Duration duration = absl::Seconds(10);      // Used when steps == 0.
  int64_t steps = 0;                                // > 0: exactly this many steps per stream.
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
  double tokens_per_s = 0;
  int streams_capped = 0;  // Streams stopped early by max_sequence_length or the KV pool.
  int64_t tokens_cap = 0;  // The per-request token cap that applied.

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

// Runs one cell against `client`'s server. Never throws or aborts; failures land in the result.
BenchResult RunCell(const Client& client, const ServerBatchStats& batch_stats,
                    const BenchOptions& options, const BenchCell& cell);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNBENCH_RUNNER_H_
