// FlashInfer's batch prefill kernel (BatchPrefillWithPagedKVCacheDispatched, FlashInfer 0.5.3, the
// headers of the pinned `flashinfer-python` wheel) over attnserve's own device KV pages
// (FlashInferPages, paged_kv_view.h), scheduled on the host by PlanFlashInferPrefill
// (prefill_plan.h).
//
// Serves prefill chunks (qo_len new tokens over a sequence whose earlier tokens are cached) and,
// with qo_len 1, decode for GQA groups FlashInfer's decode kernel does not cover (MQA: group 32).
// Causal alignment is FlashInfer's: query i of a qo_len-row chunk sees keys up to
// i + kv_len - qo_len, i.e. the new tokens are the last qo_len keys of the page list.
// The layer does not call it yet; tests/gpu/flashinfer_prefill_test.cc checks it against float64
// on a GPU (and skips without one).
//
// Instances (paged_prefill_{f16,bf16}_hd{64,128,256}.cu, one file each so ninja builds them in
// parallel): causal and non-causal masks, DefaultAttention with the sliding window compiled in
// (window_left -1 at run time = none) and, as a second variant, the same with a logits soft-cap;
// CTA tiles 64 and 128 (128 not for head dim 256: FlashInfer's rule never picks it there; its
// 16-row tile is not built, prefill_plan.h says why).
//
// Host code here is plain C++17 without absl, as params.h: the .cu files include this header.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_H_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/flashinfer/paged_kv_view.h"
#include "kernels/cuda/flashinfer/prefill_plan.h"

namespace attnserve::cuda {

// The device copy of a FlashInferPrefillPlan's packed arrays and the host scalars the launch needs.
struct FlashInferPrefillSchedule {
  const int32_t* packed = nullptr;  // Device copy of FlashInferPrefillPlan::packed.
  int cta_tile_q = 0;
  int padded_batch_size = 0;
  int request_indices_offset = 0;
  int qo_tile_indices_offset = 0;
  int kv_tile_indices_offset = 0;
  int o_indptr_offset = 0;
  int kv_chunk_size_offset = 0;

  // The plan's scalars with `device_packed`, the plan's packed array uploaded.
  static FlashInferPrefillSchedule Of(const FlashInferPrefillPlan& plan,
                                      const int32_t* device_packed) {
    FlashInferPrefillSchedule s;
    s.packed = device_packed;
    s.cta_tile_q = plan.cta_tile_q;
    s.padded_batch_size = plan.padded_batch_size;
    s.request_indices_offset = plan.request_indices_offset;
    s.qo_tile_indices_offset = plan.qo_tile_indices_offset;
    s.kv_tile_indices_offset = plan.kv_tile_indices_offset;
    s.o_indptr_offset = plan.o_indptr_offset;
    s.kv_chunk_size_offset = plan.kv_chunk_size_offset;
    return s;
  }
};

struct FlashInferPrefillArgs {
  FlashInferPages kv;  // The pages; kv.kv_type is also q's and out's element type.
  int num_heads = 0;   // Query heads; num_heads / kv.num_kv_heads is the GQA group.
  int batch = 0;       // Sequences: the plan's batch, kv.indptr's size - 1.
  // Query row r, head h at q + r * q_stride_row + h * head_dim (kv_type elements); q_stride_row
  // >= num_heads * head_dim, a multiple of 8 (16-byte copies) and fits int32. Likewise
  // kv.page_stride_elements is a multiple of 8, and q, out and kv.pool are 16-byte aligned.
  const void* q = nullptr;
  int64_t q_stride_row = 0;
  // [batch + 1] first query row of each sequence, on the device; rows in sequence order, so the
  // schedule's o_indptr (packed + o_indptr_offset) serves.
  const int32_t* q_indptr = nullptr;
  void* out = nullptr;  // [rows, num_heads, head_dim] kv_type; row r at q_indptr's row r.
  bool causal = true;
  // Causal only: the last `window` keys up to the query, itself included (Mistral); 0 = all.
  // Non-causal ignores it, as MaskSpec (kernels/spec/attention_variation.h) does.
  int window = 0;
  float soft_cap = 0.0f;  // Logits soft-cap: cap * tanh(s / cap) of scaled scores s; 0 = none.
  float sm_scale = 0.0f;  // Multiplies q.k.
  FlashInferPrefillSchedule schedule;
};

// Whether an instance exists for these shapes: f16 or bf16, head dim 64/128/256, any group >= 1.
bool FlashInferPrefillSupports(KvType kv_type, int head_dim, int group_size);

// Launches the prefill on `stream`. cudaErrorInvalidValue for an unsupported shape or a schedule
// tile with no instance; otherwise the launch's own error.
cudaError_t FlashInferPrefill(const FlashInferPrefillArgs& args, cudaStream_t stream);

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_H_
