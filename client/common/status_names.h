// The names attnctl prints for gRPC status codes. (Wire <-> engine conversions live in
// proto/codec/, shared with the server.)
#ifndef ATTNSERVE_CLIENT_COMMON_STATUS_NAMES_H_
#define ATTNSERVE_CLIENT_COMMON_STATUS_NAMES_H_

#include <string>

#include "grpcpp/support/status.h"

namespace attnserve {

// "OK", "INVALID_ARGUMENT", ... as in grpc/status.h and absl::StatusCodeToString.
std::string GrpcCodeName(grpc::StatusCode code);
// "NOT_FOUND: session 'abc' does not exist".
std::string GrpcStatusString(const grpc::Status& status);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_COMMON_STATUS_NAMES_H_
