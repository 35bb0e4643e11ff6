// What attention_kernel_bench hands its FlashInfer rows (flashinfer_decode_bench.h,
// flashinfer_prefill_bench.h): one case as the bench laid it out for our kernel, the bench's timer,
// the timing that comes back, and the device memory helpers both rows use. Built only where the
// attnserve_flashinfer target exists (ATTNSERVE_BENCH_FLASHINFER).
#ifndef ATTNSERVE_TESTS_GPU_FLASHINFER_BENCH_INPUTS_H_
#define ATTNSERVE_TESTS_GPU_FLASHINFER_BENCH_INPUTS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/params.h"

namespace attnserve::bench {

struct FlashInferBenchInputs {
  cuda::KvType kv_type = cuda::KvType::kBF16;  // kBF16 or kF16.
  int heads = 0, kv_heads = 0, head_dim = 0, page_size = 0;
  int batch = 0;
  // Decode: cached tokens of every sequence, the new one included. Prefill: new tokens of every
  // sequence, all of them in its pages.
  int tokens = 0;
  int window = 0;  // 0 = none.
  // Our page pool and the byte offset of every page, sequence-major (ceil(tokens / page_size)
  // pages per sequence), each a multiple of the page size.
  void* pool = nullptr;
  const std::vector<int64_t>* page_offsets = nullptr;
  // Our q: fused qkv rows of `q_stride` elements (decode: one per sequence; prefill: batch x
  // tokens, sequence-major) filled by LaunchFillUniform(f32, seed). The 16-bit copy FlashInfer
  // reads is filled with the same seed: the same values, rounded.
  int64_t q_stride = 0;
  uint64_t q_seed = 0;
};

struct FlashInferTiming {
  double ms = 0.0;
  int items = 0;          // Blocks along grid.x: the plan's work items.
  bool split_kv = false;  // Decode: whether the plan split the KV.
  int cta_tile_q = 0;     // Prefill: packed (token, group head) rows per block.
};

// The bench's timer: median milliseconds of one call of the enqueuing function, L2 cold.
using MedianMsFn =
    std::function<absl::StatusOr<double>(const std::function<absl::Status()>& launch)>;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

// cudaMalloc of at least 16 bytes; the error names `what`.
absl::StatusOr<DevicePtr> Allocate(size_t bytes, const char* what);
// A device copy of `host`.
absl::StatusOr<DevicePtr> Upload(const std::vector<int32_t>& host, const char* what);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_FLASHINFER_BENCH_INPUTS_H_
