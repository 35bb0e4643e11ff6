// The attnserve.v1.AttentionService implementation over the gRPC callback API.
//
// Handlers run on gRPC's threads and never block: they validate what is cheap, look the session
// up, and hand the rest to the session's scheduler (server/session/scheduler.h): decode steps of
// Decode and DecodeStream join the session's next batch; Forward and Release run as ordered ops
// on the session's Strand. Configure runs on the Executor. The task finishes the call.
// GetSession, ListSessions and GetServerInfo only read counters under short mutexes and answer
// inline.
#ifndef ATTNSERVE_SERVER_RPC_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_RPC_ATTENTION_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "kernels/backend.h"
#include "server/observability/metrics.h"
#include "server/rpc/request_transfer.h"
#include "server/rpc/wire_call.h"
#include "server/runtime/executor.h"
#include "server/runtime/timer_queue.h"
#include "server/security/caller.h"
#include "server/server_options.h"
#include "server/session/kv_pool.h"
#include "server/session/parameter_budget.h"
#include "server/session/registry.h"
#include "server/session/retained_outputs.h"

namespace attnserve::server {

// Stacks gRPC's per-method mixins (template <class Base> class WithRawCallbackMethod_X : Base) on
// v1::AttentionService::Service, the first outermost.
template <template <class> class... Methods>
struct StackMethods {
  using type = v1::AttentionService::Service;
};
template <template <class> class First, template <class> class... Rest>
struct StackMethods<First, Rest...> {
  using type = First<typename StackMethods<Rest...>::type>;
};

// Every method is a raw one: the wire layer (server/rpc/wire_call.h) parses each request itself, so
// malformed bytes get INVALID_ARGUMENT, and serializes each response. The client-streaming
// methods (DecodeStream, ImportRequest, ForwardStream) use gRPC's generated mixins; the others are
// registered in the constructor as streams of one request, so that the caller is authenticated
// before its request is read (StreamedUnaryCall, server/rpc/wire_call.h).
using RawAttentionService =
    StackMethods<v1::AttentionService::WithRawCallbackMethod_DecodeStream,
                 v1::AttentionService::WithRawCallbackMethod_ImportRequest,
                 v1::AttentionService::WithRawCallbackMethod_ForwardStream>::type;

class AttentionServiceImpl final : public RawAttentionService {
 public:
  // `backend`, `executor`, `pool`, `registry`, `metrics` and `authenticator` must outlive the
  // service and its calls. Every call is reported to `metrics` as it finishes (see
  // docs/metrics.md). Every call is authenticated first (UNAUTHENTICATED ends it); a null
  // `authenticator` means authentication off (every caller is the admin).
  AttentionServiceImpl(AttentionBackend* backend, Executor* executor, KvPool* pool,
                       ParameterBudget* parameters, SessionRegistry* registry, Metrics* metrics,
                       const ServerLimits& limits, const SchedulerOptions& scheduler = {},
                       const Authenticator* authenticator = nullptr);

  // The streaming wire methods (the others are registered in the constructor).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecodeStream(
      grpc::CallbackServerContext* context) override;
  // Moving a request between replicas (server/rpc/request_transfer.h).
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportRequest(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  // A Forward larger than one message (server/rpc/forward_stream.h).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* ForwardStream(
      grpc::CallbackServerContext* context) override;

  // The name Configure and GetServerInfo report as `replica` (--replica_id, or host:port once the
  // port is bound; docs/deploy.md). Empty until set.
  void SetReplica(std::string replica) ABSL_LOCKS_EXCLUDED(replica_mu_);

  // --drain_to (server/fleet/drain.h). Before serving: every session keeps its Configure request
  // (inline weights included) so that a drain can re-create it on a peer. On SIGTERM:
  // StartDraining makes every call that would change a session (Configure, Forward, Decode,
  // DecodeStream, Fork, Release, ExportRequest, ImportRequest) UNAVAILABLE, naming `peer`.
  void KeepConfigureRequestsForDrain() { keep_configure_requests_ = true; }
  void StartDraining(std::string peer) ABSL_LOCKS_EXCLUDED(replica_mu_);
  std::string replica() const ABSL_LOCKS_EXCLUDED(replica_mu_);

  // On SIGTERM, once any drain is done and before the server waits for the calls in flight
  // (server.cc): every new call is refused UNAVAILABLE at its start, so that the wait ends. Calls
  // already admitted run to their end, open streams' next messages included.
  void StopAccepting() { stopping_.store(true); }

