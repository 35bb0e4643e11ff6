// FlashInfer's paged decode (kernels/cuda/flashinfer/paged_decode.h) timed by
// attention_kernel_bench on the inputs of one of its decode cases, so its row sits next to ours.
// Built only where the attnserve_flashinfer target exists (ATTNSERVE_BENCH_FLASHINFER); the bench
// builds without it.
#ifndef ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_
#define ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/params.h"
#include "tests/gpu/flashinfer_bench_inputs.h"

namespace attnserve::bench {

// Plans (budget from the device, leading pages outside the window left out, as the layer will),
// uploads, times FlashInferDecode with `median_ms` on `stream`, then checks every output is finite.
// Unimplemented where FlashInfer's decode has no instance (GQA groups other than 1, 2, 3, 4, 8).
absl::StatusOr<FlashInferTiming> TimeFlashInferDecode(const FlashInferBenchInputs& in,
                                                      const MedianMsFn& median_ms,
                                                      cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_
