#include "server/server.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "kernels/backend_factory.h"
#include "server/fleet/drain.h"
#include "server/fleet/session_affinity.h"
#include "server/fleet/session_rebalancer.h"
#include "server/listen_address.h"
#include "server/observability/library_logging.h"
#include "server/observability/logging.h"
#include "server/observability/metrics.h"
#include "server/rpc/attention_service.h"
#include "server/rpc/wire_call.h"
#include "server/runtime/executor.h"
#include "server/security/caller.h"
#include "server/security/transport_security.h"
#include "server/session/kv_pool.h"
#include "server/session/parameter_budget.h"
#include "server/session/registry.h"
#include "server/session/ttl_sweeper.h"

namespace attnserve::server {

namespace {

// The full name of the service, as health checks and reflection name it.
constexpr char kServiceName[] = "attnserve.v1.AttentionService";

absl::Status ValidateOptions(const ServerOptions& o) {
  const ServerLimits& l = o.limits;
  if (o.kv_pool_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_pool_bytes = ", o.kv_pool_bytes, ", must be >= 0 (0 = chosen by the backend)"));
  }
  if (o.kv_pool_bytes > 0 && o.kv_pool_fraction > 0.0) {
    return absl::InvalidArgumentError("--kv_pool_bytes and --kv_pool_fraction exclude each other");
  }
  if (o.drain_to.empty() && !o.drain_token_file.empty()) {
    return absl::InvalidArgumentError("--drain_token_file is only used with --drain_to");
  }
  if (!o.drain_to.empty() && o.drain_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drain_timeout = ", absl::FormatDuration(o.drain_timeout), ", must be > 0"));
  }
  if (o.kv_pool_fraction != 0.0 && !(o.kv_pool_fraction > 0.0 && o.kv_pool_fraction <= 0.95)) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_pool_fraction = ", o.kv_pool_fraction,
                                                   ", must be 0 (unused) or in (0, 0.95]"));
  }
  if (absl::StatusOr<CudaAttentionImpl> impl = ParseCudaAttentionImpl(o.cuda_attention);
      !impl.ok()) {
    return impl.status();
  }
  if (o.backend == "cpu" && o.cuda_attention != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--cuda_attention = ", o.cuda_attention,
                                                   " chooses CUDA kernels, but --backend = cpu"));
  }
  if (o.cpu_projection_weights != "f32" && o.cpu_projection_weights != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat("--cpu_projection_weights = ",
                                                   o.cpu_projection_weights,
                                                   ", must be f32 or bf16"));
  }
  if (o.backend == "cuda" && o.cpu_projection_weights != "f32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu_projection_weights = ", o.cpu_projection_weights,
                     " sets the CPU backend's weights, but --backend = cuda"));
  }
  if (o.max_parameter_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_parameter_bytes = ", o.max_parameter_bytes, ", must be >= 0 (0 = default)"));
  }
  if (o.compute_threads < 1 || o.compute_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute_threads = ", o.compute_threads, ", must be in [1, 256]"));
  }
  const SchedulerOptions& b = o.scheduler;
  if (b.max_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_batch_size = ", b.max_batch_size, ", must be >= 1"));
  }
  if (b.max_batch_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_batch_tokens = ", b.max_batch_tokens, ", must be >= 1 (or 0: the backend's)"));
  }
  if (b.max_queue_delay < absl::ZeroDuration() || b.max_queue_delay > absl::Seconds(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_queue_delay = ", absl::FormatDuration(b.max_queue_delay), ", must be in [0, 1s]"));
  }
  if (b.prefill_chunk_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prefill_chunk_tokens = ", b.prefill_chunk_tokens, ", must be >= 0 (0 = never split)"));
  }
  if (l.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_sessions = ", l.max_sessions, ", must be >= 1"));
  }
  if (l.max_requests_per_session < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_requests_per_session = ", l.max_requests_per_session, ", must be >= 1"));
  }
  if (l.max_sequence_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_sequence_length = ", l.max_sequence_length, ", must be >= 1"));
  }
  if (l.max_message_bytes < 1024 || l.max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes = ", l.max_message_bytes,
                                                   ", must be in [1024, 2^31 - 1]"));
  }
  if (l.max_inflight_message_bytes != 0 && l.max_inflight_message_bytes < l.max_message_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_message_bytes = ", l.max_inflight_message_bytes,
        ", must be 0 (the default: a sixteenth of memory, at least 4 x --max_message_bytes) or >= --max_message_bytes = ", l.max_message_bytes,
        " (one largest message must fit)"));
  }
  if (l.import_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--import_idle_timeout must be >= 0 (0 = never)");
  }
  if (l.forward_stream_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--forward_stream_idle_timeout must be >= 0 (0 = never)");
  }
  if (l.max_retained_output_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_retained_output_bytes = ", l.max_retained_output_bytes, ", must be >= 1"));
  }
  const TenantQuotas& q = o.tenant_quotas;
  if (q.max_retained_output_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tenant_max_retained_output_bytes = ", q.max_retained_output_bytes,
                     ", must be >= 0 (0 = only --max_retained_output_bytes)"));
  }
  if (q.max_sessions < 0 || q.max_kv_bytes < 0 || q.max_parameter_bytes < 0) {
    return absl::InvalidArgumentError(
        "--tenant_max_sessions, --tenant_max_kv_bytes and --tenant_max_parameter_bytes must be "
        ">= 0 (0 = unlimited)");
  }
  if (o.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_grace must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<BackendChoice> MakeBackend(const ServerOptions& o) {
  BackendOptions backend;
  backend.name = o.backend;
  backend.cpu.num_threads = o.engine_threads;
  backend.cpu.projection_weights =
      o.cpu_projection_weights == "bf16" ? DType::kBF16 : DType::kF32;  // Validated.
  // The CUDA backend's device page pool holds the same KV budget the sessions share: either
  // --kv_pool_bytes, or a fraction of the free device memory (0 bytes selects the fraction):
  // --kv_pool_fraction, or by default kDefaultCudaKvPoolFraction.
  backend.cuda.kv_pool_bytes = o.kv_pool_bytes;
  if (o.kv_pool_bytes == 0) {
    backend.cuda.kv_pool_fraction = o.kv_pool_fraction > 0.0
                                        ? o.kv_pool_fraction
                                        : ServerOptions::kDefaultCudaKvPoolFraction;
  }
  backend.cuda.attention = *ParseCudaAttentionImpl(o.cuda_attention);  // ValidateOptions checked it.
  // Errors name the flag's value ("backend = cuda: no CUDA device: ...").
  return CreateBackend(backend);
}

// --max_inflight_message_bytes, its default resolved: a sixteenth of the memory the process may
// use, and never less than four largest messages. Four messages alone (256 MiB) reset streams
// under ordinary load on a large machine: 128 streams each prefilling 512 tokens of d_model 4096
// in f32 send 1 GiB at once (seen on an H200 host with 128 GiB, docs/gpu_benchmarks.md).
int64_t InflightMessageBytes(const ServerLimits& limits) {
  if (limits.max_inflight_message_bytes > 0) return limits.max_inflight_message_bytes;
  return std::max(4 * limits.max_message_bytes, ProcessMemoryLimit() / 16);
}

// Writes the port to `path` via a rename, so a reader never sees a partial file.
absl::Status WritePortFile(const std::string& path, int port, const char* flag = "--port_file") {
  const std::string tmp = absl::StrCat(path, ".tmp");
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot write '", tmp, "'"));
  }
  std::fprintf(f, "%d\n", port);
  const bool ok = std::fclose(f) == 0;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot write '", path, "'"));
  }
  return absl::OkStatus();
}

