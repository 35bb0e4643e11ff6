#include "client/common/status_names.h"


#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

std::string GrpcCodeName(grpc::StatusCode code) {
  // gRPC's codes are absl's, number for number.
  const std::string name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  return name.empty() ? absl::StrCat("CODE_", static_cast<int>(code)) : name;
}

std::string GrpcStatusString(const grpc::Status& status) {
  return absl::StrCat(GrpcCodeName(status.error_code()), ": ", status.error_message());
}

}  // namespace attnserve
