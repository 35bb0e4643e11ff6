#include "server/observability/metrics.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "server/session/kv_pool.h"
#include "server/observability/call_log.h"
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

// The process_* metrics of the Prometheus client conventions (as the Go and Python clients export
// them), read from /proc at each scrape. Families that cannot be read are left out.
std::vector<prometheus::MetricFamily> ProcessFamilies() {
  std::vector<prometheus::MetricFamily> families;
  auto add = [&families](const char* name, const char* help, prometheus::MetricType type,
                         double value) {
    prometheus::MetricFamily family;
    family.name = name;
    family.help = help;
    family.type = type;
    prometheus::ClientMetric metric;
    if (type == prometheus::MetricType::Counter) {
      metric.counter.value = value;
    } else {
      metric.gauge.value = value;
    }
    family.metric.push_back(std::move(metric));
    families.push_back(std::move(family));
  };
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page_bytes = static_cast<double>(sysconf(_SC_PAGESIZE));
  // /proc/self/stat: fields after the parenthesized command (which may hold spaces): state is
  // field 3; utime 14, stime 15, starttime 22 (clock ticks since boot), vsize 23, rss 24 (pages).
  if (std::FILE* f = std::fopen("/proc/self/stat", "r")) {
    char buffer[1024];
    const size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, f);
    std::fclose(f);
    buffer[n] = '\0';
    const char* rest = std::strrchr(buffer, ')');
    unsigned long long utime = 0, stime = 0, start = 0, vsize = 0;
    long long rss_pages = 0;
    if (rest != nullptr &&
        std::sscanf(rest + 2,
                    "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d "
                    "%*d %llu %llu %lld",
                    &utime, &stime, &start, &vsize, &rss_pages) == 5 &&
        ticks > 0) {
      add("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
          prometheus::MetricType::Counter, static_cast<double>(utime + stime) / ticks);
      add("process_resident_memory_bytes", "Resident memory size in bytes.",
          prometheus::MetricType::Gauge, static_cast<double>(rss_pages) * page_bytes);
      add("process_virtual_memory_bytes", "Virtual memory size in bytes.",
          prometheus::MetricType::Gauge, static_cast<double>(vsize));
      // btime (/proc/stat): the boot time in seconds since the epoch.
      if (std::FILE* stat = std::fopen("/proc/stat", "r")) {
        char line[256];
        long long btime = -1;
        while (std::fgets(line, sizeof(line), stat) != nullptr) {
          if (std::sscanf(line, "btime %lld", &btime) == 1) break;
        }
        std::fclose(stat);
        if (btime >= 0) {
          add("process_start_time_seconds",
              "Start time of the process since unix epoch in seconds.",
              prometheus::MetricType::Gauge,
              static_cast<double>(btime) + static_cast<double>(start) / ticks);
        }
      }
    }
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    int64_t fds = 0;
    while (const dirent* entry = readdir(dir)) {
      if (entry->d_name[0] != '.') ++fds;
    }
    closedir(dir);
    add("process_open_fds", "Number of open file descriptors.", prometheus::MetricType::Gauge,
        static_cast<double>(fds - 1));  // Less the one opendir() holds.
  }
  if (std::FILE* f = std::fopen("/proc/self/limits", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::strncmp(line, "Max open files", 14) != 0) continue;
      long long soft = 0;
      if (std::sscanf(line + 14, "%lld", &soft) == 1) {
        add("process_max_fds", "Maximum number of open file descriptors.",
            prometheus::MetricType::Gauge, static_cast<double>(soft));
      }
      break;
    }
    std::fclose(f);
  }
  return families;
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
    case Rpc::kForwardStream:
      return "forward_stream";
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
    std::vector<prometheus::MetricFamily> families = metrics_->registry_->Collect();
    for (prometheus::MetricFamily& family : ProcessFamilies()) {
      families.push_back(std::move(family));
    }
    return families;
  }

 private:
  Metrics* const metrics_;
};

