#include "kernels/cuda/flashinfer/paged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

namespace attnserve::cuda {
namespace {

// Sliding window compiled in (window_left < 0 means none at run time); no custom mask, soft-cap or
// ALiBi: one variant per dtype and head dim keeps the build time in bounds.
using Variant = flashinfer::DefaultAttention</*use_custom_mask=*/false,
                                             /*use_sliding_window=*/true,
                                             /*use_logits_soft_cap=*/false, /*use_alibi=*/false>;

template <typename T, uint32_t kHeadDim>
cudaError_t Launch(const FlashInferDecodeArgs& args, cudaStream_t stream) {
  using Params = flashinfer::BatchDecodeParams<T, T, T, int32_t>;
  const int64_t page_elements = int64_t{args.num_kv_heads} * args.page_size * kHeadDim;
  // Strides of [page, head, slot, dim] in that order (paged_kv_t's kHND reading of kv_strides).
  const int64_t strides[3] = {2 * page_elements, int64_t{args.page_size} * kHeadDim, kHeadDim};
  T* k_data = static_cast<T*>(args.pool);
  flashinfer::paged_kv_t<T, int32_t> paged_kv(
      args.num_kv_heads, args.page_size, kHeadDim, args.batch, flashinfer::QKVLayout::kHND, k_data,
      k_data + page_elements, strides, const_cast<int32_t*>(args.page_indices),
      const_cast<int32_t*>(args.indptr), const_cast<int32_t*>(args.last_page_len));
  Params params(static_cast<T*>(const_cast<void*>(args.q)), /*q_rope_offset=*/nullptr, paged_kv,
                static_cast<T*>(args.out), /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr,
                args.num_heads, /*q_stride_n=*/args.num_heads * kHeadDim,
                /*q_stride_h=*/kHeadDim, /*window_left=*/args.window > 0 ? args.window - 1 : -1,
                /*logits_soft_cap=*/0.0f, args.sm_scale, /*rope_scale=*/1.0f,
                /*rope_theta=*/1e4f);
  int32_t* schedule = const_cast<int32_t*>(args.schedule);
  params.request_indices = schedule;
  params.kv_tile_indices = schedule + args.batch;
  params.o_indptr = schedule + 2 * args.batch;
  params.kv_chunk_size_ptr = schedule + 3 * args.batch + 1;
  params.padded_batch_size = args.batch;
  params.block_valid_mask = nullptr;
  return flashinfer::BatchDecodeWithPagedKVCacheDispatched<
      kHeadDim, flashinfer::PosEncodingMode::kNone, Variant, Params>(
      params, /*tmp_v=*/nullptr, /*tmp_s=*/nullptr, /*enable_pdl=*/false, stream);
}

template <typename T>
cudaError_t LaunchForHeadDim(const FlashInferDecodeArgs& args, cudaStream_t stream) {
  switch (args.head_dim) {
    case 64:
      return Launch<T, 64>(args, stream);
    case 128:
      return Launch<T, 128>(args, stream);
    case 256:
      return Launch<T, 256>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool FlashInferDecodeSupports(KvType kv_type, int head_dim, int group_size) {
  const bool type_ok = kv_type == KvType::kF16 || kv_type == KvType::kBF16;
  const bool head_dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256;
  const bool group_ok = group_size == 1 || group_size == 2 || group_size == 3 || group_size == 4 ||
                        group_size == 8;
  return type_ok && head_dim_ok && group_ok;
}

std::vector<int32_t> FlashInferDecodeSchedule(int batch) {
  std::vector<int32_t> schedule(3 * batch + 2, 0);
  for (int b = 0; b < batch; ++b) {
    schedule[b] = b;                  // request_indices: block b serves sequence b.
    schedule[2 * batch + b] = b;      // o_indptr: one output row per sequence.
  }
  schedule[3 * batch] = batch;        // o_indptr's end.
  schedule[3 * batch + 1] = 1 << 30;  // kv_chunk_size: unused without split-KV, but read.
  return schedule;
}

cudaError_t FlashInferDecode(const FlashInferDecodeArgs& args, cudaStream_t stream) {
  if (args.num_kv_heads <= 0 || args.num_heads % args.num_kv_heads != 0 || args.batch <= 0 ||
      args.page_size <= 0 ||
      !FlashInferDecodeSupports(args.kv_type, args.head_dim, args.num_heads / args.num_kv_heads)) {
    return cudaErrorInvalidValue;
  }
  return args.kv_type == KvType::kBF16 ? LaunchForHeadDim<__nv_bfloat16>(args, stream)
                                       : LaunchForHeadDim<__half>(args, stream);
}

}  // namespace attnserve::cuda
