#include "server/observability/metrics.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/session/kv_pool.h"
#include "server/observability/metrics_http_server.h"
#include "server/session/registry.h"

namespace attnserve::server {

namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::Labels;

// 50 us * 2^k for k = 0..19: 50 us to 26.2 s, about 3 buckets per decade.
const Histogram::BucketBoundaries& LatencyBuckets() {
  static const Histogram::BucketBoundaries* const kBuckets = [] {
    auto* b = new Histogram::BucketBoundaries;
    for (double v = 50e-6; b->size() < 20; v *= 2) b->push_back(v);
    return b;
  }();
  return *kBuckets;
}

// 1, 2, 4, ..., 2^(n-1).
Histogram::BucketBoundaries PowersOfTwo(int n) {
  Histogram::BucketBoundaries b;
  for (double v = 1; static_cast<int>(b.size()) < n; v *= 2) b.push_back(v);
  return b;
}

// Sequences per backend call: 1 .. 256.
const Histogram::BucketBoundaries& BatchSizeBuckets() {
  static const Histogram::BucketBoundaries* const kBuckets =
      new Histogram::BucketBoundaries(PowersOfTwo(9));
  return *kBuckets;
}

// Tokens per backend call: 1 .. 65536.
const Histogram::BucketBoundaries& BatchTokenBuckets() {
  static const Histogram::BucketBoundaries* const kBuckets =
      new Histogram::BucketBoundaries(PowersOfTwo(17));
  return *kBuckets;
}

// The value in kB of `key` ("VmRSS:", "MemTotal:") in a /proc file, in bytes; -1 if absent.
int64_t ProcKilobytes(const char* path, const char* key) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  char line[256];
  int64_t bytes = -1;
  const size_t key_len = std::strlen(key);
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, key, key_len) != 0) continue;
    long long kb = 0;
    if (std::sscanf(line + key_len, "%lld", &kb) == 1) bytes = static_cast<int64_t>(kb) * 1024;
    break;
  }
  std::fclose(f);
  return bytes;
}

const char* StatusCodeLabel(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return "OK";
    case absl::StatusCode::kCancelled:
      return "CANCELLED";
    case absl::StatusCode::kUnknown:
      return "UNKNOWN";
    case absl::StatusCode::kInvalidArgument:
      return "INVALID_ARGUMENT";
    case absl::StatusCode::kDeadlineExceeded:
      return "DEADLINE_EXCEEDED";
    case absl::StatusCode::kNotFound:
      return "NOT_FOUND";
    case absl::StatusCode::kAlreadyExists:
      return "ALREADY_EXISTS";
    case absl::StatusCode::kPermissionDenied:
      return "PERMISSION_DENIED";
    case absl::StatusCode::kResourceExhausted:
      return "RESOURCE_EXHAUSTED";
    case absl::StatusCode::kFailedPrecondition:
      return "FAILED_PRECONDITION";
    case absl::StatusCode::kAborted:
      return "ABORTED";
    case absl::StatusCode::kOutOfRange:
      return "OUT_OF_RANGE";
    case absl::StatusCode::kUnimplemented:
      return "UNIMPLEMENTED";
    case absl::StatusCode::kInternal:
      return "INTERNAL";
    case absl::StatusCode::kUnavailable:
      return "UNAVAILABLE";
    case absl::StatusCode::kDataLoss:
      return "DATA_LOSS";
    case absl::StatusCode::kUnauthenticated:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

}  // namespace

std::string VariantLabel(const LayerSpec& spec) {
  std::string label(VariantName(spec.variant));
  if (spec.sliding_window > 0) label += "_swa";
  return label;
}

const char* RpcLabel(Rpc rpc) {
  switch (rpc) {
    case Rpc::kConfigure:
      return "configure";
    case Rpc::kForward:
      return "forward";
    case Rpc::kDecode:
      return "decode";
    case Rpc::kDecodeStream:
      return "decode_stream";
    case Rpc::kRelease:
      return "release";
    case Rpc::kGetSession:
      return "get_session";
    case Rpc::kListSessions:
      return "list_sessions";
    case Rpc::kGetServerInfo:
      return "get_server_info";
    case Rpc::kFork:
      return "fork";
    case Rpc::kExportRequest:
      return "export_request";
    case Rpc::kImportRequest:
      return "import_request";
  }
  return "unknown";
}

bool IsKvExhaustion(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         absl::StrContains(status.message(), "KV ");
}

