#include "kernels/cuda/attention/dispatch.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
cudaError_t Prefill(int head_dim, const AttentionParams& p, cudaStream_t stream) {
  // Head dim 256 runs on CUDA cores for every page type: the tensor-core kernel's Q and O
  // fragments (192 registers a lane) and tiles (70 KB) do not fit at that width.
  if (head_dim == 256) return LaunchPrefill<kKv, 256>(p, stream);
  if constexpr (kKv == KvType::kF32) {
    return head_dim == 64 ? LaunchPrefill<kKv, 64>(p, stream) : LaunchPrefill<kKv, 128>(p, stream);
  } else {
    return head_dim == 64 ? LaunchMmaPrefill<kKv, 64>(p, stream)
                          : LaunchMmaPrefill<kKv, 128>(p, stream);
  }
}

template <KvType kKv>
cudaError_t Decode(int head_dim, const AttentionParams& p, int row_blocks, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return LaunchPagedDecode<kKv, 64>(p, row_blocks, stream);
    case 128:
      return LaunchPagedDecode<kKv, 128>(p, row_blocks, stream);
    default:
      return LaunchPagedDecode<kKv, 256>(p, row_blocks, stream);
  }
}

}  // namespace

absl::Status CheckAttentionSupported(DType kv_dtype, int head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim = ", head_dim, ": the CUDA backend is built for head dims 64, 128 and 256"));
  }
  (void)kv_dtype;  // f32, f16 and bf16 are all built.
  return absl::OkStatus();
}

int PrefillRowsPerBlock(DType kv_dtype, int head_dim) {
  return kv_dtype == DType::kF32 || head_dim == 256 ? kAttentionRowsPerBlock : kMmaPrefillRows;
}

KvType ToKvType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return KvType::kF16;
    case DType::kBF16:
      return KvType::kBF16;
    case DType::kF32:
      break;
  }
  return KvType::kF32;
}

absl::Status RunPrefillAttention(DType kv_dtype, int head_dim, const AttentionParams& params,
                                 cudaStream_t stream) {
  if (absl::Status s = CheckAttentionSupported(kv_dtype, head_dim); !s.ok()) return s;
  cudaError_t error = cudaSuccess;
  switch (ToKvType(kv_dtype)) {
    case KvType::kF32:
      error = Prefill<KvType::kF32>(head_dim, params, stream);
      break;
    case KvType::kF16:
      error = Prefill<KvType::kF16>(head_dim, params, stream);
      break;
    case KvType::kBF16:
      error = Prefill<KvType::kBF16>(head_dim, params, stream);
      break;
  }
  return CudaStatus(error, "prefill attention launch");
}

absl::Status RunDecodeAttention(DType kv_dtype, int head_dim, const AttentionParams& params,
                                int row_blocks, cudaStream_t stream) {
  if (absl::Status s = CheckAttentionSupported(kv_dtype, head_dim); !s.ok()) return s;
  cudaError_t error = cudaSuccess;
  switch (ToKvType(kv_dtype)) {
    case KvType::kF32:
      error = Decode<KvType::kF32>(head_dim, params, row_blocks, stream);
      break;
    case KvType::kF16:
      error = Decode<KvType::kF16>(head_dim, params, row_blocks, stream);
      break;
    case KvType::kBF16:
      error = Decode<KvType::kBF16>(head_dim, params, row_blocks, stream);
      break;
  }
  ATTNSERVE_CUDA_RETURN_IF_ERROR(error, "paged decode attention launch");
  return CudaStatus(LaunchCombineSplits(params, stream), "split-KV combine launch");
}

}  // namespace attnserve::cuda
