// attnbench's soak mode: one cell (variant, context, concurrency) run again and again for a long
// time, to show that the server neither fails nor grows under sustained load.
//
// The soak is `rounds` rounds of `round_duration` each; every round is a full attnbench cell (a
// fresh session, C requests prefilled, C DecodeStream streams decoding, the session released),
// so sessions, requests, streams and KV pages are created and freed all the time. After every
// round the server's resident memory is read (its floor: the round's session is gone), and
// during every round it is sampled twice a second (its peak: the working set under this load).
// The first `warmup_rounds` rounds let allocator pools, thread stacks and caches settle. A leak
// shows as a trend in the floors: the drift is the least-squares slope of the floors over the
// rounds after the warm-up, times their span (the growth the soak shows), relative to the mean
// peak. A single floor reading jitters by a few MiB with the allocator's state, so the slope,
// not the last reading, is what is judged. The soak passes with 0 errors and a drift under
// `max_rss_drift`.
#ifndef ATTNSERVE_CLIENT_ATTNBENCH_SOAK_H_
#define ATTNSERVE_CLIENT_ATTNBENCH_SOAK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/attnbench/runner.h"

namespace attnserve {

struct SoakOptions {
  int rounds = 10;
  int warmup_rounds = 2;
  double max_rss_drift = 0.01;
  // Where the server's resident memory comes from: /proc/<pid>/status when `server_pid` > 0 (a
  // server on this machine), else the metrics endpoint's attnserve_device_memory_bytes{state=
  // "used"}, which the CPU backend fills with the process's VmRSS.
  int server_pid = 0;
  std::string metrics_address;  // HOST:PORT, as attnbench --metrics.
};

struct SoakRound {
  BenchResult result;
  int64_t rss_bytes = -1;       // After the round (the floor); -1: could not be read.
  int64_t peak_rss_bytes = -1;  // Largest sample during the round.
};

struct SoakReport {
  std::vector<SoakRound> rounds;
  int64_t errors = 0;
  int64_t steps = 0;
  int64_t rss_after_warmup = -1;
  int64_t rss_at_end = -1;
  double floor_slope_bytes = 0;         // Per round, least squares over the post-warm-up rounds.
  double floor_slope_stderr_bytes = 0;  // Its standard error.
  double growth_bytes = 0;              // floor_slope_bytes * (post-warm-up rounds - 1).
  double mean_peak_bytes = 0;           // Mean of the post-warm-up rounds' peaks.
  double rss_drift = 0;                 // growth_bytes / mean_peak_bytes.
  bool rss_known = false;
  bool passed = false;
  std::string verdict;  // One line: why it passed or failed.
};

// Runs the soak. `options.duration` is each round's length. Never aborts; the report says what
// happened.
SoakReport RunSoak(const Client& client, const ServerBatchStats& batch_stats,
                   const BenchOptions& options, const BenchCell& cell, const SoakOptions& soak);

// The server's resident memory now, as `soak` says where to find it; -1 when unknown.
int64_t ServerResidentBytes(const SoakOptions& soak);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNBENCH_SOAK_H_
