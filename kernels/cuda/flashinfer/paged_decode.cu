#include "kernels/cuda/flashinfer/paged_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <limits>

#include <flashinfer/attention/cascade.cuh>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/variants.cuh>
#include <flashinfer/page.cuh>

namespace attnserve::cuda {
namespace {

// Sliding window compiled in (window_left < 0 means none at run time); soft-cap as a second
// variant because it changes the logits path; no custom mask or ALiBi.
template <bool kSoftCap>
using Variant = flashinfer::DefaultAttention</*use_custom_mask=*/false,
                                             /*use_sliding_window=*/true, kSoftCap,
                                             /*use_alibi=*/false>;

// One kernel instance and its launch shape, as BatchDecodeWithPagedKVCacheDispatched derives
// them. That function is not called: it also instantiates the 1-stage kernel for pre-sm_80
// devices (which doubles the build for nothing here) and hides the kernel the occupancy query of
// FlashInferDecodeGridBudget must see. 2 shared-memory stages: its choice on sm_80 and later.
template <typename T, uint32_t kHeadDim, uint32_t kGroup, bool kSoftCap>
struct Instance {
  using Params = flashinfer::BatchDecodeParams<T, T, T, int32_t>;
  static constexpr uint32_t kStages = 2;
  static constexpr uint32_t kVecSize = std::max<uint32_t>(16 / sizeof(T), kHeadDim / 32);
  static constexpr uint32_t kBdx = kHeadDim / kVecSize;
  static constexpr uint32_t kBdy = kGroup;
  static constexpr uint32_t kThreads = std::max<uint32_t>(128, kBdx * kBdy);
  static constexpr uint32_t kBdz = kThreads / (kBdx * kBdy);
  static constexpr uint32_t kTileSizePerBdx = kGroup == 1 ? 4 : 1;
  static constexpr uint32_t kSmemBytes = static_cast<uint32_t>(
      2 * kStages * kTileSizePerBdx * kBdy * kBdz * kHeadDim * sizeof(T) +
      std::max(kTileSizePerBdx * kThreads * sizeof(T*), 2 * kBdy * kBdz * sizeof(float)));
  static_assert(kBdx <= 32);

  static auto Kernel() {
    return flashinfer::BatchDecodeWithPagedKVCacheKernel<
        flashinfer::PosEncodingMode::kNone, kStages, kTileSizePerBdx, kVecSize, kBdx, kBdy, kBdz,
        Variant<kSoftCap>, Params>;
  }

  static cudaError_t BlocksPerSm(int* blocks) {
    auto kernel = Kernel();
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSmemBytes);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, kThreads, kSmemBytes);
  }

  static cudaError_t Launch(const FlashInferDecodeArgs& args, cudaStream_t stream) {
    const FlashInferPages& kv = args.kv;
    const FlashInferDecodePlanInfo& plan = args.plan_info;
    // Strides of [page index, head, slot, dim] (paged_kv_t's kHND reading of kv_strides).
    const int64_t strides[3] = {kv.page_stride_elements, int64_t{kv.page_size} * kHeadDim,
                                kHeadDim};
    T* k_data = static_cast<T*>(kv.pool);
    flashinfer::paged_kv_t<T, int32_t> paged_kv(
        kv.num_kv_heads, kv.page_size, kHeadDim, plan.batch, flashinfer::QKVLayout::kHND, k_data,
        k_data + kv.value_offset(), strides, const_cast<int32_t*>(kv.page_indices),
        const_cast<int32_t*>(kv.indptr), const_cast<int32_t*>(kv.last_page_len));
    T* out = static_cast<T*>(args.out);
    Params params(static_cast<T*>(const_cast<void*>(args.q)), /*q_rope_offset=*/nullptr, paged_kv,
                  out, /*lse=*/nullptr, /*maybe_alibi_slopes=*/nullptr, args.num_heads,
                  static_cast<int32_t>(args.q_stride_n), static_cast<int32_t>(args.q_stride_h),
                  /*window_left=*/args.window > 0 ? args.window - 1 : -1, args.soft_cap,
                  args.sm_scale, /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    int32_t* packed = const_cast<int32_t*>(args.plan);
    params.request_indices = packed + plan.request_indices_offset;
    params.kv_tile_indices = packed + plan.kv_tile_indices_offset;
    params.o_indptr = packed + plan.o_indptr_offset;
    params.kv_chunk_size_ptr = packed + plan.kv_chunk_size_offset;
    params.padded_batch_size = plan.padded_batch_size;
    params.block_valid_mask = nullptr;  // Every item is real: no CUDA-graph padding.
    params.partition_kv = plan.split_kv;
    if (plan.split_kv) {
      // Chunks write partial outputs and log-sum-exps at their item's row; the merge folds them.
      params.o = static_cast<T*>(args.tmp_v);
      params.lse = args.tmp_s;
    }

    auto kernel = Kernel();
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         kSmemBytes);
    if (e != cudaSuccess) return e;
    void* kernel_args[] = {&params};
    e = cudaLaunchKernel(reinterpret_cast<void*>(kernel),
                         dim3(plan.padded_batch_size, kv.num_kv_heads),
                         dim3(kBdx, kBdy, kBdz), kernel_args, kSmemBytes, stream);
    if (e != cudaSuccess || !plan.split_kv) return e;
    return flashinfer::VariableLengthMergeStates(
        static_cast<T*>(args.tmp_v), args.tmp_s, params.o_indptr, out, /*s_merged=*/nullptr,
        static_cast<uint32_t>(plan.batch), /*seq_len=*/nullptr, args.num_heads, kHeadDim,
        /*enable_pdl=*/false, stream);
  }
};

