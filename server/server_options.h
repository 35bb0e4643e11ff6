// The server's configuration: what the flags in main.cc fill in.
#ifndef ATTNSERVE_SERVER_SERVER_OPTIONS_H_
#define ATTNSERVE_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace attnserve::server {

// Limits enforced on every client; reported by GetServerInfo.
struct ServerLimits {
  int max_sessions = 64;
  int max_requests_per_session = 256;
  int64_t max_sequence_length = 32768;   // Tokens per request.
  int64_t max_message_bytes = 64 << 20;  // Both directions; gRPC answers RESOURCE_EXHAUSTED.
  // Memory gRPC may hold for all connections together (their buffers and the messages being
  // received), as a grpc::ResourceQuota: past it gRPC resets streams (RST_STREAM
  // ENHANCE_YOUR_CALM; it still opens its window for the whole of a message being read), rather
  // than the process growing until the kernel ends it. 0 = a sixteenth of the memory the process
  // may use (server/session/parameter_budget.h), and at least 4 x max_message_bytes.
  int64_t max_inflight_message_bytes = 0;
  absl::Duration request_ttl = absl::Minutes(10);  // Idle time before a request is freed.
  absl::Duration session_ttl = absl::Hours(1);     // Idle time before a session is freed.
  // Configure's checkpoint paths must resolve inside this directory
  // (server/session/weight_source.h); empty = checkpoints by path are refused.
  std::string checkpoint_root;
  // Outputs retained for call_id retries, all sessions together
  // (server/session/retained_outputs.h); storing one past it evicts the oldest. > 0.
  int64_t max_retained_output_bytes = int64_t{256} << 20;
  // An ImportRequest stream silent this long (no header, or no next page chunk) is ended
  // DEADLINE_EXCEEDED and the pool bytes its header reserved are given back; zero = never.
  absl::Duration import_idle_timeout = absl::Seconds(30);
  // A ForwardStream that owes rows (or its header) and sends no message this long is ended
  // DEADLINE_EXCEEDED, and every request it created released: until then the session's later ops
  // wait for it (server/rpc/forward_stream.h); zero = never.
  absl::Duration forward_stream_idle_timeout = absl::Seconds(30);
};

// Continuous batching and chunked prefill, per session (see server/session/scheduler.h and the
// "Server" section of docs/design.md).
struct SchedulerOptions {
  // A decode batch launches when it holds this many steps (one token each)...
  int max_batch_size = 64;
  // ...or when its steps attend to this many tokens in all (sum of each step's context length,
  // the new token included: TGI's max_batch_total_tokens), which bounds one batch's compute;
  // 0 = the backend's: kCpuMaxBatchTokens on the CPU, where it bounds a step's latency on a few
  // cores, and kCudaMaxBatchTokens on a GPU, where the CPU's figure stopped batches at 32 steps of
  // 8k tokens and left half of an H200's engine time idle (docs/gpu_benchmarks.md)...
  int64_t max_batch_tokens = 0;
  static constexpr int64_t kCpuMaxBatchTokens = 262144;
  static constexpr int64_t kCudaMaxBatchTokens = int64_t{64} * 32768;
  // ...or at once when every stream the previous batch answered is back (a lone client never
  // waits), or when none of them came back for the longer of this and that batch's engine time
  // (server/session/scheduler.h); 0 = never wait: launch with whatever waits.
  absl::Duration max_queue_delay = absl::Microseconds(500);
  // Forward prompts longer than this run as several engine Prefill calls of this many tokens,
  // with one decode batch of the session between two chunks. 0 = never split.
  int64_t prefill_chunk_tokens = 512;
};

// `options` with its backend-dependent defaults (a max_batch_tokens of 0) resolved for the backend
// named `backend` ("cpu", "cuda").
inline SchedulerOptions ResolvedForBackend(SchedulerOptions options, absl::string_view backend) {
  if (options.max_batch_tokens == 0) {
    options.max_batch_tokens = backend == "cuda" ? SchedulerOptions::kCudaMaxBatchTokens
                                                 : SchedulerOptions::kCpuMaxBatchTokens;
  }
  return options;
}

