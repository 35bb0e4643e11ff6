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
#include "server/session/layer_fingerprint.h"
#include "server/observability/logging.h"
#include "server/rpc/request_transfer.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"
#include "server/fleet/session_affinity.h"

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

  // Moves one session and its requests; adds the outcome to `report`.
  void Drain(const std::shared_ptr<Session>& shared, DrainReport& report) {
    Session& session = *shared;
    const std::string variant = VariantLabel(session.spec());
    std::vector<std::string> requests;
    for (const RequestSnapshot& r : session.Snapshot(absl::Now(), true).requests) {
      requests.push_back(r.request_id);
    }
    absl::Status recreated = Recreate(session);
    if (!recreated.ok()) {
      SERVER_LOG(ERROR, "drain: session %s not re-created at %s (%d requests lost): %s",
                 session.id(), options_.peer, requests.size(), recreated.ToString());
      ++report.sessions_lost;
      report.requests_lost += static_cast<int64_t>(requests.size());
      metrics_.CountDrainedRequests(variant, false, static_cast<int64_t>(requests.size()));
      return;
    }
    int64_t lost = 0;
    for (const std::string& request_id : requests) {
      absl::Status moved = MoveRequest(shared, request_id);
      if (moved.ok()) {
        ++report.requests_moved;
        metrics_.CountDrainedRequests(variant, true, 1);
      } else {
        SERVER_LOG(ERROR, "drain: request %s of session %s lost: %s", request_id, session.id(),
                   moved.ToString());
        ++lost;
        metrics_.CountDrainedRequests(variant, false, 1);
      }
    }
    report.requests_lost += lost;
    ++(lost == 0 ? report.sessions_moved : report.sessions_lost);
    SERVER_LOG(INFO, "drain: session %s re-created at %s; %d of %d requests moved", session.id(),
               options_.peer, static_cast<int64_t>(requests.size()) - lost, requests.size());
  }

 private:
  void Prepare(grpc::ClientContext& context, const std::string& session_id) const {
    context.set_deadline(absl::ToChronoTime(deadline_));
    context.AddMetadata(kSessionMetadataKey, session_id);
    context.AddMetadata(kMovedSessionMetadataKey, "1");
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
      Prepare(context, session.id());
      v1::ConfigureResponse response;
      grpc::Status status = stub_->Configure(&context, request, &response);
      std::string fingerprint = response.fingerprint();
      if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        // An earlier attempt whose answer was lost created it: its fingerprint decides.
        absl::StatusOr<std::string> existing = PeerFingerprint(session.id());
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

  absl::StatusOr<std::string> PeerFingerprint(const std::string& session_id) {
    grpc::ClientContext context;
    Prepare(context, session_id);
    v1::GetSessionRequest request;
    request.set_session_id(session_id);
    v1::GetSessionResponse response;
    grpc::Status status = stub_->GetSession(&context, request, &response);
    if (!status.ok()) return FromGrpc("GetSession", status);
    return response.session().fingerprint();
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
    Prepare(context, session.id());
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
  for (const std::shared_ptr<Session>& session : sessions) {
    if (session->closed()) continue;
    drainer.Drain(session, report);
  }
  SERVER_LOG(INFO, "drain: done: %d sessions moved, %d lost; %d requests moved, %d lost",
             report.sessions_moved, report.sessions_lost, report.requests_moved,
             report.requests_lost);
  return report;
}

void DrainSession(const std::shared_ptr<Session>& session, Metrics& metrics,
                  const DrainOptions& options, DrainReport& report) {
  Drainer(metrics, options).Drain(session, report);
}

}  // namespace attnserve::server
