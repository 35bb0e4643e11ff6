// FlashInfer's paged decode (kernels/cuda/flashinfer/paged_decode.h) timed by attention_kernel_bench
// on the inputs of one of its decode cases, so its row sits next to ours. Built only where the
// attnserve_flashinfer target exists (ATTNSERVE_BENCH_FLASHINFER); the bench builds without it.
#ifndef ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_
#define ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/params.h"

namespace attnserve::bench {

// One decode case as the bench laid it out for our kernel.
struct FlashInferDecodeInputs {
  cuda::KvType kv_type = cuda::KvType::kBF16;  // kBF16 or kF16.
  int heads = 0, kv_heads = 0, head_dim = 0, page_size = 0;
  int batch = 0;
  int tokens = 0;  // Cached tokens of every sequence, the new one included.
  int window = 0;  // 0 = none.
  // Our page pool and the byte offset of every page, sequence-major (ceil(tokens / page_size)
  // pages per sequence), each a multiple of the page size.
  void* pool = nullptr;
  const std::vector<int64_t>* page_offsets = nullptr;
  // Our q: fused qkv rows of `q_stride` elements filled by LaunchFillUniform(f32, seed). The 16-bit
  // copy FlashInfer reads is filled with the same seed: the same values, rounded.
  int64_t q_stride = 0;
  uint64_t q_seed = 0;
};

struct FlashInferDecodeTiming {
  double ms = 0.0;
  int items = 0;  // Blocks along grid.x: the plan's work items.
  bool split_kv = false;
};

// The bench's timer: median milliseconds of one call of the enqueuing function, L2 cold.
using MedianMsFn =
    std::function<absl::StatusOr<double>(const std::function<absl::Status()>& launch)>;

// Plans (budget from the device, leading pages outside the window left out, as the layer will),
// uploads, times FlashInferDecode with `median_ms` on `stream`, then checks every output is finite.
// Unimplemented where FlashInfer's decode has no instance (GQA groups other than 1, 2, 3, 4, 8).
absl::StatusOr<FlashInferDecodeTiming> TimeFlashInferDecode(const FlashInferDecodeInputs& in,
                                                            const MedianMsFn& median_ms,
                                                            cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_FLASHINFER_DECODE_BENCH_H_
