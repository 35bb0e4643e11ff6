// Conversion between the wire Tensor (attnserve.v1.Tensor) and attnserve::Tensor.
//
// Validation happens once here, at the API edge, so the engine only sees well-formed tensors.
// Every error is INVALID_ARGUMENT and names the field path given by the caller
// (e.g. "items[2].hidden") and the rule it breaks.
#ifndef ATTNSERVE_PROTO_CODEC_TENSOR_CODEC_H_
#define ATTNSERVE_PROTO_CODEC_TENSOR_CODEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/core/tensor.h"

namespace attnserve {

// Largest element count accepted in one tensor (2^40): far above any message size limit, and
// small enough that count * 4 bytes cannot overflow int64.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, absl::string_view field = "dtype");
v1::DType DTypeToProto(DType dtype);

// Checks dtype (set), rank (== expected_rank unless expected_rank < 0), every dim >= 1, the
// element count (no overflow), and data size == elements * dtype size; then copies the bytes.
absl::StatusOr<Tensor> TensorFromProto(const v1::Tensor& proto, int expected_rank = -1,
                                       absl::string_view field = "tensor");

void TensorToProto(const Tensor& tensor, v1::Tensor* proto);

// INVALID_ARGUMENT naming `field` and the first non-finite element (as a row-major index into
// the shape) when the tensor holds a NaN or an infinity. The server rejects such inputs rather
// than propagating them, since a NaN written into a KV cache poisons every later step of that
// request.
absl::Status CheckFinite(const Tensor& tensor, absl::string_view field);

// INVALID_ARGUMENT naming `field` when some element's magnitude passes `max_abs` (call after
// CheckFinite). Finite but huge inputs (3e38) overflow in the first projection, so the server
// bounds them instead of computing infinities.
absl::Status CheckMagnitude(const Tensor& tensor, absl::string_view field, float max_abs);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_TENSOR_CODEC_H_