// Calls f(Instance<...>()) for the instance of these shapes.
template <typename T, uint32_t kHeadDim, bool kSoftCap, typename F>
cudaError_t ForGroup(int group, F&& f) {
  switch (group) {
    case 1:
      return f(Instance<T, kHeadDim, 1, kSoftCap>());
    case 2:
      return f(Instance<T, kHeadDim, 2, kSoftCap>());
    case 3:
      return f(Instance<T, kHeadDim, 3, kSoftCap>());
    case 4:
      return f(Instance<T, kHeadDim, 4, kSoftCap>());
    case 8:
      return f(Instance<T, kHeadDim, 8, kSoftCap>());
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T, bool kSoftCap, typename F>
cudaError_t ForHeadDim(int head_dim, int group, F&& f) {
  switch (head_dim) {
    case 64:
      return ForGroup<T, 64, kSoftCap>(group, f);
    case 128:
      return ForGroup<T, 128, kSoftCap>(group, f);
    case 256:
      return ForGroup<T, 256, kSoftCap>(group, f);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename F>
cudaError_t ForInstance(KvType kv_type, int head_dim, int group, bool soft_cap, F&& f) {
  if (!FlashInferDecodeSupports(kv_type, head_dim, group)) return cudaErrorInvalidValue;
  if (kv_type == KvType::kBF16) {
    return soft_cap ? ForHeadDim<__nv_bfloat16, true>(head_dim, group, f)
                    : ForHeadDim<__nv_bfloat16, false>(head_dim, group, f);
  }
  return soft_cap ? ForHeadDim<__half, true>(head_dim, group, f)
                  : ForHeadDim<__half, false>(head_dim, group, f);
}

bool FitsInt32(int64_t x) { return x >= 0 && x <= std::numeric_limits<int32_t>::max(); }

}  // namespace

bool FlashInferDecodeSupports(KvType kv_type, int head_dim, int group_size) {
  const bool type_ok = kv_type == KvType::kF16 || kv_type == KvType::kBF16;
  const bool head_dim_ok = head_dim == 64 || head_dim == 128 || head_dim == 256;
  const bool group_ok = group_size == 1 || group_size == 2 || group_size == 3 || group_size == 4 ||
                        group_size == 8;
  return type_ok && head_dim_ok && group_ok;
}

cudaError_t FlashInferDecodeGridBudget(KvType kv_type, int head_dim, int group_size,
                                       bool soft_cap, int* budget) {
  if (!FlashInferDecodeSupports(kv_type, head_dim, group_size)) return cudaErrorInvalidValue;
  int device = 0, multiprocessors = 0, blocks_per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) {
    e = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  }
  if (e == cudaSuccess) {
    e = ForInstance(kv_type, head_dim, group_size, soft_cap,
                    [&](auto instance) { return decltype(instance)::BlocksPerSm(&blocks_per_sm); });
  }
  if (e != cudaSuccess) return e;
  *budget = multiprocessors * blocks_per_sm;
  return cudaSuccess;
}

cudaError_t FlashInferDecode(const FlashInferDecodeArgs& args, cudaStream_t stream) {
  const FlashInferPages& kv = args.kv;
  const FlashInferDecodePlanInfo& plan = args.plan_info;
  if (kv.num_kv_heads <= 0 || args.num_heads % kv.num_kv_heads != 0 || kv.page_size <= 0 ||
      plan.batch <= 0 || plan.padded_batch_size < plan.batch || args.q == nullptr ||
      args.out == nullptr || kv.pool == nullptr || args.plan == nullptr ||
      kv.indptr == nullptr || kv.page_indices == nullptr || kv.last_page_len == nullptr ||
      !FitsInt32(args.q_stride_n) || !FitsInt32(args.q_stride_h) ||
      kv.page_stride_elements <= 0 ||
      kv.page_stride_elements > std::numeric_limits<uint32_t>::max() ||
      (plan.split_kv && (args.tmp_v == nullptr || args.tmp_s == nullptr))) {
    return cudaErrorInvalidValue;
  }
  return ForInstance(kv.kv_type, kv.head_dim, args.num_heads / kv.num_kv_heads,
                     args.soft_cap != 0.0f, [&](auto instance) {
                       return decltype(instance)::Launch(args, stream);
                     });
}

}  // namespace attnserve::cuda
