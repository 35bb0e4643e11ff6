// attnserve_server: serves attnserve.v1.AttentionService. See docs/api.md.
#include <malloc.h>
#include <sys/resource.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/base/command_line_usage.h"
#include "kernels/cpu/blas_core.h"
#include "server/observability/call_log.h"
#include "server/observability/logging.h"
#include "server/server.h"
#include "server/server_options.h"
#include "server/session/weight_source.h"

namespace {
const attnserve::server::ServerOptions kDefaults;
const attnserve::server::ServerLimits kDefaultLimits;
}  // namespace

ABSL_FLAG(std::string, listen, kDefaults.listen_address,
          "Address to listen on, host:port; port 0 picks a free port (see --port_file).");
ABSL_FLAG(std::string, port_file, "", "Write the bound port to this file once listening.");
ABSL_FLAG(std::string, metrics_address, "",
          "Serve Prometheus metrics at http://ADDRESS/metrics (host:port; port 0 picks a free "
          "port, see --metrics_port_file); empty = no metrics endpoint. See docs/metrics.md.");
ABSL_FLAG(std::string, metrics_port_file, "",
          "Write the bound metrics port to this file once /metrics is served.");
ABSL_FLAG(std::string, log_format, "text",
          "text or json. text: '<local time> <I|W|E> message key=value ...' lines; json: one "
          "object per line with ts (UTC, RFC 3339), level, msg and the line's fields, for log "
          "pipelines (gRPC's own messages too).");
ABSL_FLAG(int64_t, log_failed_calls_per_second, 10,
          "Failed calls (any non-OK status) are logged with the caller's address, the RPC, the "
          "code and its message: at most this many lines per second per status code, the rest "
          "counted and reported as suppressed. 0 = failed calls are not logged.");
ABSL_FLAG(std::string, replica_id, "",
          "This replica's name, reported as `replica` by Configure and GetServerInfo so that a "
          "client behind a load balancer knows where its session lives (docs/deploy.md); empty = "
          "<hostname>:<bound port>.");
ABSL_FLAG(std::string, backend, kDefaults.backend,
          "auto, cpu or cuda. auto (the default): CUDA when this binary has it and a device is "
          "usable, else CPU; the log says which and why. cuda with no usable device fails at "
          "startup.");
ABSL_FLAG(int, threads, kDefaults.engine_threads,
          "CPU backend threads; 0 = one per hardware thread.");
ABSL_FLAG(int, compute_threads, kDefaults.compute_threads,
          "Executor threads running engine calls (different sessions run in parallel).");
ABSL_FLAG(int64_t, kv_pool_bytes, kDefaults.kv_pool_bytes,
          "KV cache pool of the device, in bytes, shared by all sessions. 0 = chosen by the "
          "backend: 1 GiB on the CPU backend, 0.8 of the free GPU memory on the CUDA backend.");
ABSL_FLAG(double, kv_pool_fraction, kDefaults.kv_pool_fraction,
          "CUDA backend: size the device KV pool as this fraction (0, 0.95] of the GPU memory free "
          "at startup (0 = the default, 0.8, unless --kv_pool_bytes is set). Refused when the "
          "backend is cpu.");
ABSL_FLAG(std::string, cuda_attention, kDefaults.cuda_attention,
          "CUDA backend: the attention kernels for f16/bf16 pages: auto (flashinfer where this "
          "build has it, else native), native (attnserve's own) or flashinfer (FlashInfer's paged "
          "decode and prefill; f32 pages stay native). native/flashinfer are refused when the "
          "backend is cpu; flashinfer also when the build has no FlashInfer.");
ABSL_FLAG(std::string, cpu_projection_weights, kDefaults.cpu_projection_weights,
          "CPU backend: f32 or bf16, the dtype GQA/MHA/MQA layers keep q/k/v/o_proj's weights in "
          "(bf16: rounded once at Configure, widened to f32 in registers, f32 accumulation; half "
          "the bytes a decode step reads). MLA layers keep f32. Refused when the backend is cuda.");
ABSL_FLAG(int64_t, max_parameter_bytes, kDefaults.max_parameter_bytes,
          "Weight bytes all sessions may hold together; a Configure whose layer would pass it is "
          "refused before anything is allocated. 0 = half of the machine's physical memory.");
