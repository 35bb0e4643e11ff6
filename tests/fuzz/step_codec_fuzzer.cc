// Fuzzes the Forward and Decode request validators (server/rpc/step_codec.h): the input is parsed
// as an attnserve.v1.ForwardRequest and, separately, as a DecodeRequest (the two share their field
// numbers, so one corpus exercises both), and each is validated against every spec of fuzz_specs.h,
// as the server does before a request reaches its session.
//
// Properties: each validator returns step inputs or INVALID_ARGUMENT (never crashes); accepted
// inputs are what the session relies on: one per item, in order, with the item's request id, a
// hidden tensor [num_tokens, d_model] (one row for Decode), finite, and one position per token or
// none (Decode: at most one).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/core/tensor.h"
#include "server/rpc/step_codec.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_specs.h"

namespace attnserve {
namespace {

void CheckAccepted(const std::vector<server::StepInput>& inputs, int items, const LayerSpec& spec,
                   bool decode) {
  FUZZ_CHECK(static_cast<int>(inputs.size()) == items, "one input per item");
  for (const server::StepInput& input : inputs) {
    FUZZ_CHECK(!input.request_id.empty() && input.request_id.size() <= server::kMaxRequestIdBytes,
               "request id length");
    FUZZ_CHECK(input.hidden.rank() == 2 && input.hidden.dim(1) == spec.d_model,
               ShapeString(input.hidden.shape()));
    FUZZ_CHECK(input.hidden.dim(0) >= 1, ShapeString(input.hidden.shape()));
    FUZZ_CHECK(!decode || input.hidden.dim(0) == 1, ShapeString(input.hidden.shape()));
    FUZZ_CHECK(FirstNonFiniteElement(input.hidden) < 0, "non-finite hidden accepted");
    const size_t max_positions = decode ? 1 : static_cast<size_t>(input.hidden.dim(0));
    FUZZ_CHECK(input.positions.empty() || input.positions.size() == max_positions,
               "positions count");
  }
}

}  // namespace
}  // namespace attnserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace attnserve;
  v1::ForwardRequest forward;
  if (forward.ParseFromArray(data, static_cast<int>(size))) {
    for (const LayerSpec& spec : fuzz::FuzzSpecs()) {
      absl::StatusOr<std::vector<server::StepInput>> inputs =
          server::ForwardInputsFromProto(forward, spec);
      if (inputs.ok()) {
        CheckAccepted(*inputs, forward.items_size(), spec, /*decode=*/false);
      } else {
        FUZZ_CHECK(inputs.status().code() == absl::StatusCode::kInvalidArgument,
                   inputs.status().ToString());
      }
    }
  }
  v1::DecodeRequest decode;
  if (decode.ParseFromArray(data, static_cast<int>(size))) {
    for (const LayerSpec& spec : fuzz::FuzzSpecs()) {
      absl::StatusOr<std::vector<server::StepInput>> inputs =
          server::DecodeInputsFromProto(decode, spec);
      if (inputs.ok()) {
        CheckAccepted(*inputs, decode.items_size(), spec, /*decode=*/true);
      } else {
        FUZZ_CHECK(inputs.status().code() == absl::StatusCode::kInvalidArgument,
                   inputs.status().ToString());
      }
    }
  }
  return 0;
}