Metrics::Metrics(const BuildInfo& build, const KvPool* pool, const SessionRegistry* registry)
    : build_(build),
      pool_(pool),
      sessions_(registry),
      registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<ScrapeCollectable>(this)),
      pool_capacity_(prometheus::BuildGauge()
                         .Name("attnserve_kv_pool_capacity_bytes")
                         .Help("Capacity of the device's KV cache pool (--kv_pool_bytes), bytes; "
                               "one series per replica (no variant: the pool is shared).")
                         .Register(*registry_)),
      pool_used_(prometheus::BuildGauge()
                     .Name("attnserve_kv_pool_used_bytes")
                     .Help("KV cache bytes held by live sessions of the variant; variant=\"none\": "
                           "bytes of the pool held by no live session (in transit). The sum "
                           "over variants is the pool's use.")
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
                         "(outcome=moved), could not (outcome=lost), or refused to a call that "
                         "came after the drain's cut (outcome=refused, UNAVAILABLE).")
                   .Register(*registry_)),
      device_memory_(prometheus::BuildGauge()
                         .Name("attnserve_device_memory_bytes")
                         .Help("Device memory, bytes: CPU backend = process resident memory "
                               "(used) and host MemTotal (total).")
                         .Register(*registry_)),
      build_info_(prometheus::BuildGauge()
                      .Name("attnserve_build_info")
                      .Help("Always 1; labels give the server version, backend, device and "
                            "replica (--replica_id).")
                      .Register(*registry_)) {
  absl::MutexLock lock(&mu_);
  build_info_series_ = &build_info_.Add(
      {{"version", build.version}, {"backend", build.backend}, {"device", build.device}});
  build_info_series_->Set(1);
}

void Metrics::SetReplica(const std::string& replica) {
  absl::MutexLock lock(&mu_);
  if (build_info_series_ != nullptr) build_info_.Remove(build_info_series_);
  build_info_series_ = &build_info_.Add({{"version", build_.version},
                                         {"backend", build_.backend},
                                         {"device", build_.device},
                                         {"replica", replica}});
  build_info_series_->Set(1);
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
    Get(rpc_errors_, {{"rpc", RpcLabel(rpc)}, {"code", StatusCodeName(code)}, {"variant", variant}})
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

void Metrics::CountDrainedRequests(const std::string& variant, DrainOutcome outcome,
                                   int64_t count) {
  const char* label = outcome == DrainOutcome::kMoved  ? "moved"
                      : outcome == DrainOutcome::kLost ? "lost"
                                                       : "refused";
  absl::MutexLock lock(&mu_);
  NoteVariant(variant);
  Get(drained_, {{"variant", variant}, {"outcome", label}}).Increment(static_cast<double>(count));
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
      const std::string variant = session->variant_label();
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
  const int64_t pool_used = pool_ != nullptr ? pool_->used_bytes() : 0;
  const int64_t rss = ProcKilobytes("/proc/self/status", "VmRSS:");
  const int64_t mem_total = ProcKilobytes("/proc/meminfo", "MemTotal:");

  absl::MutexLock lock(&mu_);
  for (const auto& [variant, state] : live) NoteVariant(variant);
  if (pool_ != nullptr) {
    const int64_t free_bytes = pool_->free_bytes();
    // One series per replica: the pool is the device's, whatever the variants.
    Get(pool_capacity_, {}).Set(static_cast<double>(pool_->capacity_bytes()));
    // The variants' series partition the pool's use, so that sum() over them (and over replicas)
    // is the use; what no live session holds (a request being imported, a session being freed)
    // is variant="none". 0 when idle, so that an idle replica still has a series.
    int64_t held_by_sessions = 0;
    for (const auto& [variant, state] : live) held_by_sessions += state.used_bytes;
    Get(pool_used_, {{"variant", kNoVariant}})
        .Set(static_cast<double>(std::max<int64_t>(0, pool_used - held_by_sessions)));
    for (const std::string& variant : variants_) {
      auto it = live.find(variant);
      const VariantState state = it != live.end() ? it->second : VariantState{};
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