ABSL_FLAG(int, max_sessions, kDefaultLimits.max_sessions, "Live sessions at most.");
ABSL_FLAG(int, max_requests_per_session, kDefaultLimits.max_requests_per_session,
          "Live requests per session at most.");
ABSL_FLAG(int64_t, max_sequence_length, kDefaultLimits.max_sequence_length,
          "Tokens per request at most.");
ABSL_FLAG(int64_t, max_message_bytes, kDefaultLimits.max_message_bytes,
          "Largest gRPC message received or sent, in bytes.");
ABSL_FLAG(int64_t, max_inflight_message_bytes, kDefaultLimits.max_inflight_message_bytes,
          "Memory gRPC may hold for all connections and the messages they are receiving, "
          "together (a grpc::ResourceQuota): past it gRPC resets streams (clients see "
          "RESOURCE_EXHAUSTED) instead of the process running out of memory. 0 = a sixteenth of the "
          "memory the process may use (physical, cgroup or RLIMIT_AS), at least 4 x "
          "--max_message_bytes. Must be >= --max_message_bytes.");
ABSL_FLAG(int64_t, max_retained_output_bytes, kDefaultLimits.max_retained_output_bytes,
          "Bytes of call outputs kept for call_id retries, all sessions together (each request "
          "keeps its last call_id's output); past it the oldest are evicted, and a retry of an "
          "evicted call is FAILED_PRECONDITION naming its call_id (docs/api.md). Must be > 0.");
ABSL_FLAG(absl::Duration, import_idle_timeout, kDefaultLimits.import_idle_timeout,
          "An ImportRequest stream that sends no message for this long (its header, then each "
          "chunk of page bytes) is ended DEADLINE_EXCEEDED and the KV pool bytes its header "
          "reserved are given back; 0 = never (not advised: a stalled client holds them).");
ABSL_FLAG(absl::Duration, forward_stream_idle_timeout, kDefaultLimits.forward_stream_idle_timeout,
          "A ForwardStream that sends no message for this long while it still owes rows (or its "
          "header) is ended DEADLINE_EXCEEDED and every request it created is released, so the "
          "session's later ops (which wait for it) go on; 0 = never (not advised: a stalled "
          "client holds them until its call's deadline).");
ABSL_FLAG(absl::Duration, request_ttl, kDefaultLimits.request_ttl,
          "Idle time after which a request's KV cache is freed; 0 = never.");
ABSL_FLAG(absl::Duration, session_ttl, kDefaultLimits.session_ttl,
          "Idle time after which a session is freed; 0 = never.");
ABSL_FLAG(std::string, checkpoint_root, "",
          "Directory that Configure's checkpoint paths must resolve inside (symlinks followed; a "
          "relative path is taken relative to it). Empty = checkpoints by path are refused.");
ABSL_FLAG(absl::Duration, shutdown_grace, kDefaults.shutdown_grace,
          "On SIGTERM/SIGINT, how long in-flight calls may finish before they are cancelled.");
ABSL_FLAG(std::string, drain_to, "",
          "On SIGTERM, first move every live session and request to the replica or balancer at "
          "this HOST:PORT (re-created under the same session id, then ExportRequest/"
          "ImportRequest), answering other calls UNAVAILABLE meanwhile. Empty = no drain.");
ABSL_FLAG(absl::Duration, drain_timeout, kDefaults.drain_timeout,
          "With --drain_to: how long the drain may take in all; what is not moved by then is lost.");
ABSL_FLAG(std::string, drain_token_file, "",
          "With --drain_to: a file whose first line is the bearer token the drain presents to "
          "the peer. A peer with --auth_tokens must take it as an admin, who re-creates each "
          "session for its owning tenant; a server with --auth_tokens refuses to drain to a peer "
          "without them. Empty = no token.");
ABSL_FLAG(absl::Duration, rebalance_period, kDefaults.rebalance_period,
          "With --drain_to=<the balancer>: how often sessions this replica took over in a drain "
          "are checked against the balancer's hash; one that hashes to another replica now (the "
          "drained one, back under its name) is moved there. 0 = never (the default; only "
          "meaningful when --drain_to is the balancer).");

