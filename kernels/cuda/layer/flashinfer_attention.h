// CudaGqaLayer's attention through FlashInfer (--cuda_attention=flashinfer): for 16-bit pages, the
// layer's RoPE'd q (a 16-bit copy of its fused qkv rows) against its pages, written in the page
// dtype straight into the output projection's input. Decode steps use FlashInfer's decode kernel
// (split-KV per decode_plan.h) where it has an instance for the GQA group (1, 2, 3, 4, 8) and its
// prefill kernel with one query row per sequence otherwise; prefill chunks use its prefill kernel,
// a chunk over an already-cached prefix included.
//
// Two steps, as the layer's own path: Plan on the host (page table and schedule, packed into one
// int32 array the layer uploads with the rest of its plan), then Launch on the layer's stream.
// In a build without FlashInfer (or on the emulated device) Serves() is false and nothing here
// launches.
#ifndef ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_ATTENTION_H_
#define ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/attention/batch_plan.h"
#include "kernels/cuda/flashinfer/decode_plan.h"
#include "kernels/cuda/flashinfer/prefill_plan.h"
#include "kernels/kv/cache_config.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::cuda {

class FlashInferAttention {
 public:
  // Whether FlashInfer computes a layer of this spec and page format when the backend was asked
  // for it: the build has FlashInfer, the pages are f16/bf16 and an instance exists for the head
  // dim and group, and the layer has no attention sinks and no ALiBi (f32 pages, sinks, ALiBi and
  // anything else stay on the native kernels).
  static bool Serves(const LayerSpec& spec, const KvCacheConfig& kv_config);

  // Measures the decode kernel's grid budget on the current device; page_bytes and slab_bytes
  // give the unit pages are named in (page_table.h).
  static absl::StatusOr<FlashInferAttention> Create(const LayerSpec& spec,
                                                    const KvCacheConfig& kv_config,
                                                    int64_t page_bytes, int64_t slab_bytes,
                                                    int64_t pool_bytes);

  // One call's host side: what to upload (one int32 array) and how much device scratch it needs.
  struct CallPlan {
    bool decode_kernel = false;  // FlashInfer's decode kernel, else its prefill kernel.
    int batch = 0;
    std::vector<int32_t> words;  // Uploaded as one section; the offsets below index it.
    int indptr = 0, page_indices = 0, last_page_len = 0, q_indptr = 0, schedule = 0;
    FlashInferDecodePlanInfo decode;  // decode_kernel: its schedule's scalars.
    FlashInferPrefillPlan prefill;    // !decode_kernel: its schedule's scalars (packed cleared).
    size_t scratch_bytes = 0;         // Split-KV partials (decode kernel only): tmp_v, then tmp_s.
    size_t tmp_s_offset = 0;          // Bytes from the scratch's start to tmp_s (16-aligned).
  };
  absl::StatusOr<CallPlan> Plan(const BatchPlan& plan, bool decode) const;

  // Runs the call. `words`: CallPlan::words on the device; `q`: RoPE'd rows of the fused qkv
  // width in the page dtype; `out`: [rows, heads, head_dim] in the page dtype; `scratch`:
  // CallPlan::scratch_bytes of device memory, 16-byte aligned.
  absl::Status Launch(const CallPlan& call, const int32_t* words, void* pool, const void* q,
                      int64_t q_stride_row, void* out, void* scratch, cudaStream_t stream) const;

 private:
  FlashInferAttention(const LayerSpec& spec, const KvCacheConfig& kv_config, int64_t unit_bytes,
                      int decode_grid_budget);

  LayerSpec spec_;
  KvCacheConfig kv_config_;
  int64_t unit_bytes_ = 0;
  int decode_grid_budget_ = 0;
};

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_LAYER_FLASHINFER_ATTENTION_H_
