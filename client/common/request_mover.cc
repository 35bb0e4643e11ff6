#include "client/common/request_mover.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/common/session_routing.h"
#include "grpcpp/client_context.h"

namespace attnserve {

namespace {

absl::Status FromGrpc(absl::string_view rpc, const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, ": ", status.error_message()));
}

}  // namespace

absl::StatusOr<MoveOutcome> MoveRequest(v1::AttentionService::Stub& source,
                                        v1::AttentionService::Stub& target, const MoveSpec& spec) {
  const std::string& target_session =
      spec.target_session.empty() ? spec.source_session : spec.target_session;
  const std::string& new_request_id =
      spec.new_request_id.empty() ? spec.request_id : spec.new_request_id;
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::nanoseconds(absl::ToInt64Nanoseconds(spec.timeout));

  grpc::ClientContext export_context;
  export_context.set_deadline(deadline);
  AddSessionMetadata(&export_context, spec.source_session);
  v1::ExportRequestRequest export_request;
  export_request.set_session_id(spec.source_session);
  export_request.set_request_id(spec.request_id);
  export_request.set_release_after_export(spec.release_after_export);
  std::unique_ptr<grpc::ClientReader<v1::ExportRequestResponse>> reader =
      source.ExportRequest(&export_context, export_request);

  v1::ExportRequestResponse exported;
  if (!reader->Read(&exported)) return FromGrpc("ExportRequest", reader->Finish());
  if (!exported.has_header()) {
    export_context.TryCancel();
    reader->Finish();
    return absl::InternalError("ExportRequest: the first message carried no header");
  }
  MoveOutcome outcome;
  outcome.sequence_length = exported.header().sequence_length();

  grpc::ClientContext import_context;
  import_context.set_deadline(deadline);
  AddSessionMetadata(&import_context, target_session);
  v1::ImportRequestResponse imported;
  std::unique_ptr<grpc::ClientWriter<v1::ImportRequestRequest>> writer =
      target.ImportRequest(&import_context, &imported);
  v1::ImportRequestRequest message;
  v1::ImportRequestHeader* header = message.mutable_header();
  header->set_session_id(target_session);
  header->set_request_id(new_request_id);
  *header->mutable_request() = std::move(*exported.mutable_header());
  bool open = writer->Write(message);
  // Each chunk goes on as it arrives. A false Write means the target has ended the call: its
  // status (from Finish) says why, and the rest of the export is not read.
  while (open && reader->Read(&exported)) {
    message.Clear();
    message.mutable_pages()->mutable_data()->swap(*exported.mutable_pages()->mutable_data());
    outcome.page_bytes_moved += static_cast<int64_t>(message.pages().data().size());
    open = writer->Write(message);
  }
  if (!open) {
    export_context.TryCancel();
    (void)reader->Finish();
    return FromGrpc("ImportRequest", writer->Finish());
  }
  const grpc::Status export_status = reader->Finish();
  if (!export_status.ok()) {
    import_context.TryCancel();  // The target returns what it reserved.
    (void)writer->Finish();
    return FromGrpc("ExportRequest", export_status);
  }
  writer->WritesDone();
  const grpc::Status import_status = writer->Finish();
  if (!import_status.ok()) return FromGrpc("ImportRequest", import_status);
  outcome.kv_bytes_added = imported.kv_bytes_added();
  return outcome;
}

}  // namespace attnserve