 private:
  class DecodeStreamReactor;

  // A typed handler: finishes `call` exactly once (now or from a task). `caller` is who is calling
  // (authenticated by ServeUnary): the registry shows it only its own sessions.
  template <typename Request, typename Response>
  using HandlerMethod = void(grpc::CallbackServerContext* context, const Principal& caller,
                             const Request& request, Response& response, UnaryCall* call);
  template <typename Request, typename Response>
  using Handler = HandlerMethod<Request, Response> AttentionServiceImpl::*;
  // Registers the method at `index` of attention_service.proto (the order in which gRPC's
  // generated code numbers them) as a stream of bytes whose reactors `factory` makes.
  void RegisterStreamMethod(
      int index, std::function<grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*(
                     grpc::CallbackServerContext*)>
                     factory);
  // Registers a unary method: each call authenticates its caller from the metadata
  // (UNAUTHENTICATED ends it before its request is read), is refused while draining when it
  // changes sessions, reads and parses its request, and runs `handler`.
  template <typename Request, typename Response>
  void ServeUnary(int index, Rpc rpc, Handler<Request, Response> handler);

  HandlerMethod<v1::ConfigureRequest, v1::ConfigureResponse> HandleConfigure;
  HandlerMethod<v1::ForwardRequest, v1::ForwardResponse> HandleForward;
  HandlerMethod<v1::DecodeRequest, v1::DecodeResponse> HandleDecode;
  HandlerMethod<v1::ReleaseRequest, v1::ReleaseResponse> HandleRelease;
  HandlerMethod<v1::ForkRequest, v1::ForkResponse> HandleFork;
  HandlerMethod<v1::GetSessionRequest, v1::GetSessionResponse> HandleGetSession;
  HandlerMethod<v1::ListSessionsRequest, v1::ListSessionsResponse> HandleListSessions;
  HandlerMethod<v1::GetServerInfoRequest, v1::GetServerInfoResponse> HandleGetServerInfo;

  // Runs on the executor: validates, charges the parameter budget, builds the layer, registers
  // the session. `variant` receives the spec's metrics label once the spec is valid. Polls
  // `cancelled` between stages (and while drawing seeded weights): a cancelled call or an expired
  // deadline abandons the layer and frees what it had taken.
  // The session belongs to `owner`, within its tenant quotas, and is named `session_id`
  // (server/fleet/session_affinity.h).
  absl::Status DoConfigure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response,
                           std::string* variant, const std::function<bool()>& cancelled,
                           const Principal& owner, const std::string& session_id);
  // UNAVAILABLE "replica ... is draining" once StartDraining ran, else OK.
  grpc::Status DrainingStatus() const ABSL_LOCKS_EXCLUDED(replica_mu_);
  // What a new call is told at its start: UNAVAILABLE once StopAccepting ran, else
  // DrainingStatus().
  grpc::Status AdmissionStatus() const ABSL_LOCKS_EXCLUDED(replica_mu_);
  // Who is calling, and for whom: an admin may act for the owner a drain names
  // (server/security/caller.h).
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& context) const {
    absl::StatusOr<Principal> caller = authenticator_ == nullptr
                                           ? Principal::Unauthenticated()
                                           : authenticator_->Authenticate(context);
    if (!caller.ok()) return caller;
    return ActingPrincipal(authenticator_, *caller, context);
  }

  AttentionBackend* const backend_;
  Executor* const executor_;
  KvPool* const pool_;
  ParameterBudget* const parameters_;
  SessionRegistry* const registry_;
  Metrics* const metrics_;
  const ServerLimits limits_;
  const SchedulerOptions scheduler_options_;
  const Authenticator* const authenticator_;
  bool keep_configure_requests_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};
  // What ExportRequest and ImportRequest use of the above.
  const TransferContext transfer_;
  // Outputs kept for call_id retries by every session (server/session/retained_outputs.h).
  const std::shared_ptr<RetainedOutputs> retained_;
  mutable absl::Mutex replica_mu_;
  std::string replica_ ABSL_GUARDED_BY(replica_mu_);
  std::string drain_peer_ ABSL_GUARDED_BY(replica_mu_);
  // Wakes sessions whose decode batch waits for max_queue_delay. Declared last: destroyed first,
  // after the executor has been shut down (server.cc), so no batch task can still arm it.
  TimerQueue timer_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_ATTENTION_SERVICE_H_