ABSL_FLAG(int, max_batch_size, kDefaults.scheduler.max_batch_size,
          "Continuous batching: decode steps per engine Decode call at most (per session).");
ABSL_FLAG(int64_t, max_batch_tokens, kDefaults.scheduler.max_batch_tokens,
          "Continuous batching: tokens one decode batch may attend to in all (sum of its steps' "
          "context lengths); a batch launches once it would pass this. 0 = the backend's: "
          "262144 on the CPU, 2097152 (64 x 32768) on CUDA.");
ABSL_FLAG(absl::Duration, max_queue_delay, kDefaults.scheduler.max_queue_delay,
          "Continuous batching: a batch waits for the streams the previous batch answered until "
          "all are back or none came back for the longer of this (e.g. 500us) and that batch's "
          "engine time; a lone client never waits; 0 = launch with whatever waits.");
ABSL_FLAG(int64_t, prefill_chunk_tokens, kDefaults.scheduler.prefill_chunk_tokens,
          "Chunked prefill: Forward prompts longer than this run in chunks of this many tokens, "
          "with decode batches of the session between them; 0 = never split.");

ABSL_FLAG(std::string, tls_cert, "",
          "TLS: PEM certificate chain of the server (with --tls_key); empty = plaintext.");
ABSL_FLAG(std::string, tls_key, "", "TLS: PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "Mutual TLS: PEM CA certificate(s); every client must present a certificate signed by "
          "one of them. Requires --tls_cert and --tls_key.");
ABSL_FLAG(std::string, auth_tokens, "",
          "Bearer-token authentication: a file of '<sha256 hex of a token> <tenant> [admin]' lines "
          "(see docs/api.md); calls must send 'authorization: Bearer <token>'. Empty = off (every "
          "caller may use every session).");
ABSL_FLAG(int, tenant_max_sessions, kDefaults.tenant_quotas.max_sessions,
          "With --auth_tokens: live sessions per non-admin tenant at most; 0 = unlimited.");
ABSL_FLAG(int64_t, tenant_max_kv_bytes, kDefaults.tenant_quotas.max_kv_bytes,
          "With --auth_tokens: KV cache bytes per non-admin tenant (all its sessions) at most; "
          "0 = unlimited.");
ABSL_FLAG(int64_t, tenant_max_retained_output_bytes,
          kDefaults.tenant_quotas.max_retained_output_bytes,
          "With --auth_tokens: bytes of call outputs kept for one non-admin tenant's call_id "
          "retries (its oldest evicted past it), within --max_retained_output_bytes; 0 = only "
          "that bound.");
ABSL_FLAG(int64_t, tenant_max_parameter_bytes, kDefaults.tenant_quotas.max_parameter_bytes,
          "With --auth_tokens: weight bytes per non-admin tenant (all its sessions) at most; "
          "0 = unlimited.");

