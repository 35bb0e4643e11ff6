// Prometheus metrics of the server: one object owning the prometheus-cpp registry and every metric
// family, with small typed methods the service, the scheduler and the TTL sweeper call, and an
// optional HTTP endpoint (metrics_http_server.h, not prometheus-cpp's Exposer: see there why)
// serving the text exposition at /metrics.
//
// Series of calls, batches and sessions carry `variant` (VariantLabel: mha, mqa, gqa, mla, plus
// "_swa" with a sliding window; "none" for calls that name no valid session) and no per-request
// or per-session label, so the number of series is bounded by rpcs x variants x codes. Whatever
// belongs to the replica as a whole (the pool's capacity, device memory, build, process_*) is one
// series without `variant`, and no series is an aggregate of others (no variant="all"): with N
// replicas, sum() over any family is right. docs/metrics.md lists every metric; the names are a
// contract with deploy/ (Grafana dashboard, Prometheus test).
//
// Gauges of state (KV pool, sessions, requests, device memory) are not pushed by the service:
// they are computed from the KvPool and the SessionRegistry at the start of every scrape, so they
// are exact at scrape time and cost nothing between scrapes.
//
// Threading: every method is thread-safe and quick (a short mutex around a label lookup; the
// prometheus-cpp metrics themselves are atomic), so gRPC handlers may call them.
#ifndef ATTNSERVE_SERVER_OBSERVABILITY_METRICS_H_
#define ATTNSERVE_SERVER_OBSERVABILITY_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/spec/layer_spec.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace attnserve::server {

class KvPool;
class MetricsHttpServer;
class SessionRegistry;

// The `variant` label of a spec: "mha", "mqa", "gqa" or "mla", plus "_swa" when the spec has a
// sliding window (e.g. "gqa_swa").
std::string VariantLabel(const LayerSpec& spec);
// The label of calls that name no valid session (unknown id, bad spec, server-wide calls).
inline constexpr char kNoVariant[] = "none";

// The `rpc` label values.
enum class Rpc {
  kConfigure,
  kForward,
  kDecode,
  kDecodeStream,  // Observed once per stream message (one decode step), not per stream.
  kRelease,
  kGetSession,
  kListSessions,
  kGetServerInfo,
  kFork,
  kExportRequest,
  kImportRequest,
  kForwardStream,  // Observed once per stream (one Forward), not per message.
};
const char* RpcLabel(Rpc rpc);  // "configure", "forward", "decode_stream", ...

// The server's timing of one call or stream message, in seconds.
struct RpcTiming {
  bool computed = false;       // The call reached its compute phase (queue/compute are meaningful).
  double queue_seconds = 0;    // Arrival to start of compute (waiting on the session's queue).
  double compute_seconds = 0;  // Engine time.
  double total_seconds = 0;    // Arrival to the answer.
};

// How a TTL expiry freed memory.
enum class ExpiryKind { kRequest, kSession };

// True for RESOURCE_EXHAUSTED raised by the engine for KV memory (the device budget, a layer's
// page pool, or the host refusing page memory), as opposed to the max_sessions / max_requests
// limits, which share the code. The engine's messages all name "KV".
bool IsKvExhaustion(const absl::Status& status);

struct BuildInfo {
  std::string version;
  std::string backend;  // "cpu" or "cuda".
  std::string device;   // The backend's device description.
};

class Metrics {
 public:
  // `pool` and `registry` feed the state gauges at scrape time; either may be null (those gauges
  // then stay absent). Both must outlive this object.
  Metrics(const BuildInfo& build, const KvPool* pool, const SessionRegistry* registry);
  ~Metrics();

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Serves /metrics over HTTP on `address` (host:port; port 0 picks a free port) and returns the
  // bound port. UNAVAILABLE when the address cannot be bound; FAILED_PRECONDITION if called twice.
  // Every other request gets an HTTP error status; slow clients cannot hold up scrapes.
  absl::StatusOr<int> Serve(const std::string& address);

  // The text exposition, as /metrics would answer now (gauges refreshed first). For logs/tests.
  std::string Render();

