// Where attnbench reads the server's decode batch sizes from. The API has no dedicated field for
// them (yet), so every source is probed and the ones that answer are reported:
//   - GetSession / GetServerInfo counters, found by name through protobuf reflection: an integer
//     field named like "*batches" (batches launched) beside one counting the steps those batches
//     held ("decode_steps", "batched_steps", "*batch_size_sum", ...). Mean batch size is
//     delta(steps) / delta(batches) over the run.
//   - The Prometheus text endpoint (--metrics=HOST:PORT): the attnserve_batch_size histogram's
//     _sum and _count series whose `variant` label is the benchmarked variant. Mean batch size is
//     delta(_sum) / delta(_count).
// A source that is absent is reported as such; the benchmark never fails for lack of one.
#ifndef ATTNSERVE_CLIENT_ATTNBENCH_SERVER_STATS_H_
#define ATTNSERVE_CLIENT_ATTNBENCH_SERVER_STATS_H_

#include <map>
#include <string>

#include "absl/time/time.h"
#include "client/common/client.h"

namespace attnserve {

// Cumulative counters of one source at one instant.
struct BatchCounter {
  double batches = 0;  // Batches launched (histogram _count).
  double steps = 0;    // Decode steps they held, summed (histogram _sum).
};

struct BatchSnapshot {
  std::map<std::string, BatchCounter> sources;  // Source description -> counters.
  std::string metrics_error;                    // Why /metrics could not be read ("" = fine).
  double max_batch = 0;  // The session's largest decode batch so far (GetSession), 0 = unknown.
};

struct BatchSummary {
  bool available = false;
  std::string source;  // Which source the mean comes from; "" when none answered.
  double mean = 0;     // Mean decode batch size (steps per batch) during the run.
  double batches = 0;  // Batches launched during the run.
  double max = 0;      // The session's largest decode batch (since Configure), 0 = unknown.
  std::string note;    // Why not available, or other sources' disagreement.
};

class ServerBatchStats {
 public:
  // `metrics_address`: "" (no scrape), "HOST:PORT" or "http://HOST:PORT[/path]" (default path
  // /metrics). Each probe is bounded by `timeout`.
  ServerBatchStats(const Client& client, std::string metrics_address, absl::Duration timeout);

  // Counters now, for `session_id` and the Prometheus `variant` label value `variant_label`
  // (series whose label is `variant_label` or starts with `variant_label` + "_" are summed).
  BatchSnapshot Take(const std::string& session_id, const std::string& variant_label) const;

  // The mean batch size between two snapshots of the same session. Prefers the session's own
  // counters, then /metrics, then the server-wide counters.
  static BatchSummary Between(const BatchSnapshot& before, const BatchSnapshot& after);

 private:
  const Client& client_;
  std::string metrics_host_port_;
  std::string metrics_path_;
  absl::Duration timeout_;
};

// GET http://host_port/path with every socket wait bounded by `timeout`. Returns false and sets
// `error` on failure or a non-200 status; `body` gets the response body.
bool HttpGet(const std::string& host_port, const std::string& path, absl::Duration timeout,
             std::string* body, std::string* error);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNBENCH_SERVER_STATS_H_
