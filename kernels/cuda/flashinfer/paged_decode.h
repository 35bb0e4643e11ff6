// FlashInfer's batch decode kernel (BatchDecodeWithPagedKVCacheDispatched, FlashInfer 0.5.3, the
// headers of the pinned `flashinfer-python` wheel) over attnserve's own device KV pages.
//
// A candidate replacement for our own split-KV decode kernel; no measurement of either against
// the other exists yet (docs/gpu_benchmarks.md). This is the adapter and its instances only; the
// layer does not call it. tests/gpu/flashinfer_decode_test.cc checks it against float64 on a GPU
// (and skips without one); it has not run on a GPU yet. Switching the layer's decode dispatch to
// it waits for that check and a benchmark on a device.
//
// Our page layout is [K|V][num_kv_heads][page_size][head_dim] (PagedKv). FlashInfer's paged_kv_t
// takes K and V base pointers, page indices and strides, so one pool serves both: K of page p at
// pool + p * page_elements, V half a page later, head stride page_size * head_dim (its HND
// layout). Pages are therefore named by index (byte offset / page bytes), not by offset.
//
// Host code here is plain C++17 without absl, as params.h: the .cu includes this header.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/attention/params.h"

namespace attnserve::cuda {

// Device arrays the decode launch reads besides the pages. Build the host side with
// FlashInferDecodeSchedule and copy it to the device as one int32 buffer.
struct FlashInferDecodeArgs {
  KvType kv_type = KvType::kBF16;  // kF16 or kBF16; q and out are of the same type.
  int head_dim = 0;                // 64, 128 or 256.
  int num_heads = 0;               // Query heads; num_heads / kv_heads in {1, 2, 3, 4, 8}.
  int num_kv_heads = 0;
  int page_size = 0;
  int batch = 0;
  const void* q = nullptr;  // [batch, num_heads, head_dim]: the new token of each sequence.
  void* out = nullptr;      // [batch, num_heads, head_dim].
  void* pool = nullptr;     // Page pool base: page p at p * 2 * kv_heads * page_size * head_dim.
  // [batch + 1] page-list bounds, [indptr[batch]] page indices in sequence order (the first page
  // listed holds the sequence's key 0 as far as the kernel is concerned), [batch] tokens in each
  // sequence's last listed page (1..page_size).
  const int32_t* indptr = nullptr;
  const int32_t* page_indices = nullptr;
  const int32_t* last_page_len = nullptr;
  const int32_t* schedule = nullptr;  // FlashInferDecodeSchedule(batch), on the device.
  // Keys visible to the new token: the last `window` (Mistral semantics, itself included); 0 = all.
  // Leading pages entirely outside the window may be left out of the page list: the mask counts
  // back from the last key, so dropping whole pages in front changes nothing.
  int window = 0;
  float sm_scale = 0.0f;  // Multiplies q.k.
};

// Whether an instance exists here for these shapes (FlashInfer's decode kernel covers GQA group
// sizes 1, 2, 3, 4 and 8; larger groups go to its prefill kernel, not instantiated yet).
bool FlashInferDecodeSupports(KvType kv_type, int head_dim, int group_size);

// The launch schedule without split-KV (one block per sequence and KV head):
// [request_indices (batch) | kv_tile_indices (batch) | o_indptr (batch + 1) | kv_chunk_size (1)].
std::vector<int32_t> FlashInferDecodeSchedule(int batch);

// Launches the decode on `stream`. cudaErrorInvalidValue for an unsupported shape (check
// FlashInferDecodeSupports first); otherwise the launch's own error.
cudaError_t FlashInferDecode(const FlashInferDecodeArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_
