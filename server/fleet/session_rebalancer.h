// Sessions taken over in a drain go home (--drain_to=<the balancer>, --rebalance_period).
//
// A drain re-creates a replica's sessions where the balancer's consistent hash sends their ids
// while that replica is away. When it comes back under the same name (a StatefulSet pod restarted
// in a rolling update), the hash sends those ids back to it, where they would be NOT_FOUND. So a
// replica periodically asks the balancer, for each session it adopted (created by a drain's
// Configure, server/fleet/drain.h), which replica the id hashes to now (GetServerInfo carrying
// x-attnserve-session); when that is another replica, it unlists the session (later calls here are
// NOT_FOUND; the balancer sends them to the new owner anyway), moves it there as a drain does, and
// frees it. Sessions configured directly on this replica are never moved: a client that talks to
// the replica itself must keep finding them.
#ifndef ATTNSERVE_SERVER_FLEET_SESSION_REBALANCER_H_
#define ATTNSERVE_SERVER_FLEET_SESSION_REBALANCER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "server/fleet/drain.h"
#include "server/observability/metrics.h"
#include "server/session/registry.h"

namespace attnserve::server {

class SessionRebalancer {
 public:
  // Checks every `period` (> 0). `options.peer` is the balancer, `options.own_replica` this one;
  // `options.timeout` bounds each session's move. `registry` and `metrics` outlive it.
  SessionRebalancer(SessionRegistry* registry, Metrics* metrics, DrainOptions options,
                    absl::Duration period);
  ~SessionRebalancer();  // Stop().

  // Ends the checks (a move under way finishes first). Idempotent.
  void Stop();

 private:
  void Run();
  // The replica the balancer sends `session_id` to now; empty when it cannot tell.
  std::string Owner(const std::string& session_id) const;

  SessionRegistry* const registry_;
  Metrics* const metrics_;
  const DrainOptions options_;
  const absl::Duration period_;
  const std::unique_ptr<v1::AttentionService::Stub> stub_;  // To the balancer.
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FLEET_SESSION_REBALANCER_H_
