// FlashInfer's paged prefill (kernels/cuda/flashinfer/paged_prefill.h) timed by
// attention_kernel_bench on the inputs of one of its prefill cases, so its row sits next to ours.
// Built only where the attnserve_flashinfer target exists (ATTNSERVE_BENCH_FLASHINFER); the bench
// builds without it.
#ifndef ATTNSERVE_TESTS_GPU_FLASHINFER_PREFILL_BENCH_H_
#define ATTNSERVE_TESTS_GPU_FLASHINFER_PREFILL_BENCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/params.h"
#include "tests/gpu/flashinfer_bench_inputs.h"

namespace attnserve::bench {

// For `batch` sequences of `tokens` new tokens each from position 0, causal: plans (every page
// kept: the first query of each sequence sees its first page), uploads, times FlashInferPrefill
// with `median_ms` on `stream`, then checks every output is finite. Unimplemented where
// FlashInfer's prefill has no instance (head dims other than 64, 128, 256).
absl::StatusOr<FlashInferTiming> TimeFlashInferPrefill(const FlashInferBenchInputs& in,
                                                       const MedianMsFn& median_ms,
                                                       cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_FLASHINFER_PREFILL_BENCH_H_
