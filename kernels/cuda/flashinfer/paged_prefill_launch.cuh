// FlashInfer's batch prefill over FlashInferPages: the paged_kv_t and params of one launch and the
// choice of instance (CTA tile, mask, variant). Included only by the paged_prefill_*_hd*.cu files,
// each instantiating LaunchFlashInferPrefillInstance for one KV type and head dim.
#ifndef ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_LAUNCH_CUH_
#define ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_LAUNCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <exception>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/mask.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

#include "kernels/cuda/flashinfer/paged_prefill_instances.h"

namespace attnserve::cuda {
namespace flashinfer_prefill {

template <KvType kKvType>
struct Element;
template <>
struct Element<KvType::kF16> {
  using Type = __half;
};
template <>
struct Element<KvType::kBF16> {
  using Type = __nv_bfloat16;
};

// The sliding window is compiled into both variants (window_left -1 at run time = none): a
// separate no-window instance would double the build for a compare the kernel skips anyway. The
// soft-cap is a second variant rather than a run-time flag because FlashInfer applies its tanh
// whenever it is compiled in.
using WindowVariant = flashinfer::DefaultAttention</*use_custom_mask=*/false,
                                                   /*use_sliding_window=*/true,
                                                   /*use_logits_soft_cap=*/false,
                                                   /*use_alibi=*/false>;
using SoftCapVariant = flashinfer::DefaultAttention</*use_custom_mask=*/false,
                                                    /*use_sliding_window=*/true,
                                                    /*use_logits_soft_cap=*/true,
                                                    /*use_alibi=*/false>;

template <typename T, uint32_t kHeadDim, uint32_t kCtaTileQ, flashinfer::MaskMode kMask,
          typename Variant>
cudaError_t Launch(const FlashInferPrefillArgs& args, cudaStream_t stream) {
  using Params = flashinfer::BatchPrefillPagedParams<T, T, T, int32_t>;
  const FlashInferPages& kv = args.kv;
  // Strides of [page index, head, slot, dim] (paged_kv_t's kHND reading of kv_strides).
  const int64_t strides[3] = {kv.page_stride_elements, int64_t{kv.page_size} * kHeadDim, kHeadDim};
  T* const k_data = static_cast<T*>(kv.pool);
  flashinfer::paged_kv_t<T, int32_t> paged_kv(
      kv.num_kv_heads, kv.page_size, kHeadDim, args.batch, flashinfer::QKVLayout::kHND, k_data,
      k_data + kv.value_offset(), strides, const_cast<int32_t*>(kv.page_indices),
      const_cast<int32_t*>(kv.indptr), const_cast<int32_t*>(kv.last_page_len));
  const int32_t window_left = args.causal && args.window > 0 ? args.window - 1 : -1;
  Params params(static_cast<T*>(const_cast<void*>(args.q)), paged_kv,
                /*maybe_custom_mask=*/nullptr, const_cast<int32_t*>(args.q_indptr),
                /*maybe_mask_indptr=*/nullptr, /*maybe_q_rope_offset=*/nullptr,
                static_cast<T*>(args.out), /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr,
                args.num_heads, static_cast<int32_t>(args.q_stride_row),
                /*q_stride_h=*/kHeadDim, window_left, args.soft_cap, args.sm_scale,
                /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
  const FlashInferPrefillSchedule& schedule = args.schedule;
  int32_t* const packed = const_cast<int32_t*>(schedule.packed);
  params.request_indices = packed + schedule.request_indices_offset;
  params.qo_tile_indices = packed + schedule.qo_tile_indices_offset;
  params.kv_tile_indices = packed + schedule.kv_tile_indices_offset;
  params.o_indptr = packed + schedule.o_indptr_offset;
  params.kv_chunk_size_ptr = packed + schedule.kv_chunk_size_offset;
  params.merge_indptr = nullptr;      // Only read when merging split-KV partial outputs.
  params.block_valid_mask = nullptr;  // Every block of the schedule has work.
  params.padded_batch_size = schedule.padded_batch_size;
  params.partition_kv = false;
  // FlashInfer's host side throws (FLASHINFER_ERROR) on a configuration it cannot launch, e.g.
  // too little shared memory; the layer gets an error code, never an exception.
  try {
    return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
        kCtaTileQ, kHeadDim, kHeadDim, flashinfer::PosEncodingMode::kNone,
        /*USE_FP16_QK_REDUCTION=*/false, kMask, Variant, Params>(
        params, /*tmp_v=*/nullptr, /*tmp_s=*/nullptr, /*enable_pdl=*/false, stream);
  } catch (const std::exception&) {
    return cudaErrorInvalidConfiguration;
  }
}

template <typename T, uint32_t kHeadDim, uint32_t kCtaTileQ>
cudaError_t LaunchForTile(const FlashInferPrefillArgs& args, cudaStream_t stream) {
  using flashinfer::MaskMode;
  const bool soft_cap = args.soft_cap > 0.0f;
  if (args.causal) {
    return soft_cap
               ? Launch<T, kHeadDim, kCtaTileQ, MaskMode::kCausal, SoftCapVariant>(args, stream)
               : Launch<T, kHeadDim, kCtaTileQ, MaskMode::kCausal, WindowVariant>(args, stream);
  }
  return soft_cap ? Launch<T, kHeadDim, kCtaTileQ, MaskMode::kNone, SoftCapVariant>(args, stream)
                  : Launch<T, kHeadDim, kCtaTileQ, MaskMode::kNone, WindowVariant>(args, stream);
}

}  // namespace flashinfer_prefill

template <KvType kKvType, int kHeadDim>
cudaError_t LaunchFlashInferPrefillInstance(const FlashInferPrefillArgs& args,
                                            cudaStream_t stream) {
  using T = typename flashinfer_prefill::Element<kKvType>::Type;
  constexpr uint32_t kDim = kHeadDim;
  // The tiles FlashInferPrefillCtaTileQ returns; FlashInfer's 16-row tile is not built.
  switch (args.schedule.cta_tile_q) {
    case 64:
      return flashinfer_prefill::LaunchForTile<T, kDim, 64>(args, stream);
    case 128:
      // FlashInfer's tile rule (FlashInferPrefillCtaTileQ) never picks 128 rows for head dim 256.
      if constexpr (kHeadDim < 256) {
        return flashinfer_prefill::LaunchForTile<T, kDim, 128>(args, stream);
      }
      break;
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_FLASHINFER_PAGED_PREFILL_LAUNCH_CUH_
