#include "server/fleet/session_rebalancer.h"

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "attnserve/v1/attention_service.grpc.pb.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "server/observability/logging.h"
#include "server/session/scheduler.h"
#include "server/session/session.h"
#include "server/fleet/session_affinity.h"

namespace attnserve::server {

SessionRebalancer::SessionRebalancer(SessionRegistry* registry, Metrics* metrics,
                                     DrainOptions options, absl::Duration period)
    : registry_(registry),
      metrics_(metrics),
      options_(std::move(options)),
      period_(period),
      stub_(v1::AttentionService::NewStub(
          grpc::CreateChannel(options_.peer, grpc::InsecureChannelCredentials()))) {
  thread_ = std::thread([this] { Run(); });
}

SessionRebalancer::~SessionRebalancer() { Stop(); }

void SessionRebalancer::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

std::string SessionRebalancer::Owner(const std::string& session_id) const {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  context.AddMetadata(kSessionMetadataKey, session_id);
  if (!options_.token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
  v1::GetServerInfoRequest request;
  v1::GetServerInfoResponse response;
  if (!stub_->GetServerInfo(&context, request, &response).ok()) return "";
  return response.replica();
}

void SessionRebalancer::Run() {
  while (!stop_.WaitForNotificationWithTimeout(period_)) {
    for (const std::shared_ptr<Session>& session : registry_->All()) {
      if (stop_.HasBeenNotified()) return;
      if (!session->adopted() || session->closed()) continue;
      const std::string owner = Owner(session->id());
      if (owner.empty() || owner == options_.own_replica) continue;
      // Unlisted first: no new step lands here after the copy is made.
      if (registry_->Remove(session) == nullptr) continue;
      SERVER_LOG(INFO, "rebalance: session %s hashes to %s now; moving it there", session->id(),
                 owner);
      DrainReport report;
      DrainSession(session, *metrics_, options_, report);
      // Moved or not, it is unreachable here now: free it behind the calls already queued.
      std::shared_ptr<Session> closing = session;
      if (!closing->scheduler().PostOp({}, [closing] { closing->Close(); })) closing->Close();
    }
  }
}

}  // namespace attnserve::server
