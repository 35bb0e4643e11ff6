// The attnserve.v1.AttentionService implementation over the gRPC callback API.
//
// Handlers run on gRPC's threads and never block: they validate what is cheap, look the session
// up, and hand the rest to the session's scheduler (server/session_scheduler.h): decode steps of
// Decode and DecodeStream join the session's next batch; Forward and Release run as ordered ops
// on the session's SerialQueue. Configure runs on the Executor. The task finishes the call.
// GetSession, ListSessions and GetServerInfo only read counters under short mutexes and answer
// inline.
#ifndef ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
#define ATTNSERVE_SERVER_ATTENTION_SERVICE_H_

#include <memory>
#include <string>

#include "attnserve/v1/attention_service.grpc.pb.h"
#include "kernels/backend.h"
#include "server/executor.h"
#include "server/kv_pool.h"
#include "server/metrics.h"
#include "server/server_options.h"
#include "server/session_registry.h"
#include "server/timer_queue.h"

namespace attnserve::server {

class AttentionServiceImpl final : public v1::AttentionService::CallbackService {
 public:
  // `backend`, `executor`, `pool`, `registry` and `metrics` must outlive the service and its
  // calls. Every call is reported to `metrics` as it finishes (see docs/metrics.md).
  AttentionServiceImpl(AttentionBackend* backend, Executor* executor, KvPool* pool,
                       SessionRegistry* registry, Metrics* metrics, const ServerLimits& limits,
                       const SchedulerOptions& scheduler = {});

  grpc::ServerUnaryReactor* Configure(grpc::CallbackServerContext* context,
                                      const v1::ConfigureRequest* request,
                                      v1::ConfigureResponse* response) override;
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const v1::ForwardRequest* request,
                                    v1::ForwardResponse* response) override;
  grpc::ServerUnaryReactor* Decode(grpc::CallbackServerContext* context,
                                   const v1::DecodeRequest* request,
                                   v1::DecodeResponse* response) override;
  grpc::ServerBidiReactor<v1::DecodeRequest, v1::DecodeResponse>* DecodeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* context,
                                    const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::GetSessionResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

 private:
  class DecodeStreamReactor;

  // Runs on the executor: validates, builds the layer, registers the session.
  // `variant` receives the spec's metrics label once the spec is valid.
  absl::Status DoConfigure(const v1::ConfigureRequest& request, v1::ConfigureResponse* response,
                           std::string* variant);

  AttentionBackend* const backend_;
  Executor* const executor_;
  KvPool* const pool_;
  SessionRegistry* const registry_;
  Metrics* const metrics_;
  const ServerLimits limits_;
  const SchedulerOptions scheduler_options_;
  // Wakes sessions whose decode batch waits for max_queue_delay. Declared last: destroyed first,
  // after the executor has been shut down (server.cc), so no batch task can still arm it.
  TimerQueue timer_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_ATTENTION_SERVICE_H_
