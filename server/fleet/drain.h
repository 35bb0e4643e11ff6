// Draining a replica to a peer on SIGTERM (--drain_to), so a rolling restart loses no request.
//
// The service already answers every session-changing call UNAVAILABLE and health NOT_SERVING
// (AttentionServiceImpl::StartDraining). Then the peer is asked (GetServerInfo, with this
// replica's --drain_token_file token) whether it can keep what it is handed: a peer that refuses
// the token, or that does not authenticate its callers while this replica has tenants, or that
// takes the token for no admin, gets nothing (the drain is refused: logged, the sessions stay here
// and end with the process as in a shutdown without --drain_to). Otherwise, for each live session:
// re-create it at the peer address under the same session id (a Configure carrying
// x-attnserve-session and x-attnserve-owner, the owning tenant that the peer's admin acts for
// (server/security/caller.h), with the request the session was configured with, inline
// weights included), retried on UNAVAILABLE until the answer comes from a replica other than this
// one — the peer may be the balancer, which keeps routing the id here until its health checks see
// NOT_SERVING; check that the re-created session's fingerprint is this one's; make the cut
// (DrainSeal, server/session/session.h): in its turn on the session's queue, after every call queued
// before it, the session is sealed and its requests listed, so calls in flight at SIGTERM finish
// and are moved, and calls that reach the session later (an ImportRequest whose pages came after
// the signal, a step that passed the service's check just before it) are refused UNAVAILABLE;
// then move each listed request: a copy made in its turn on the session's queue
// (Session::ExportRequest), sent as one ImportRequest with the same request id. Everything is
// bounded by one deadline; what is not moved by then is counted lost, and every request an OK
// answered is moved or counted lost (attnserve_drain_requests_total{outcome="moved"|"lost"|
// "refused"}) and logged.
#ifndef ATTNSERVE_SERVER_FLEET_DRAIN_H_
#define ATTNSERVE_SERVER_FLEET_DRAIN_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/observability/metrics.h"
#include "server/session/session.h"
#include "server/session/registry.h"

namespace attnserve::server {

// Metadata on a drain's Configure: the new session was taken over from a draining replica, so it
// lives where the balancer's hash put it only while that replica is away (SessionRebalancer).
inline constexpr char kMovedSessionMetadataKey[] = "x-attnserve-moved-session";

struct DrainOptions {
  std::string peer;         // HOST:PORT of a replica or of the balancer (plaintext gRPC).
  std::string own_replica;  // This replica's name: a Configure it answers is not a move.
  absl::Duration timeout = absl::Seconds(60);
  int64_t max_message_bytes = 64 << 20;  // Page chunks stay under it.
  // The bearer token sent to the peer (--drain_token_file; empty = none). With authentication
  // on at the peer it must be an admin's there, who re-creates each session for its owner.
  std::string token;
  // This replica authenticates its callers (--auth_tokens): its sessions belong to tenants, so a
  // peer that does not authenticate its own callers is refused.
  bool tenants = false;
};

struct DrainReport {
  int sessions_moved = 0;
  int sessions_lost = 0;
  int64_t requests_moved = 0;
  int64_t requests_lost = 0;
  // Requests of calls that reached a sealed session and were refused UNAVAILABLE (so far).
  int64_t requests_refused = 0;
  bool refused = false;  // The peer cannot keep what it would be handed: nothing was sent.
};

// Moves every session of `registry` to options.peer; sessions stay registered here (the caller
// frees them as it shuts down). Call after StartDraining, before the gRPC server is shut down
// (exports run on the sessions' queues, so the executor must still run).
DrainReport DrainSessions(SessionRegistry& registry, Metrics& metrics, const DrainOptions& options);

// Requests refused so far by the sessions of `registry` sealed by a drain.
int64_t DrainRefusedRequests(const SessionRegistry& registry);

// The same for one session (the rebalancer's move): `report` receives the outcome.
void DrainSession(const std::shared_ptr<Session>& session, Metrics& metrics,
                  const DrainOptions& options, DrainReport& report);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_FLEET_DRAIN_H_
