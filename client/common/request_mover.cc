#include "client/common/request_mover.h"

#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/common/session_routing.h"
#include "proto/codec/import_stream.h"
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
  // Each chunk goes on as it arrives; a failed export cancels the import.
  const ImportSent sent = SendImportRequest(
      target, import_context, target_session, new_request_id,
      std::move(*exported.mutable_header()),
      [&](std::string* data) -> absl::StatusOr<bool> {
        if (!reader->Read(&exported)) {
          const grpc::Status export_status = reader->Finish();
          if (!export_status.ok()) return FromGrpc("ExportRequest", export_status);
          return false;
        }
        data->swap(*exported.mutable_pages()->mutable_data());
        return true;
      },
      &imported);
  outcome.page_bytes_moved = sent.page_bytes;
  if (!sent.source.ok()) return sent.source;
  if (sent.target_ended) {  // The rest of the export is not read.
    export_context.TryCancel();
    (void)reader->Finish();
  }
  if (!sent.status.ok()) return FromGrpc("ImportRequest", sent.status);
  outcome.kv_bytes_added = imported.kv_bytes_added();
  return outcome;
}

}  // namespace attnserve
