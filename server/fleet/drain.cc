#include "server/fleet/drain.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "attnserve/v1/attention_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "proto/codec/import_stream.h"
#include "server/fleet/session_affinity.h"
#include "server/observability/logging.h"
#include "server/rpc/request_transfer.h"
#include "server/security/caller.h"
#include "server/session/layer_fingerprint.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"

namespace attnserve::server {

namespace {

// Between two Configure attempts while the balancer still routes the session here.
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);
// Room left under the message limit for the framing around one chunk's bytes.
constexpr int64_t kChunkHeadroomBytes = 1024;

absl::Status FromGrpc(absl::string_view rpc, const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, ": ", status.error_message()));
}

class Drainer {
 public:
  Drainer(Metrics& metrics, const DrainOptions& options)
      : metrics_(metrics), options_(options), deadline_(absl::Now() + options.timeout) {
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
    args.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
    stub_ = v1::AttentionService::NewStub(
        grpc::CreateCustomChannel(options.peer, grpc::InsecureChannelCredentials(), args));
  }

  // Whether the peer can keep what a drain hands it: OK, or FAILED_PRECONDITION saying why not
  // (it refuses this replica's credentials, or this replica has tenants and the peer does not
  // authenticate its callers, or does not take this replica as an admin acting for them). A peer
  // that does not answer before the deadline is no verdict: the sessions then fail on their own.
  // `session_id` (when not empty) routes the question through a balancer to where that session
  // goes.
  absl::Status CheckPeer(const std::string& session_id = "") {
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(deadline_));
      Authorize(context);
      if (!session_id.empty()) context.AddMetadata(kSessionMetadataKey, session_id);
      v1::GetServerInfoRequest request;
      v1::GetServerInfoResponse info;
      const grpc::Status status = stub_->GetServerInfo(&context, request, &info);
      if (status.ok() && info.replica() == options_.own_replica) {
        // The balancer still routes to this replica: ask again, as Recreate does.
        if (absl::Now() + kRetryPause >= deadline_) return absl::OkStatus();
        absl::SleepFor(kRetryPause);
        continue;
      }
      if (status.ok()) return CheckPeerInfo(info);
      switch (status.error_code()) {
        case grpc::StatusCode::UNAVAILABLE:
          if (absl::Now() + kRetryPause >= deadline_) return absl::OkStatus();
          absl::SleepFor(kRetryPause);
          continue;
        case grpc::StatusCode::DEADLINE_EXCEEDED:
          return absl::OkStatus();
        case grpc::StatusCode::UNAUTHENTICATED:
        case grpc::StatusCode::PERMISSION_DENIED:
          return absl::FailedPreconditionError(absl::StrCat(
              "the peer refuses this replica's credentials (",
              options_.token.empty() ? "none sent: set --drain_token_file" : "--drain_token_file",
              "): ", status.error_message()));
        default:
          return absl::FailedPreconditionError(
              absl::StrCat("the peer's GetServerInfo failed: ", FromGrpc("GetServerInfo", status)
                                                                    .ToString()));
      }
    }
  }

  // Moves one session and its requests; adds the outcome to `report`.
  void Drain(const std::shared_ptr<Session>& shared, DrainReport& report) {
    Session& session = *shared;
    const std::string variant = session.variant_label();
    absl::Status recreated = Recreate(session);
    if (!recreated.ok()) {
      // Not sealed: its calls go on as in a shutdown without a drain, and end with the process.
      const int64_t held = session.num_requests();
      SERVER_LOG(ERROR, "drain: session %s not re-created at %s (%d requests lost): %s",
                 session.id(), options_.peer, held, recreated.ToString());
      ++report.sessions_lost;
      report.requests_lost += held;
      metrics_.CountDrainedRequests(variant, Metrics::DrainOutcome::kLost, held);
      return;
    }
    absl::StatusOr<std::vector<std::string>> listed = SealAndList(shared, variant);
    if (!listed.ok()) {
      const int64_t held = session.num_requests();
      SERVER_LOG(ERROR, "drain: session %s: %d requests lost: %s", session.id(), held,
                 listed.status().ToString());
      ++report.sessions_lost;
      report.requests_lost += held;
      metrics_.CountDrainedRequests(variant, Metrics::DrainOutcome::kLost, held);
      return;
    }
    const std::vector<std::string>& requests = *listed;
    int64_t lost = 0;
    for (const std::string& request_id : requests) {
      absl::Status moved = MoveRequest(shared, request_id);
      if (moved.ok()) {
        ++report.requests_moved;
        metrics_.CountDrainedRequests(variant, Metrics::DrainOutcome::kMoved, 1);
      } else {
        SERVER_LOG(ERROR, "drain: request %s of session %s lost: %s", request_id, session.id(),
                   moved.ToString());
        ++lost;
        metrics_.CountDrainedRequests(variant, Metrics::DrainOutcome::kLost, 1);
      }
    }
    report.requests_lost += lost;
    ++(lost == 0 ? report.sessions_moved : report.sessions_lost);
    SERVER_LOG(INFO,
               "drain: session %s re-created at %s; %d of %d requests moved, %d refused to calls "
               "after its cut so far",
               session.id(), options_.peer, static_cast<int64_t>(requests.size()) - lost,
               requests.size(), session.drain_seal().refused_requests());
  }

 private:
  // The peer's answer to CheckPeer's GetServerInfo: can it keep the sessions' owners?
  absl::Status CheckPeerInfo(const v1::GetServerInfoResponse& info) const {
    if (options_.tenants && !info.authentication()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the peer (replica '", info.replica(),
          "') does not authenticate its callers (no --auth_tokens there, or a version that does "
          "not say so): this replica's sessions belong to tenants, and there they would have no "
          "owner (any caller could list and decode them)"));
    }
    if (info.authentication() && !info.caller_is_admin()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the peer (replica '", info.replica(), "') takes this replica's token as tenant '",
          info.caller_tenant(),
          "', not an admin: it may not re-create sessions for their owners (--drain_token_file "
          "must hold a token marked admin in the peer's --auth_tokens)"));
    }
    return absl::OkStatus();
  }

  // The credentials every call to the peer carries.
  void Authorize(grpc::ClientContext& context) const {
    if (!options_.token.empty()) {
      context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
    }
  }

  void Prepare(grpc::ClientContext& context, const Session& session) const {
    context.set_deadline(absl::ToChronoTime(deadline_));
    Authorize(context);
    context.AddMetadata(kSessionMetadataKey, session.id());
    context.AddMetadata(kMovedSessionMetadataKey, "1");
    // Whose session it is: the peer's admin acts for that tenant (server/security/caller.h).
    if (!session.owner().empty()) context.AddMetadata(kOwnerMetadataKey, session.owner());
  }

  // Configure at the peer under the session's id, until a replica other than this one answers.
  absl::Status Recreate(const Session& session) {
    if (session.configure_request().empty()) {
      return absl::FailedPreconditionError("its Configure request was not kept");
    }
    v1::ConfigureRequest request;
    if (!request.ParseFromString(session.configure_request())) {
      return absl::InternalError("its kept Configure request does not parse");
    }
    while (true) {
      grpc::ClientContext context;
      Prepare(context, session);
      v1::ConfigureResponse response;
      grpc::Status status = stub_->Configure(&context, request, &response);
      std::string fingerprint = response.fingerprint();
      if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        // An earlier attempt whose answer was lost created it: its fingerprint decides.
        absl::StatusOr<std::string> existing = PeerFingerprint(session);
        if (!existing.ok()) return existing.status();
        fingerprint = *existing;
        status = grpc::Status::OK;
      } else if (status.ok() && response.replica() == options_.own_replica) {
        // Cannot happen while this replica refuses Configure, but a session here is no move.
        return absl::InternalError("the peer address reached this very replica");
      }
      if (status.ok()) {
        if (fingerprint != session.fingerprint()) {
          return absl::FailedPreconditionError(absl::StrCat("the re-created session's fingerprint ",
                                                            HexBytes(fingerprint), " differs from ",
                                                            HexBytes(session.fingerprint())));
        }
        return absl::OkStatus();
      }
      // UNAVAILABLE: this replica (draining) or a balancer that has not yet seen it go down.
      if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
          absl::Now() + kRetryPause >= deadline_) {
        return FromGrpc("Configure", status);
      }
      absl::SleepFor(kRetryPause);
    }
  }

  absl::StatusOr<std::string> PeerFingerprint(const Session& session) {
    grpc::ClientContext context;
    Prepare(context, session);
    v1::GetSessionRequest request;
    request.set_session_id(session.id());
    v1::GetSessionResponse response;
    grpc::Status status = stub_->GetSession(&context, request, &response);
    if (!status.ok()) return FromGrpc("GetSession", status);
    return response.session().fingerprint();
  }

  // The drain's cut: seals the session in its turn on the queue, after every step and op queued
  // before (a Forward running at SIGTERM finishes, its new requests included), and lists the
  // requests it holds then. Whatever reaches the session after the cut is refused UNAVAILABLE
  // (DrainSeal), so every request an OK answered is in the list. When the queue does not get
  // there before the deadline the session is sealed at once (a Forward still running is undone
  // at its next chunk) and its requests are lost.
  absl::StatusOr<std::vector<std::string>> SealAndList(const std::shared_ptr<Session>& session,
                                                       const std::string& variant) {
    std::string message = absl::StrCat(
        "replica '", options_.own_replica, "' is draining (shutting down): session '",
        session->id(), "' was handed to ", options_.peer,
        " before this call's turn came; retry, through the balancer, in a moment");
    Metrics* metrics = &metrics_;
    DrainSeal::RefusalObserver on_refused = [metrics, variant, id = session->id()](int64_t n) {
      metrics->CountDrainedRequests(variant, Metrics::DrainOutcome::kRefused, n);
      SERVER_LOG(WARNING,
                 "drain: a call on %d requests of session %s came after its cut: refused "
                 "UNAVAILABLE",
                 n, id);
    };
    auto promise = std::make_shared<std::promise<std::vector<std::string>>>();
    std::future<std::vector<std::string>> listed = promise->get_future();
    const bool queued =
        session->scheduler().PostOp({}, [session, promise, message, on_refused] {
          session->drain_seal().Seal(message, on_refused);
          std::vector<std::string> ids;
          for (const RequestSnapshot& r : session->Snapshot(absl::Now(), true).requests) {
            ids.push_back(r.request_id);
          }
          promise->set_value(std::move(ids));
        });
    if (queued && listed.wait_until(absl::ToChronoTime(deadline_)) == std::future_status::ready) {
      return listed.get();
    }
    session->drain_seal().Seal(std::move(message), std::move(on_refused));
    return absl::DeadlineExceededError(
        queued ? "the calls queued before the drain did not finish before --drain_timeout"
               : "the session's queue refused the drain's cut");
  }

  // The request's copy, made in its turn on the session's queue (after its queued steps).
  absl::StatusOr<RequestExport> Export(const std::shared_ptr<Session>& session,
                                       const std::string& request_id) {
    auto promise = std::make_shared<std::promise<absl::StatusOr<RequestExport>>>();
    std::future<absl::StatusOr<RequestExport>> exported = promise->get_future();
    // The task keeps the session and the promise: it may run after a timed-out wait gave up.
    const bool queued = session->scheduler().PostOp({request_id}, [session, request_id, promise] {
      promise->set_value(session->ExportRequest(request_id, /*release=*/false));
    });
    if (!queued) return absl::UnavailableError("the session's queue refused the export");
    if (exported.wait_until(absl::ToChronoTime(deadline_)) != std::future_status::ready) {
      return absl::DeadlineExceededError("the export did not run before --drain_timeout");
    }
    return exported.get();
  }

  absl::Status MoveRequest(const std::shared_ptr<Session>& shared, const std::string& request_id) {
    const Session& session = *shared;
    absl::StatusOr<RequestExport> exported = Export(shared, request_id);
    if (!exported.ok()) return exported.status();
    grpc::ClientContext context;
    Prepare(context, session);
    v1::ImportRequestResponse response;
    const size_t chunk =
        static_cast<size_t>(std::max<int64_t>(1, options_.max_message_bytes - kChunkHeadroomBytes));
    return FromGrpc("ImportRequest",
                    SendImportRequest(*stub_, context, session.id(), request_id,
                                      ExportedRequestHeader(session, *exported),
                                      PageChunksOf(exported->kv.pages, chunk), &response)
                        .status);
  }

  Metrics& metrics_;
  const DrainOptions options_;
  const absl::Time deadline_;
  std::unique_ptr<v1::AttentionService::Stub> stub_;
};

}  // namespace