// What a scrape collects: refreshes the state gauges, then collects the registry.
class Metrics::ScrapeCollectable : public prometheus::Collectable {
 public:
  explicit ScrapeCollectable(Metrics* metrics) : metrics_(metrics) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    metrics_->RefreshGauges();
    return metrics_->registry_->Collect();
  }

 private:
  Metrics* const metrics_;
};

Metrics::Metrics(const BuildInfo& build, const KvPool* pool, const SessionRegistry* registry)
    : pool_(pool),
      sessions_(registry),
      registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<ScrapeCollectable>(this)),
      pool_capacity_(prometheus::BuildGauge()
                         .Name("attnserve_kv_pool_capacity_bytes")
                         .Help("Capacity of the device's KV cache pool (--kv_pool_bytes), bytes; "
                               "repeated for every variant that has or had a session, and "
                               "variant=\"all\".")
                         .Register(*registry_)),
      pool_used_(prometheus::BuildGauge()
                     .Name("attnserve_kv_pool_used_bytes")
                     .Help("KV cache bytes held by live sessions of the variant; variant=\"all\" "
                           "is the whole pool's use.")
                     .Register(*registry_)),
      pool_pages_(prometheus::BuildGauge()
                      .Name("attnserve_kv_pool_pages")
                      .Help("KV pages of the variant's page size: used = held by its live "
                            "sessions; free = pool free bytes / its page bytes.")
                      .Register(*registry_)),
      bytes_per_token_(prometheus::BuildGauge()
                           .Name("attnserve_kv_bytes_per_token")
                           .Help("KV cache bytes per cached token of the variant's live sessions "
                                 "(the largest when they differ).")
                           .Register(*registry_)),
      layer_kind_used_(prometheus::BuildGauge()
                           .Name("attnserve_kv_layer_kind_used_bytes")
                           .Help("KV cache bytes held by the layers of one kind (global, "
                                 "sliding_window:<tokens>, mla) of the variant's live hybrid-stack "
                                 "sessions.")
                           .Register(*registry_)),
      sessions_active_(prometheus::BuildGauge()
                           .Name("attnserve_sessions_active")
                           .Help("Live sessions of the variant.")
                           .Register(*registry_)),
      requests_active_(prometheus::BuildGauge()
                           .Name("attnserve_requests_active")
                           .Help("Live requests (sequences with a KV cache) of the variant.")
                           .Register(*registry_)),
      rpc_duration_(prometheus::BuildHistogram()
                        .Name("attnserve_rpc_duration_seconds")
                        .Help("Server time of a call, arrival to answer (decode_stream: per "
                              "message), seconds.")
                        .Register(*registry_)),
      queue_wait_(prometheus::BuildHistogram()
                      .Name("attnserve_queue_wait_seconds")
                      .Help("Time a call waited before its compute started, seconds.")
                      .Register(*registry_)),
      compute_(prometheus::BuildHistogram()
                   .Name("attnserve_compute_seconds")
                   .Help("Engine time of a call, seconds.")
                   .Register(*registry_)),
      batch_size_(prometheus::BuildHistogram()
                      .Name("attnserve_batch_size")
                      .Help("Sequences per backend call (prefill or decode).")
                      .Register(*registry_)),
      batch_tokens_(prometheus::BuildHistogram()
                        .Name("attnserve_batch_tokens")
                        .Help("Tokens (rows) per backend call (prefill or decode).")
                        .Register(*registry_)),
      prefill_tokens_(prometheus::BuildCounter()
                          .Name("attnserve_prefill_tokens_total")
                          .Help("Tokens appended by Forward (prefill), successful calls only.")
                          .Register(*registry_)),
      decode_tokens_(prometheus::BuildCounter()
                         .Name("attnserve_decode_tokens_total")
                         .Help("Tokens appended by Decode and DecodeStream, successful steps "
                               "only.")
                         .Register(*registry_)),
      decode_step_(prometheus::BuildHistogram()
                       .Name("attnserve_decode_step_seconds")
                       .Help("Engine time of one backend decode call, seconds.")
                       .Register(*registry_)),
      rpc_errors_(prometheus::BuildCounter()
                      .Name("attnserve_rpc_errors_total")
                      .Help("Calls (decode_stream: streams) that ended with a non-OK status, by "
                            "gRPC status name.")
                      .Register(*registry_)),
      kv_rejections_(prometheus::BuildCounter()
                         .Name("attnserve_kv_rejections_total")
                         .Help("Steps refused with RESOURCE_EXHAUSTED for KV memory.")
                         .Register(*registry_)),
      expired_(prometheus::BuildCounter()
                   .Name("attnserve_expired_total")
                   .Help("Requests (request_ttl) and sessions (session_ttl) freed for idleness.")
                   .Register(*registry_)),
      drained_(prometheus::BuildCounter()
                   .Name("attnserve_drain_requests_total")
                   .Help("Requests a drain on SIGTERM (--drain_to) moved to its peer "
                         "(outcome=moved) or could not (outcome=lost).")
                   .Register(*registry_)),
      device_memory_(prometheus::BuildGauge()
                         .Name("attnserve_device_memory_bytes")
                         .Help("Device memory, bytes: CPU backend = process resident memory "
                               "(used) and host MemTotal (total).")
                         .Register(*registry_)),
      build_info_(prometheus::BuildGauge()
                      .Name("attnserve_build_info")
                      .Help("Always 1; labels give the server version, backend and device.")
                      .Register(*registry_)) {
  build_info_
      .Add({{"version", build.version}, {"backend", build.backend}, {"device", build.device}})
      .Set(1);
}

