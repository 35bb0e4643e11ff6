#include "client/attnctl/move.h"

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "client/common/request_mover.h"
#include "kernels/base/clip_for_message.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::string, session);
ABSL_DECLARE_FLAG(std::string, request);
ABSL_FLAG(std::string, to, "", "move: the target replica, HOST:PORT (the source is --server).");
ABSL_FLAG(std::string, to_session, "",
          "move: the target session (same fingerprint as --session's); empty = --session.");
ABSL_FLAG(std::string, new_request, "", "move: the request's id on the target; empty = --request.");
ABSL_FLAG(bool, release_source, false,
          "move: release the request on the source once the target has it (default: keep it).");

namespace attnserve {

int RunMove(const Client& source, const ChannelSecurity& security) {
  MoveSpec spec;
  spec.source_session = absl::GetFlag(FLAGS_session);
  spec.request_id = absl::GetFlag(FLAGS_request);
  spec.target_session = absl::GetFlag(FLAGS_to_session);
  spec.new_request_id = absl::GetFlag(FLAGS_new_request);
  spec.timeout = source.timeout;
  const std::string to = absl::GetFlag(FLAGS_to);
  if (spec.source_session.empty() || spec.request_id.empty() || to.empty()) {
    return ReportError("move needs --session, --request and --to (and --server, the source)");
  }
  const Client target = MakeClient(to, source.timeout, source.json, security);
  absl::StatusOr<MoveOutcome> moved = MoveRequest(*source.stub, *target.stub, spec);
  // The import's NOT_FOUND is about the target's session. Without --to_session its id is the
  // source's, so the server's own message reads as if the source session were missing.
  if (moved.status().code() == absl::StatusCode::kNotFound &&
      absl::StartsWith(moved.status().message(), "ImportRequest:")) {
    return ReportError(
        absl::StrFormat("move failed: NOT_FOUND: the target session '%s' does not exist on the "
                        "target %s (%s) [%s]",
                        ClipForMessage(spec.target_session.empty() ? spec.source_session
                                                                   : spec.target_session),
                        to,
                        spec.target_session.empty()
                            ? "no --to_session, so --session's id was tried there; configure a "
                              "session of the same spec and weights on the target and pass its "
                              "id as --to_session"
                            : "--to_session",
                        moved.status().message()),
        kExitRpcError);
  }
  if (!moved.ok()) {
    return ReportError(
        absl::StrFormat("move failed: %s: %s", absl::StatusCodeToString(moved.status().code()),
                        moved.status().message()),
        kExitRpcError);
  }
  const std::string target_session =
      spec.target_session.empty() ? spec.source_session : spec.target_session;
  const std::string new_request =
      spec.new_request_id.empty() ? spec.request_id : spec.new_request_id;
  bool released = false;
  if (absl::GetFlag(FLAGS_release_source)) {
    grpc::Status status = CallRelease(source, spec.source_session, spec.request_id);
    if (!status.ok()) return ReportRpcError("Release (source, after the move)", status);
    released = true;
  }
  if (source.json) {
    std::printf("%s\n", nlohmann::json({{"from", source.target},
                                        {"to", to},
                                        {"session", spec.source_session},
                                        {"request", spec.request_id},
                                        {"to_session", target_session},
                                        {"new_request", new_request},
                                        {"sequence_length", moved->sequence_length},
                                        {"page_bytes_moved", moved->page_bytes_moved},
                                        {"kv_bytes_added", moved->kv_bytes_added},
                                        {"source_released", released}})
                            .dump()
                            .c_str());
  } else {
    absl::PrintF("moved request %s (%d tokens, %d page bytes) from %s to %s as %s/%s%s\n",
                 spec.request_id, moved->sequence_length, moved->page_bytes_moved, source.target,
                 to, target_session, new_request, released ? "; released on the source" : "");
  }
  return kExitOk;
}

}  // namespace attnserve
