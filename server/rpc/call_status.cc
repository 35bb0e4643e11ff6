#include "server/rpc/call_status.h"

#include "absl/strings/str_cat.h"

namespace attnserve::server {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status CheckIdLength(const std::string& id, absl::string_view field, size_t max_bytes) {
  if (id.size() <= max_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": has ", id.size(), " bytes, at most ", max_bytes, " allowed"));
}

absl::Status CheckId(const std::string& id, absl::string_view field, size_t max_bytes) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  return CheckIdLength(id, field, max_bytes);
}

void ObserveCall(Metrics& metrics, Rpc rpc, const std::string& variant, const grpc::Status& status,
                 const RpcTiming& timing) {
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  metrics.ObserveRpc(rpc, variant, code, timing);
  if (code == absl::StatusCode::kResourceExhausted &&
      IsKvExhaustion(absl::Status(code, status.error_message()))) {
    metrics.CountKvRejection(variant);
  }
}

}  // namespace attnserve::server
