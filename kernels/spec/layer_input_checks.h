// Checks every backend's Prefill and Decode run on their inputs before touching any state, and on
// their output before committing it, so the CPU and CUDA layers accept and reject exactly the same
// calls with the same messages.
#ifndef ATTNSERVE_KERNELS_SPEC_LAYER_INPUT_CHECKS_H_
#define ATTNSERVE_KERNELS_SPEC_LAYER_INPUT_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/core/tensor.h"

namespace attnserve {

// OK when `hidden` is [rows, d_model] and holds exactly that many elements of its dtype.
absl::Status CheckHiddenShape(const LayerSpec& spec, const Tensor& hidden, int64_t rows);

// OK when `positions` is empty (continue from each sequence's length) or has one non-negative
// entry per row.
absl::Status CheckPositions(absl::Span<const int64_t> positions, int64_t rows);

// OK when every element of a call's output is finite. Otherwise INVALID_ARGUMENT: the inputs
// overflowed somewhere in the layer (finite inputs and weights can still do that), and the layer
// must roll the call back, since the same overflow has reached the K/V it appended and would
// poison every later step of those sequences.
absl::Status CheckOutputFinite(const Tensor& output);
// CheckOutputFinite's error for element `bad` (row-major) of `output`, for layers that find the
// first non-finite element elsewhere (the CUDA layer does it on the device).
absl::Status NonFiniteOutputError(const Tensor& output, int64_t bad);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_LAYER_INPUT_CHECKS_H_
