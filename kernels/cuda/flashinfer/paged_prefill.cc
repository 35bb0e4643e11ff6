// FlashInferPrefill: checks the shapes, then picks the (KV type, head dim) instance. Plain host
// C++: the kernels live in paged_prefill_*_hd*.cu.
#include "kernels/cuda/flashinfer/paged_prefill.h"

#include <limits>

#include "kernels/cuda/flashinfer/paged_prefill_instances.h"

namespace attnserve::cuda {
namespace {

template <KvType kKvType>
cudaError_t LaunchForHeadDim(const FlashInferPrefillArgs& args, cudaStream_t stream) {
  switch (args.kv.head_dim) {
    case 64:
      return LaunchFlashInferPrefillInstance<kKvType, 64>(args, stream);
    case 128:
      return LaunchFlashInferPrefillInstance<kKvType, 128>(args, stream);
    case 256:
      return LaunchFlashInferPrefillInstance<kKvType, 256>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool FlashInferPrefillSupports(KvType kv_type, int head_dim, int group_size) {
  const bool type_ok = kv_type == KvType::kF16 || kv_type == KvType::kBF16;
  const bool head_dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256;
  return type_ok && head_dim_ok && group_size >= 1;
}

cudaError_t FlashInferPrefill(const FlashInferPrefillArgs& args, cudaStream_t stream) {
  const FlashInferPages& kv = args.kv;
  if (kv.num_kv_heads <= 0 || args.num_heads <= 0 || args.num_heads % kv.num_kv_heads != 0 ||
      args.batch <= 0 || kv.page_size <= 0 ||
      !FlashInferPrefillSupports(kv.kv_type, kv.head_dim, args.num_heads / kv.num_kv_heads)) {
    return cudaErrorInvalidValue;
  }
  // FlashInfer holds the page stride in uint32 and the query row stride in int32, and copies q,
  // K and V rows to shared memory 16 bytes (8 elements) at a time, so both strides are multiples
  // of 8 elements.
  constexpr int64_t kElementsPer16Bytes = 8;
  if (kv.page_stride_elements <= 0 || kv.page_stride_elements % kElementsPer16Bytes != 0 ||
      args.q_stride_row % kElementsPer16Bytes != 0 ||
      kv.page_stride_elements > std::numeric_limits<uint32_t>::max() ||
      args.q_stride_row < int64_t{args.num_heads} * kv.head_dim ||
      args.q_stride_row > std::numeric_limits<int32_t>::max() || args.schedule.packed == nullptr ||
      args.window < 0 || args.soft_cap < 0.0f) {
    return cudaErrorInvalidValue;
  }
  if (args.schedule.padded_batch_size == 0) return cudaSuccess;  // No query rows.
  return kv.kv_type == KvType::kBF16 ? LaunchForHeadDim<KvType::kBF16>(args, stream)
                                     : LaunchForHeadDim<KvType::kF16>(args, stream);
}

}  // namespace attnserve::cuda