Metrics::~Metrics() { http_.reset(); }

absl::StatusOr<int> Metrics::Serve(const std::string& address) {
  if (http_ != nullptr) return absl::FailedPreconditionError("metrics are already served");
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start(address, [this] { return Render(); });
  if (!http.ok()) return http.status();
  http_ = *std::move(http);
  return http_->port();
}

std::string Metrics::Render() {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

template <typename T, typename... Args>
T& Metrics::Get(prometheus::Family<T>& family, const Labels& labels, Args&&... args) {
  void*& slot = series_[{&family, labels}];
  if (slot == nullptr) slot = &family.Add(labels, std::forward<Args>(args)...);
  return *static_cast<T*>(slot);
}

void Metrics::Drop(prometheus::Family<Gauge>& family, const Labels& labels) {
  auto it = series_.find({&family, labels});
  if (it == series_.end()) return;
  family.Remove(static_cast<Gauge*>(it->second));
  series_.erase(it);
}

void Metrics::NoteVariant(const std::string& variant) {
  if (variant == kNoVariant || !variants_.insert(variant).second) return;
  // Counters of rare events start at 0 for every variant seen, so rate() and increase() over
  // them return data (0) before the first event, rather than nothing.
  Get(kv_rejections_, {{"variant", variant}});
  Get(expired_, {{"variant", variant}, {"kind", "request"}});
  Get(expired_, {{"variant", variant}, {"kind", "session"}});
}

void Metrics::ObserveRpc(Rpc rpc, const std::string& variant, absl::StatusCode code,
                         const RpcTiming& timing) {
  const Labels labels{{"rpc", RpcLabel(rpc)}, {"variant", variant}};
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(rpc_duration_, labels, LatencyBuckets()).Observe(timing.total_seconds);
  if (timing.computed) {
    Get(queue_wait_, labels, LatencyBuckets()).Observe(timing.queue_seconds);
    Get(compute_, labels, LatencyBuckets()).Observe(timing.compute_seconds);
  }
  if (code != absl::StatusCode::kOk) {
    Get(rpc_errors_,
        {{"rpc", RpcLabel(rpc)}, {"code", StatusCodeLabel(code)}, {"variant", variant}})
        .Increment();
  }
}

void Metrics::ObserveBatch(const std::string& variant, bool decode, int64_t size, int64_t tokens,
                           double seconds) {
  const Labels labels{{"variant", variant}};
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(batch_size_, labels, BatchSizeBuckets()).Observe(static_cast<double>(size));
  Get(batch_tokens_, labels, BatchTokenBuckets()).Observe(static_cast<double>(tokens));
  if (decode) {
    Get(decode_tokens_, labels).Increment(static_cast<double>(tokens));
    Get(decode_step_, labels, LatencyBuckets()).Observe(seconds);
  } else {
    Get(prefill_tokens_, labels).Increment(static_cast<double>(tokens));
  }
}

void Metrics::CountKvRejection(const std::string& variant) {
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(kv_rejections_, {{"variant", variant}}).Increment();
}

void Metrics::CountDrainedRequests(const std::string& variant, bool moved, int64_t count) {
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(drained_, {{"variant", variant}, {"outcome", moved ? "moved" : "lost"}})
      .Increment(static_cast<double>(count));
}

void Metrics::CountExpired(const std::string& variant, ExpiryKind kind, int64_t count) {
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(expired_,
      {{"variant", variant}, {"kind", kind == ExpiryKind::kRequest ? "request" : "session"}})
      .Increment(static_cast<double>(count));
}

void Metrics::RefreshGauges() {
  // Read the sessions before taking mu_ (the registry has its own mutex; never nest them).
  struct VariantState {
    int64_t sessions = 0;
    int64_t requests = 0;
    int64_t used_bytes = 0;
    int64_t used_pages = 0;
    int64_t page_bytes = 0;       // Largest page of the variant's sessions.
    int64_t bytes_per_token = 0;  // Largest of the variant's sessions.
  };
  std::map<std::string, VariantState> live;
  std::map<std::pair<std::string, std::string>, int64_t> by_layer_kind;  // Stack sessions only.
  if (sessions_ != nullptr) {
    for (const std::shared_ptr<Session>& session : sessions_->All()) {
      const std::string variant = VariantLabel(session->spec());
      VariantState& v = live[variant];
      if (session->stack_kv() != nullptr) {
        for (const LayerKindKv& kind : session->stack_kv()->Get()) {
          by_layer_kind[{variant, kind.kind}] += kind.kv_bytes;
        }
      }
      const int64_t used = session->kv_bytes_used();
      ++v.sessions;
      v.requests += session->num_requests();
      v.used_bytes += used;
      if (session->page_bytes() > 0) v.used_pages += used / session->page_bytes();
      v.page_bytes = std::max(v.page_bytes, session->page_bytes());
      v.bytes_per_token = std::max(v.bytes_per_token, session->cost().kv_bytes_per_token);
    }
  }
  const int64_t rss = ProcKilobytes("/proc/self/status", "VmRSS:");
  const int64_t mem_total = ProcKilobytes("/proc/meminfo", "MemTotal:");

  absl::MutexLock lock(&mu_);
  for (const auto& [variant, state] : live) NoteVariant(variant);
  if (pool_ != nullptr) {
    const double capacity = static_cast<double>(pool_->capacity_bytes());
    const int64_t free_bytes = pool_->free_bytes();
    Get(pool_capacity_, {{"variant", "all"}}).Set(capacity);
    Get(pool_used_, {{"variant", "all"}}).Set(static_cast<double>(pool_->used_bytes()));
    for (const std::string& variant : variants_) {
      auto it = live.find(variant);
      const VariantState state = it != live.end() ? it->second : VariantState{};
      Get(pool_capacity_, {{"variant", variant}}).Set(capacity);
      Get(pool_used_, {{"variant", variant}}).Set(static_cast<double>(state.used_bytes));
      Get(pool_pages_, {{"variant", variant}, {"state", "used"}})
          .Set(static_cast<double>(state.used_pages));
      if (it != live.end() && state.page_bytes > 0) {
        Get(pool_pages_, {{"variant", variant}, {"state", "free"}})
            .Set(static_cast<double>(free_bytes / state.page_bytes));
      } else {
        Drop(pool_pages_, {{"variant", variant}, {"state", "free"}});
      }
    }
  }
  for (const std::string& variant : variants_) {
    auto it = live.find(variant);
    const VariantState state = it != live.end() ? it->second : VariantState{};
    Get(sessions_active_, {{"variant", variant}}).Set(static_cast<double>(state.sessions));
    Get(requests_active_, {{"variant", variant}}).Set(static_cast<double>(state.requests));
    if (it != live.end()) {
      Get(bytes_per_token_, {{"variant", variant}}).Set(static_cast<double>(state.bytes_per_token));
    } else {
      Drop(bytes_per_token_, {{"variant", variant}});
    }
  }
  for (const auto& [key, bytes] : by_layer_kind) layer_kinds_.insert(key);
  for (const auto& key : layer_kinds_) {
    auto it = by_layer_kind.find(key);
    Get(layer_kind_used_, {{"variant", key.first}, {"layer_kind", key.second}})
        .Set(it != by_layer_kind.end() ? static_cast<double>(it->second) : 0.0);
  }
  if (rss >= 0) Get(device_memory_, {{"state", "used"}}).Set(static_cast<double>(rss));
  if (mem_total >= 0) Get(device_memory_, {{"state", "total"}}).Set(static_cast<double>(mem_total));
}

}  // namespace attnserve::server