int main(int argc, char** argv) {
  // First: OpenBLAS chose its kernels when it loaded; on a CPU too new for it, run again with
  // better ones named (kernels/cpu/blas_core.h).
  attnserve::ReexecForBetterBlasCore(argv);
  // Under an address-space limit (RLIMIT_AS), glibc's per-thread malloc arenas each reserve 64 MiB
  // of it up front (up to 8 per core): with the backend's and gRPC's threads, most of a GiB of the
  // limit gone before any weight is loaded. Two arenas keep that reservation small; the default
  // --max_parameter_bytes is then taken from what the limit leaves (parameter_budget.h).
  if (rlimit as{}; getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    mallopt(M_ARENA_MAX, 2);
  }
  // Debian's abseil is built without NDEBUG, so by default every Mutex lock records lock-order
  // edges in a global graph (GraphCycles) to detect deadlocks: in a profile of decode steps of one
  // row through SmolLM2's layers that was about 1.4% of the server's samples, a per-lock cost on
  // every call. The tests (tests/ link their own main) keep the check; the server does not pay it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  attnserve::SetCommandLineUsage("attnserve_server",
                                 "Serves attnserve.v1.AttentionService over gRPC.",
                                 {"server/main.cc"});
  absl::ParseCommandLine(argc, argv);
  attnserve::server::LogFormat log_format;
  if (!attnserve::server::ParseLogFormat(absl::GetFlag(FLAGS_log_format), &log_format)) {
    SERVER_LOG(ERROR, "--log_format=%s: expected text or json", absl::GetFlag(FLAGS_log_format));
    return 1;
  }
  attnserve::server::SetLogFormat(log_format);
  if (log_format == attnserve::server::LogFormat::kJson) attnserve::server::RouteGrpcLogging();
  if (absl::GetFlag(FLAGS_log_failed_calls_per_second) < 0) {
    SERVER_LOG(ERROR, "--log_failed_calls_per_second=%d: must be >= 0",
               absl::GetFlag(FLAGS_log_failed_calls_per_second));
    return 1;
  }
  attnserve::server::SetFailedCallLogRate(absl::GetFlag(FLAGS_log_failed_calls_per_second));
  attnserve::server::ServerOptions options;
  options.listen_address = absl::GetFlag(FLAGS_listen);
  options.port_file = absl::GetFlag(FLAGS_port_file);
  options.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  options.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  options.backend = absl::GetFlag(FLAGS_backend);
  options.replica_id = absl::GetFlag(FLAGS_replica_id);
  options.engine_threads = absl::GetFlag(FLAGS_threads);
  options.compute_threads = absl::GetFlag(FLAGS_compute_threads);
  options.kv_pool_bytes = absl::GetFlag(FLAGS_kv_pool_bytes);
  options.cuda_attention = absl::GetFlag(FLAGS_cuda_attention);
  options.cpu_projection_weights = absl::GetFlag(FLAGS_cpu_projection_weights);
  options.kv_pool_fraction = absl::GetFlag(FLAGS_kv_pool_fraction);
  options.max_parameter_bytes = absl::GetFlag(FLAGS_max_parameter_bytes);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  options.drain_to = absl::GetFlag(FLAGS_drain_to);
  options.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  options.drain_token_file = absl::GetFlag(FLAGS_drain_token_file);
  options.rebalance_period = absl::GetFlag(FLAGS_rebalance_period);
  options.limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.limits.max_requests_per_session = absl::GetFlag(FLAGS_max_requests_per_session);
  options.limits.max_sequence_length = absl::GetFlag(FLAGS_max_sequence_length);
  options.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.limits.max_inflight_message_bytes = absl::GetFlag(FLAGS_max_inflight_message_bytes);
  options.limits.max_retained_output_bytes = absl::GetFlag(FLAGS_max_retained_output_bytes);
  options.limits.import_idle_timeout = absl::GetFlag(FLAGS_import_idle_timeout);
  options.limits.forward_stream_idle_timeout = absl::GetFlag(FLAGS_forward_stream_idle_timeout);
  options.limits.request_ttl = absl::GetFlag(FLAGS_request_ttl);
  options.limits.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.limits.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  if (absl::Status root = attnserve::server::CheckCheckpointRoot(options.limits.checkpoint_root);
      !root.ok()) {
    SERVER_LOG(ERROR, "%s", root.ToString());
    return 1;
  }

  options.scheduler.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.scheduler.max_queue_delay = absl::GetFlag(FLAGS_max_queue_delay);
  options.scheduler.prefill_chunk_tokens = absl::GetFlag(FLAGS_prefill_chunk_tokens);

  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  options.tenant_quotas.max_sessions = absl::GetFlag(FLAGS_tenant_max_sessions);
  options.tenant_quotas.max_kv_bytes = absl::GetFlag(FLAGS_tenant_max_kv_bytes);
  options.tenant_quotas.max_parameter_bytes = absl::GetFlag(FLAGS_tenant_max_parameter_bytes);
  options.tenant_quotas.max_retained_output_bytes =
      absl::GetFlag(FLAGS_tenant_max_retained_output_bytes);

  const absl::Status status = attnserve::server::RunServer(options);
  if (!status.ok()) {
    SERVER_LOG(ERROR, "%s", status.ToString());
    return 1;
  }
  return 0;
}