  // ---- Events -----------------------------------------------------------------------------
  // One finished call (or stream message) with its final code. Counts an error when code != OK.
  void ObserveRpc(Rpc rpc, const std::string& variant, absl::StatusCode code,
                  const RpcTiming& timing);
  // One backend call: `size` sequences, `tokens` rows, `seconds` of engine time. Decode calls also
  // count decode tokens and feed attnserve_decode_step_seconds; prefill calls count prefill
  // tokens. The scheduler's BatchObserver (server/session/scheduler.h) forwards four fields of
  // BatchStats here (server/rpc/attention_service.cc, at Configure):
  // ObserveBatch(variant, s.decode, s.size, s.tokens, s.compute_ns * 1e-9); the others (context
  // tokens, calls, chunks, queue waits, retried_alone) reach no metric.
  void ObserveBatch(const std::string& variant, bool decode, int64_t size, int64_t tokens,
                    double seconds);
  // A step refused with RESOURCE_EXHAUSTED for KV memory.
  void CountKvRejection(const std::string& variant);
  // `count` requests or sessions freed by their TTL.
  void CountExpired(const std::string& variant, ExpiryKind kind, int64_t count);
  // Requests a drain (--drain_to) handed to its peer (kMoved), could not (kLost), or whose calls
  // came after the drain's cut and were refused UNAVAILABLE (kRefused; server/fleet/drain.h).
  enum class DrainOutcome { kMoved, kLost, kRefused };
  void CountDrainedRequests(const std::string& variant, DrainOutcome outcome, int64_t count);

  // Adds `replica` (--replica_id, or <hostname>:<port> once the port is bound) to
  // attnserve_build_info, so that a dashboard can name each scraped instance.
  void SetReplica(const std::string& replica);

  // Recomputes the state gauges from the pool, the registry and /proc. Called before each scrape,
  // which also reads the process_* metrics (resident memory, CPU seconds, open and max fds, start
  // time) from /proc/self.
  void RefreshGauges();

 private:
  class ScrapeCollectable;

  // The metric of `family` with `labels`, created on first use (prometheus-cpp's Family::Add
  // builds a new object on every call, so pointers are cached here).
  template <typename T, typename... Args>
  T& Get(prometheus::Family<T>& family, const prometheus::Labels& labels, Args&&... args)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a cached series (a gauge whose variant has no live session any more).
  void Drop(prometheus::Family<prometheus::Gauge>& family, const prometheus::Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteVariant(const std::string& variant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BuildInfo build_;
  const KvPool* const pool_;
  const SessionRegistry* const sessions_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<ScrapeCollectable> collectable_;

  // Families (owned by registry_).
  prometheus::Family<prometheus::Gauge>& pool_capacity_;
  prometheus::Family<prometheus::Gauge>& pool_used_;
  prometheus::Family<prometheus::Gauge>& pool_pages_;
  prometheus::Family<prometheus::Gauge>& bytes_per_token_;
  prometheus::Family<prometheus::Gauge>& layer_kind_used_;
  prometheus::Family<prometheus::Gauge>& sessions_active_;
  prometheus::Family<prometheus::Gauge>& requests_active_;
  prometheus::Family<prometheus::Histogram>& rpc_duration_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  prometheus::Family<prometheus::Histogram>& compute_;
  prometheus::Family<prometheus::Histogram>& batch_size_;
  prometheus::Family<prometheus::Histogram>& batch_tokens_;
  prometheus::Family<prometheus::Counter>& prefill_tokens_;
  prometheus::Family<prometheus::Counter>& decode_tokens_;
  prometheus::Family<prometheus::Histogram>& decode_step_;
  prometheus::Family<prometheus::Counter>& rpc_errors_;
  prometheus::Family<prometheus::Counter>& kv_rejections_;
  prometheus::Family<prometheus::Counter>& expired_;
  prometheus::Family<prometheus::Counter>& drained_;
  prometheus::Family<prometheus::Gauge>& device_memory_;
  prometheus::Family<prometheus::Gauge>& build_info_;
  prometheus::Gauge* build_info_series_ ABSL_GUARDED_BY(mu_) = nullptr;

  absl::Mutex mu_;
  std::map<std::pair<const void*, prometheus::Labels>, void*> series_ ABSL_GUARDED_BY(mu_);
  // Variants that have or had a session: they keep capacity/used/sessions series (0 when idle).
  std::set<std::string> variants_ ABSL_GUARDED_BY(mu_);
  // (variant, layer kind) pairs that have or had a stack session: their series stay (0 when idle).
  std::set<std::pair<std::string, std::string>> layer_kinds_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<MetricsHttpServer> http_;  // Last: stopped before the rest goes.
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_OBSERVABILITY_METRICS_H_
