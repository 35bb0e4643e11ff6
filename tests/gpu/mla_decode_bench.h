// The MLA absorbed decode for attention_kernel_bench: our split-KV MLA kernel + combine
// (kernels/cuda/mla/) and, where built, FlashInfer's MLA kernel (kernels/cuda/flashinfer/
// paged_mla.h) on the same latent pages ([64][512 + 64] bf16, shuffled) and the same absorbed
// queries, timed by the bench's timer. Rated in latent bytes read per second: every visible
// key's row (576 elements) once per sequence, the least any kernel must read. NEVER RUN ON A
// DEVICE YET (docs/gpu_benchmarks.md).
#ifndef ATTNSERVE_TESTS_GPU_MLA_DECODE_BENCH_H_
#define ATTNSERVE_TESTS_GPU_MLA_DECODE_BENCH_H_

#include <cuda_runtime_api.h>

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace attnserve::bench {

struct MlaDecodeCase {
  int heads = 128;
  int latent = 512;
  int rope = 64;
  int batch = 64;
  int tokens = 8192;  // Cached tokens per sequence, the new one included.
  int page_size = 64;
};

struct MlaDecodeTiming {
  double ms = 0.0;
  double kv_bytes = 0.0;  // Latent rows read (the rate's numerator).
  int items = 0;          // Native: work items (KV splits); FlashInfer: works of its schedule.
};

using MlaMedianMsFn =
    std::function<absl::StatusOr<double>(const std::function<absl::Status()>& launch)>;

// `flashinfer`: FlashInfer's kernel instead of ours (UNIMPLEMENTED where it is not built).
absl::StatusOr<MlaDecodeTiming> TimeMlaDecode(const MlaDecodeCase& c, bool flashinfer,
                                              int multiprocessors, const MlaMedianMsFn& median_ms,
                                              cudaStream_t stream);

}  // namespace attnserve::bench

#endif  // ATTNSERVE_TESTS_GPU_MLA_DECODE_BENCH_H_