// Per-tenant caps (see server/security/caller.h and server/session/registry.h), applied to every
// tenant of the --auth_tokens file except admins; 0 = unlimited. They apply only when
// authentication is on.
struct TenantQuotas {
  int max_sessions = 0;             // Live sessions of one tenant.
  int64_t max_kv_bytes = 0;         // KV cache bytes held by one tenant's sessions together.
  int64_t max_parameter_bytes = 0;  // Weight bytes held by one tenant's sessions together.
  // Outputs retained for one tenant's call_id retries (its oldest are evicted past it).
  int64_t max_retained_output_bytes = 0;
};

struct ServerOptions {
  std::string listen_address = "127.0.0.1:50051";  // Port 0 picks a free port.
  std::string port_file;  // When set, the bound port is written here once listening.
  // Prometheus /metrics endpoint, host:port (port 0 picks a free port); empty = not served.
  std::string metrics_address;
  std::string metrics_port_file;  // When set, the metrics port is written here before serving.
  // "auto", "cpu" or "cuda" (kernels/backend_factory.h). auto: CUDA when a device is usable, else
  // CPU, so one image serves with or without a GPU in its container; the log says which and why.
  std::string backend = "auto";
  // This replica's name in Configure's and GetServerInfo's `replica`; empty = "<hostname>:<port>".
  std::string replica_id;
  int engine_threads = 0;         // CPU backend threads; 0 = one per hardware thread.
  int compute_threads = 2;        // Executor threads running engine calls (one per busy session).
  // 0 = chosen by backend: kDefaultCpuKvPoolBytes on the CPU backend, kDefaultCudaKvPoolFraction
  // of the free device memory on the CUDA backend (as vLLM's gpu_memory_utilization).
  int64_t kv_pool_bytes = 0;
  // Weight bytes all sessions may hold together (server/session/parameter_budget.h); 0 = half of
  // the machine's physical memory.
  int64_t max_parameter_bytes = 0;
  // CUDA only: when > 0, the device page pool (and so the sessions' KV budget) is this fraction of
  // the device memory free at startup, instead of kv_pool_bytes.
  double kv_pool_fraction = 0.0;
  // CUDA only: "auto", "native" or "flashinfer" (kernels/cuda/runtime/cuda_backend.h).
  std::string cuda_attention = "auto";
  // CPU only: how GQA/MHA/MQA layers keep q/k/v/o_proj's weights, "f32" or "bf16" (rounded once,
  // half the bytes a decode step reads; CpuBackendOptions::projection_weights).
  std::string cpu_projection_weights = "f32";

  static constexpr int64_t kDefaultCpuKvPoolBytes = int64_t{1} << 30;
  // What is left beside it holds the layers' device weights and cuBLAS's workspace.
  static constexpr double kDefaultCudaKvPoolFraction = 0.8;
  absl::Duration shutdown_grace = absl::Seconds(10);
  // On SIGTERM, hand every live session and request to the replica (or balancer) at drain_to
  // before exiting, for at most drain_timeout (server/fleet/drain.h); empty = no drain.
  std::string drain_to;
  absl::Duration drain_timeout = absl::Seconds(60);
  // A file holding the bearer token a drain presents to its peer (first line); empty = none. With
  // authentication on at the peer the token must be an admin's there (server/fleet/drain.h).
  std::string drain_token_file;
  // With drain_to (the balancer): how often sessions taken over in a drain are checked against
  // the balancer's hash and moved to the replica it names now (server/fleet/session_rebalancer.h);
  // zero = never. Off by default: with drain_to naming a peer replica rather than a balancer,
  // that peer's answer is no hash, and sessions would follow it back.
  absl::Duration rebalance_period = absl::ZeroDuration();
  ServerLimits limits;
  SchedulerOptions scheduler;
  // Transport security (PEM files; all empty = plaintext). tls_cert and tls_key go together;
  // tls_client_ca additionally requires and verifies a client certificate signed by that CA.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // Bearer-token table (format in server/security/caller.h); empty = authentication off.
  std::string auth_tokens;
  TenantQuotas tenant_quotas;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SERVER_OPTIONS_H_
