// Conversions between the engine's types (kernels/) and the wire types of attnserve.v1, as the
// client sees them, plus the names attnctl prints for gRPC status codes.
//
// The wire LayerSpec uses 0 for "default" (rope_theta 0 = 10000, mla.rms_norm_eps 0 = 1e-6); the
// conversions here write the engine's resolved values, so a spec survives a round trip.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_

#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "grpcpp/support/status.h"
#include "kernels/dtype.h"
#include "kernels/layer_spec.h"
#include "kernels/tensor.h"

namespace attnserve {

v1::DType DTypeToProto(DType dtype);
// INVALID_ARGUMENT for DTYPE_UNSPECIFIED or an unknown value.
absl::StatusOr<DType> DTypeFromProto(v1::DType dtype);

v1::LayerSpec LayerSpecToProto(const LayerSpec& spec);
// Resolves the wire defaults (0 = default) and validates with ValidateLayerSpec.
absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& spec);

// Copies dtype, shape and bytes (host order is little-endian on every platform we build for).
void TensorToProto(const Tensor& tensor, v1::Tensor* out);
// INVALID_ARGUMENT when the dtype is unspecified, a dimension is negative, or the byte count is
// not product(shape) * sizeof(dtype).
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& tensor);

// "OK", "INVALID_ARGUMENT", ... as in grpc/status.h and absl::StatusCodeToString.
std::string GrpcCodeName(grpc::StatusCode code);
// "NOT_FOUND: session 'abc' does not exist".
std::string GrpcStatusString(const grpc::Status& status);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_