DrainReport DrainSessions(SessionRegistry& registry, Metrics& metrics,
                          const DrainOptions& options) {
  DrainReport report;
  const std::vector<std::shared_ptr<Session>> sessions = registry.All();
  SERVER_LOG(INFO, "drain: moving %d sessions to %s for up to %s", sessions.size(), options.peer,
             absl::FormatDuration(options.timeout));
  Drainer drainer(metrics, options);
  if (absl::Status peer = drainer.CheckPeer(); !peer.ok()) {
    // Refused: nothing is sealed or sent; the sessions stay here, their calls in flight finish,
    // and they end with the process as in a shutdown without --drain_to.
    report.refused = true;
    for (const std::shared_ptr<Session>& session : sessions) {
      if (session->closed()) continue;
      const int64_t held = session->num_requests();
      ++report.sessions_lost;
      report.requests_lost += held;
      metrics.CountDrainedRequests(session->variant_label(), Metrics::DrainOutcome::kLost,
                                   held);
    }
    SERVER_LOG(ERROR,
               "drain: refused, no session is moved to %s: %s; the %d sessions (%d requests) stay "
               "here and end with this process, as in a shutdown without --drain_to",
               options.peer, peer.message(), report.sessions_lost, report.requests_lost);
    return report;
  }
  for (const std::shared_ptr<Session>& session : sessions) {
    if (session->closed()) continue;
    drainer.Drain(session, report);
  }
  report.requests_refused = DrainRefusedRequests(registry);
  SERVER_LOG(INFO,
             "drain: done: %d sessions moved, %d lost; %d requests moved, %d lost, %d refused "
             "(calls after the cut)",
             report.sessions_moved, report.sessions_lost, report.requests_moved,
             report.requests_lost, report.requests_refused);
  return report;
}

int64_t DrainRefusedRequests(const SessionRegistry& registry) {
  int64_t refused = 0;
  for (const std::shared_ptr<Session>& session : registry.All()) {
    refused += session->drain_seal().refused_requests();
  }
  return refused;
}

void DrainSession(const std::shared_ptr<Session>& session, Metrics& metrics,
                  const DrainOptions& options, DrainReport& report) {
  Drainer drainer(metrics, options);
  if (absl::Status peer = drainer.CheckPeer(session->id()); !peer.ok()) {
    const int64_t held = session->num_requests();
    SERVER_LOG(ERROR, "drain: session %s not moved to %s: %s", session->id(), options.peer,
               peer.message());
    report.refused = true;
    ++report.sessions_lost;
    report.requests_lost += held;
    metrics.CountDrainedRequests(session->variant_label(), Metrics::DrainOutcome::kLost,
                                 held);
    return;
  }
  drainer.Drain(session, report);
}

}  // namespace attnserve::server
