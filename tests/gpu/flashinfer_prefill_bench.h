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
#include "tests/gpu/flashinfer_decode_bench.h"  // MedianMsFn.

namespace attnserve::bench {

// One prefill case as the bench laid it out for our kernel: `batch` sequences of `tokens` new
// tokens each from position 0, causal.
struct FlashInferPrefillInputs {
  cuda::KvType kv_type = cuda::KvType::kBF16;  // kBF16 or kF16.
  int heads = 0, kv_heads = 0, head_dim = 0, page_size = 0;
  int batch = 0;
  int tokens = 0;  // New tokens of every sequence, all of them in its pages.
  int window = 0;  // 0 = none.
  // Our page pool and the byte offset of every page, sequence-major (ceil(tokens / page_size)
  // pages per sequence), each a multiple of the page size.
  void* pool = nullptr;
  const std::vector<int64_t>* page_offsets = nullptr;
  // Our q: batch * tokens fused qkv rows of `q_stride` elements filled by LaunchFillUniform(f32,
  // seed), sequence-major. The 16-bit copy FlashInfer reads is filled with the same seed: the
  // same values, rounded.
  int64_t q_stride = 0;
  uint64_t q_seed = 0;
};

struct FlashInferPrefillTiming {
  double ms = 0.0;
  int items = 0;       // Blocks along grid.x: the plan's (sequence, query tile) pairs.
  int cta_tile_q = 0;  // Packed (token, group head) rows per block.
};

// Plans (every page kept: the first query of each sequence sees its first page), uploads, times
// FlashInferPrefill with `median_ms` on `stream`, then checks every output is finite.
// Unimplemented where FlashInfer's prefill has no instance (head dims other than 64, 128, 256).
absl::StatusOr<FlashInferPrefillTiming> TimeFlashInferPrefill(const FlashInferPrefillInputs& in,
                                                              const MedianMsFn& median_ms,
                                                              cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_FLASHINFER_PREFILL_BENCH_H_
