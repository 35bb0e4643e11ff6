// Builds a session's weights from the Configure request's WeightSource.
#ifndef ATTNSERVE_SERVER_WEIGHT_SOURCE_H_
#define ATTNSERVE_SERVER_WEIGHT_SOURCE_H_

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/layer_spec.h"
#include "kernels/layer_weights.h"

namespace attnserve::server {

// seed:           RandomLayerWeights(spec, seed).
// checkpoint:     LoadLayerWeightsFromSafetensors. A path that does not exist is NOT_FOUND, one
//                 that exists but cannot be read is INVALID_ARGUMENT; both name the path.
// inline_weights: each tensor validated (tensor_codec.h), names distinct, then
//                 ValidateLayerWeights (missing, unexpected or mis-shaped tensors).
// Unset: INVALID_ARGUMENT.
absl::StatusOr<LayerWeights> WeightsFromProto(const v1::WeightSource& source,
                                              const LayerSpec& spec);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_WEIGHT_SOURCE_H_
