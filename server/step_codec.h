// Validation and conversion of Forward and Decode items into the session's StepInputs.
//
// Everything about an item that does not depend on the request's state is checked here: the
// request id (non-empty, at most 256 bytes, distinct within the call), the hidden tensor (see
// tensor_codec.h; rank, d_model, finite values) and the positions' count. Position order against
// the request's history is the session's to check. Errors are INVALID_ARGUMENT naming
// "items[i].<field>".
#ifndef ATTNSERVE_SERVER_STEP_CODEC_H_
#define ATTNSERVE_SERVER_STEP_CODEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/layer_spec.h"
#include "server/session.h"

namespace attnserve::server {

inline constexpr size_t kMaxRequestIdBytes = 256;

// hidden: [num_tokens, d_model].
absl::StatusOr<std::vector<StepInput>> ForwardInputsFromProto(const v1::ForwardRequest& request,
                                                              const LayerSpec& spec);

// hidden: [1, d_model] or [d_model]; position optional.
absl::StatusOr<std::vector<StepInput>> DecodeInputsFromProto(const v1::DecodeRequest& request,
                                                             const LayerSpec& spec);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_STEP_CODEC_H_