// The thread that waits for the stop signals, and why it was woken when not by one.
pthread_t main_thread;
std::atomic<bool> listener_failed{false};

// gRPC stopped accepting on its port (WatchGrpcLogging): stop as on SIGTERM (a drain moves the
// sessions with --drain_to), then exit non-zero so that the orchestrator starts a fresh process.
void OnListenerFailed(const char* /*message*/) {
  listener_failed.store(true);
  pthread_kill(main_thread, SIGTERM);  // To the thread in sigwait (the others block it too).
}

// Raises the soft RLIMIT_NOFILE to the hard limit: every connection is a descriptor, and running
// out of them stops gRPC's listener (see WatchGrpcLogging).
void RaiseDescriptorLimit() {
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) return;
  const rlim_t soft = nofile.rlim_cur;
  if (nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) nofile.rlim_cur = soft;
  }
  SERVER_LOG(INFO, "open files: soft limit %d (was %d), hard limit %d",
             static_cast<int64_t>(nofile.rlim_cur), static_cast<int64_t>(soft),
             static_cast<int64_t>(nofile.rlim_max));
}

}  // namespace

absl::Status RunServer(const ServerOptions& options) {
  // Block the stop signals in this thread before any other starts, so every thread inherits the
  // mask and sigwait below is the only receiver.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  main_thread = pthread_self();
  WatchGrpcLogging(&OnListenerFailed);
  RaiseDescriptorLimit();

  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  absl::StatusOr<ListenAddress> listen = ParseListenAddress(options.listen_address);
  if (!listen.ok()) return listen.status();
  RateLimitProtobufLogging();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options);
  if (!credentials.ok()) return credentials.status();
  absl::StatusOr<Authenticator> authenticator = Authenticator();
  if (!options.auth_tokens.empty()) authenticator = Authenticator::FromFile(options.auth_tokens);
  if (!authenticator.ok()) return authenticator.status();
  std::string drain_token;
  if (!options.drain_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadBearerTokenFile(options.drain_token_file, "--drain_token_file");
    if (!token.ok()) return token.status();
    drain_token = *std::move(token);
  }
  if (const std::string warning = ExposureWarning(options); !warning.empty()) {
    SERVER_LOG(WARNING, "%s", warning);
  }
  absl::StatusOr<BackendChoice> choice = MakeBackend(options);
  if (!choice.ok()) return choice.status();
  SERVER_LOG(INFO, "backend %s", choice->reason);
  std::unique_ptr<AttentionBackend>* backend = &choice->backend;
  // The sessions' KV budget is what the device pool really holds (whole slabs, so at most
  // --kv_pool_bytes); the CPU backend takes host memory as it goes, up to --kv_pool_bytes.
  int64_t kv_pool_bytes = options.kv_pool_bytes > 0 ? options.kv_pool_bytes
                                                    : ServerOptions::kDefaultCpuKvPoolBytes;
  if (const int64_t device_pool = (*backend)->kv_device_pool_bytes(); device_pool > 0) {
    kv_pool_bytes = device_pool;
  }
  if (options.kv_pool_fraction > 0.0 && (*backend)->kv_device_pool_bytes() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_pool_fraction = ", options.kv_pool_fraction,
                     " sizes the CUDA device pool, but the backend is ", (*backend)->name(), " (",
                     choice->reason, "); use --kv_pool_bytes"));
  }
  if (options.cpu_projection_weights != "f32" && (*backend)->name() != "cpu") {
    SERVER_LOG(WARNING, "--cpu_projection_weights = %s has no effect: the backend is %s (%s)",
               options.cpu_projection_weights, (*backend)->name(), choice->reason);
  }
  if (options.cuda_attention != "auto" && (*backend)->name() != "cuda") {
    SERVER_LOG(WARNING, "--cuda_attention = %s has no effect: the backend is %s (%s)",
               options.cuda_attention, (*backend)->name(), choice->reason);
  }
  SERVER_LOG(INFO, "KV pool: %d bytes (%s)", kv_pool_bytes,
             options.kv_pool_bytes > 0 ? "--kv_pool_bytes"
             : (*backend)->kv_device_pool_bytes() > 0
                 ? absl::StrCat(options.kv_pool_fraction > 0.0 ? options.kv_pool_fraction
                                                               : ServerOptions::kDefaultCudaKvPoolFraction,
                                " of the free device memory")
                 : "the CPU backend's default; --kv_pool_bytes sets it");

  // Keep one gRPC library reference for the life of the process. Without it the last
  // grpc_shutdown (in ~ServerBuilder or ~Server) joins gRPC's executor threads synchronously,
  // and gRPC 1.51 can leave one parked in epoll_wait for many seconds after Shutdown, so a
  // drained server would not exit. Process exit reclaims everything instead.
  grpc_init();

  KvPool pool(kv_pool_bytes);
  std::string parameter_source = "--max_parameter_bytes";
  const int64_t max_parameter_bytes = options.max_parameter_bytes > 0
                                          ? options.max_parameter_bytes
                                          : DefaultMaxParameterBytes(&parameter_source);
  SERVER_LOG(INFO, "parameter budget %d bytes, from %s%s", max_parameter_bytes, parameter_source,
             options.max_parameter_bytes > 0 ? "" : ", halved");
  ParameterBudget parameters(max_parameter_bytes);
  SessionRegistry registry(options.limits.max_sessions, options.tenant_quotas);
  Executor executor(options.compute_threads);
  Metrics metrics(
      {ATTNSERVE_VERSION, std::string((*backend)->name()), (*backend)->device_description()}, &pool,
      &registry);
  // Metrics first: once the gRPC port (file) is visible, /metrics answers too.
  if (!options.metrics_address.empty()) {
    absl::StatusOr<int> metrics_port = metrics.Serve(options.metrics_address);
    if (!metrics_port.ok()) return metrics_port.status();
    SERVER_LOG(INFO, "metrics at http://%s/metrics (port %d)", options.metrics_address,
               *metrics_port);
    if (!options.metrics_port_file.empty()) {
      if (absl::Status s =
              WritePortFile(options.metrics_port_file, *metrics_port, "--metrics_port_file");
          !s.ok()) {
        return s;
      }
    }
  }
  const SchedulerOptions scheduler = ResolvedForBackend(options.scheduler, (*backend)->name());
  AttentionServiceImpl service(backend->get(), &executor, &pool, &parameters, &registry, &metrics,
                               options.limits, scheduler, &*authenticator);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options.listen_address, *credentials, &port);
  // gRPC sets SO_REUSEPORT by default: a second server on a taken port would bind it too and
  // silently take half of the connections. Off, the second one fails to start instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.limits.max_message_bytes));
  // Bounds what gRPC holds for every connection and call together, the messages being received
  // included: without it, callers that send most of a large message and go quiet grow the process
  // without limit (issue 21). Callers are authenticated before their request is read
  // (StreamedUnaryCall, server/rpc/wire_call.h), so this is spent on authenticated calls and on
  // connections' own buffers. Past it gRPC resets streams (its destructive reclaimer), of the
  // connection it picks, not necessarily the one holding the most (AuthBeforeBodyTest).
  const int64_t inflight_bytes = InflightMessageBytes(options.limits);
  grpc::ResourceQuota quota("attnserve");
  quota.Resize(static_cast<size_t>(inflight_bytes));
  builder.SetResourceQuota(quota);
  builder.RegisterService(&service);
  // Counts the calls in flight, for the shutdown below to wait for (declared before the server,
  // which it must outlive).
  CallTracker calls;
  {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counting;
    counting.push_back(calls.NewInterceptorFactory());
    builder.experimental().SetInterceptorCreators(std::move(counting));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot listen on '", options.listen_address, "': ",
        listen->unix_socket
            ? std::string("the socket path is in use or not writable")
            : absl::StrCat("port ", listen->port,
                           " is in use by another process, or the host is not an address of "
                           "this machine")));
  }
  service.SetReplica(options.replica_id.empty() ? DefaultReplicaId(port) : options.replica_id);
  metrics.SetReplica(service.replica());
  if (!options.drain_to.empty()) service.KeepConfigureRequestsForDrain();
  // Health answers both the server as a whole ("") and the service by its full name, as
  // Kubernetes gRPC probes and grpc_health_probe -service=... ask for either.
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(kServiceName, true);

  SERVER_LOG(INFO, "attnserve %s listening on %s (port %d)", ATTNSERVE_VERSION,
             options.listen_address, port);
  SERVER_LOG(INFO,
             "transport: %s; authentication: %s; tenant quotas: %d sessions, %d KV bytes, %d "
             "parameter bytes (0 = unlimited)",
             options.tls_cert.empty()        ? "plaintext"
             : options.tls_client_ca.empty() ? "TLS"
                                             : "mutual TLS (client certificates required)",
             authenticator->enabled() ? absl::StrCat(authenticator->size(), " bearer tokens")
                                      : std::string("off (every caller is the admin)"),
             options.tenant_quotas.max_sessions, options.tenant_quotas.max_kv_bytes,
             options.tenant_quotas.max_parameter_bytes);
  SERVER_LOG(INFO, "backend %s: %s; %d compute threads", (*backend)->name(),
             (*backend)->device_description(), executor.num_threads());
  SERVER_LOG(INFO,
             "batching: max_batch_size %d, max_batch_tokens %d, max_queue_delay %s, "
             "prefill_chunk_tokens %d",
             scheduler.max_batch_size, scheduler.max_batch_tokens,
             absl::FormatDuration(scheduler.max_queue_delay), scheduler.prefill_chunk_tokens);
  SERVER_LOG(INFO,
             "KV pool %d bytes; parameter budget %d bytes; limits: %d sessions, %d requests/session, %d tokens, %d "
             "message bytes, %d in-flight message bytes, request_ttl %s, session_ttl %s",
             pool.capacity_bytes(), parameters.capacity_bytes(), options.limits.max_sessions,
             options.limits.max_requests_per_session, options.limits.max_sequence_length,
             options.limits.max_message_bytes, inflight_bytes,
             absl::FormatDuration(options.limits.request_ttl),
             absl::FormatDuration(options.limits.session_ttl));
  if (!options.port_file.empty()) {
    if (absl::Status s = WritePortFile(options.port_file, port); !s.ok()) {
      server->Shutdown();
      return s;
    }
  }

  TtlSweeper sweeper(&registry, options.limits.request_ttl, options.limits.session_ttl,
                     SweepPeriod(options.limits.request_ttl, options.limits.session_ttl), &metrics);
  DrainOptions drain{options.drain_to, service.replica(), options.drain_timeout,
                     options.limits.max_message_bytes};
  drain.token = drain_token;
  drain.tenants = authenticator->enabled();
  std::unique_ptr<SessionRebalancer> rebalancer;
  if (!options.drain_to.empty() && options.rebalance_period > absl::ZeroDuration()) {
    rebalancer = std::make_unique<SessionRebalancer>(&registry, &metrics, drain,
                                                     options.rebalance_period);
  }

  int signal_number = 0;
  while (sigwait(&stop_signals, &signal_number) != 0) {
  }
  // A second SIGTERM (a supervisor repeating itself while the drain or the grace period runs) is
  // ignored rather than delivered to a thread that never blocked it (OpenBLAS starts its workers
  // before main) and ending the process mid-drain. SIGKILL still ends it; a second SIGINT too.
  signal(SIGTERM, SIG_IGN);
  if (listener_failed.load()) {
    SERVER_LOG(ERROR,
               "gRPC stopped accepting connections on port %d after accept4 failed (out of file "
               "descriptors?); gRPC 1.51 never resumes, so this replica stops now and exits 1 "
               "for its orchestrator to restart it",
               port);
  }
  SERVER_LOG(INFO, "signal %d: draining for up to %s", signal_number,
             absl::FormatDuration(options.shutdown_grace));

  // Order matters: stop accepting and drain calls (their tasks run on the executor, which is
  // still up), then stop the sweeper, then the executor, then free the sessions.
  server->GetHealthCheckService()->SetServingStatus(false);
  server->GetHealthCheckService()->SetServingStatus(kServiceName, false);
  if (rebalancer != nullptr) rebalancer->Stop();
  if (!options.drain_to.empty()) {
    // Still serving (health NOT_SERVING, session calls UNAVAILABLE) while the sessions move, so
    // the balancer sees this replica go down and routes their ids to the peer that takes them.
    service.StartDraining(options.drain_to);
    DrainSessions(registry, metrics, drain);
  }
  // New calls are refused, and the calls in flight finish, before gRPC's Shutdown sends GOAWAY:
  // its final GOAWAY and the close then wait for each client to have read its answers
  // (server/rpc/wire_call.h says why); Shutdown cancels what is still running at the deadline.
  const absl::Time grace_end = absl::Now() + options.shutdown_grace;
  service.StopAccepting();
  const int64_t in_flight = calls.live();
  const bool ended = calls.AwaitCallsStartedBefore(grace_end);
  SERVER_LOG(INFO, "shutdown: %d calls in flight at the stop; %s", in_flight,
             ended ? "all ended" : "the grace period ended first: cancelling the rest");
  server->Shutdown(absl::ToChronoTime(grace_end));
  server->Wait();
  if (!options.drain_to.empty()) {
    // Calls still in flight after the drain's log line may have been refused since.
    SERVER_LOG(INFO, "drain: in all, %d requests of calls after the cut were refused UNAVAILABLE",
               DrainRefusedRequests(registry));
  }
  sweeper.Stop();
  executor.Shutdown();
  for (const std::shared_ptr<Session>& session : registry.All()) {
    if (std::shared_ptr<Session> s = registry.Remove(session)) s->Close();
  }
  SERVER_LOG(INFO, "stopped; KV pool used %d bytes", pool.used_bytes());
  if (listener_failed.load()) {
    return absl::UnavailableError(
        "exiting 1: the gRPC port stopped accepting connections (see above)");
  }
  return absl::OkStatus();
}

}  // namespace attnserve::server
