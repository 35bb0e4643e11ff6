// Validation and conversion of Forward and Decode items into the session's StepInputs.
//
// Everything about an item that does not depend on the request's state is checked here: the
// request id (non-empty, at most 256 bytes, distinct within the call), the hidden tensor (see
// tensor_codec.h; rank, d_model, finite values of magnitude <= kMaxAbsHiddenValue) and the
// positions' count. Position order against the request's history is the session's to check. Errors
// are INVALID_ARGUMENT naming "items[i].<field>".
#ifndef ATTNSERVE_SERVER_RPC_STEP_CODEC_H_
#define ATTNSERVE_SERVER_RPC_STEP_CODEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"
#include "server/session/session.h"

namespace attnserve::server {

inline constexpr size_t kMaxRequestIdBytes = 256;

// Largest |value| accepted in a hidden state. Real models' residual streams stay far below it
// (the "massive activations" of Llama-class models reach ~1e4), while values near float's range
// (3e38) overflow in the first projection. The layer also refuses any call whose output is not
// finite (CheckOutputFinite in kernels/backend.h), which this bound makes rare.
inline constexpr float kMaxAbsHiddenValue = 1e6f;

// hidden: [num_tokens, d_model].
absl::StatusOr<std::vector<StepInput>> ForwardInputsFromProto(const v1::ForwardRequest& request,
                                                              const LayerSpec& spec);

// hidden: [1, d_model] or [d_model]; position optional.
absl::StatusOr<std::vector<StepInput>> DecodeInputsFromProto(const v1::DecodeRequest& request,
                                                             const LayerSpec& spec);

// RESOURCE_EXHAUSTED when the answer to `inputs` (a ForwardResponse or DecodeResponse: one
// result per input, each output as large as its input's hidden state) could pass
// `max_message_bytes`. Checked before the call changes anything, so a call is never applied and
// then refused for the size of its answer.
absl::Status CheckResponseFits(const std::vector<StepInput>& inputs, int64_t max_message_bytes);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_RPC_STEP_CODEC_H_
