// FlashInfer's batch decode kernel (BatchDecodeWithPagedKVCacheKernel, FlashInfer 0.5.3, the
// headers of the pinned `flashinfer-python` wheel) over attnserve's own device KV pages, with
// FlashInfer's split-KV: a plan (decode_plan.h) cuts long sequences into chunks when the batch is
// too small to fill the device, and FlashInfer's VariableLengthMergeStates merges the chunks.
//
// A candidate replacement for our own split-KV decode kernel; no measurement of either against
// the other exists yet (attention_kernel_bench prints both). The layer does not call it yet.
// tests/gpu/flashinfer_decode_test.cc checks it against float64 on a GPU (and skips without one).
//
// How the pool is seen (page indices in a unit dividing every page offset, K and V of one page
// side by side): paged_kv_view.h.
//
// Host code here is plain C++17 without absl, as params.h: the .cu includes this header.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/flashinfer/decode_plan.h"
#include "kernels/cuda/flashinfer/paged_kv_view.h"

namespace attnserve::cuda {

struct FlashInferDecodeArgs {
  FlashInferPages kv;  // kv_type, head_dim, kv heads, pages; batch = plan_info.batch sequences.
  int num_heads = 0;   // Query heads; num_heads / kv.num_kv_heads in {1, 2, 3, 4, 8}.
  // The new token of each sequence, kv.kv_type elements: head h of sequence b at
  // q + b * q_stride_n + h * q_stride_h (the layer passes a 16-bit copy of its fused qkv rows:
  // q_stride_n = (heads + 2 kv_heads) * head_dim, q_stride_h = head_dim). Both below 2^31.
  const void* q = nullptr;
  int64_t q_stride_n = 0;
  int64_t q_stride_h = 0;
  void* out = nullptr;  // [batch, num_heads, head_dim] of kv.kv_type.
  // Keys visible to the new token: the last `window` (Mistral semantics, itself included); 0 = all.
  int window = 0;
  // Logit soft-cap (Gemma 2): scores become soft_cap * tanh(sm_scale * q.k / soft_cap); 0 = none.
  float soft_cap = 0.0f;
  float sm_scale = 0.0f;  // Multiplies q.k.
  // PlanFlashInferDecode's result for this batch: its info here, its packed vector on the device.
  FlashInferDecodePlanInfo plan_info;
  const int32_t* plan = nullptr;
  // Split-KV scratch, needed only when plan_info.split_kv: tmp_v of plan_info.tmp_v_elements
  // kv.kv_type elements (FlashInfer keeps the chunks' partial outputs in the output type), tmp_s
  // of plan_info.tmp_s_elements floats; 16-byte aligned.
  void* tmp_v = nullptr;
  float* tmp_s = nullptr;
};

// Whether an instance exists here for these shapes (FlashInfer's decode kernel covers GQA group
// sizes 1, 2, 3, 4 and 8; larger groups go to its prefill kernel: paged_prefill.h).
bool FlashInferDecodeSupports(KvType kv_type, int head_dim, int group_size);

// The grid budget PlanFlashInferDecode takes, on the current device: multiprocessors x the blocks
// of this instance one multiprocessor holds at once (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
// cudaErrorInvalidValue for an unsupported shape.
cudaError_t FlashInferDecodeGridBudget(KvType kv_type, int head_dim, int group_size,
                                       bool soft_cap, int* budget);

// Launches the decode (and, when the plan splits, the merge) on `stream`. cudaErrorInvalidValue
// for an unsupported shape, missing pointers or a split plan without scratch; otherwise the
// launches' own error. Needs sm_80 or later (the only instances built).
cudaError_t FlashInferDecode(const FlashInferDecodeArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_DECODE_H_
