// Checks every backend's Prefill and Decode run on their inputs before touching any state, so the
// CPU and CUDA layers accept and reject exactly the same calls with the same messages.
#ifndef ATTNSERVE_KERNELS_LAYER_INPUT_CHECKS_H_
#define ATTNSERVE_KERNELS_LAYER_INPUT_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/layer_spec.h"
#include "kernels/tensor.h"

namespace attnserve {

// OK when `hidden` is [rows, d_model] and holds exactly that many elements of its dtype.
absl::Status CheckHiddenShape(const LayerSpec& spec, const Tensor& hidden, int64_t rows);

// OK when `positions` is empty (continue from each sequence's length) or has one non-negative
// entry per row.
absl::Status CheckPositions(absl::Span<const int64_t> positions, int64_t rows);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_LAYER_INPUT_CHECKS_H_
