#include "kernels/cuda/attention/dispatch.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

namespace {

template <KvType kKv>
cudaError_t Prefill(int head_dim, const AttentionParams& p, cudaStream_t stream) {
  // Head dim 256 runs on CUDA cores for every page type: the tensor-core kernel's Q and O
  // fragments (192 registers a lane) and tiles (70 KB) do not fit at that width. So do f32 and
  // 8-bit pages (dequantized as a tile is gathered).
  if (head_dim == 256) return LaunchPrefill<kKv, 256>(p, stream);
  if constexpr (kKv == KvType::kF16 || kKv == KvType::kBF16) {
    return head_dim == 64 ? LaunchMmaPrefill<kKv, 64>(p, stream)
                          : LaunchMmaPrefill<kKv, 128>(p, stream);
  } else {
    return head_dim == 64 ? LaunchPrefill<kKv, 64>(p, stream) : LaunchPrefill<kKv, 128>(p, stream);
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

absl::Status CheckAttentionSupported(const KvStorageFormat& kv_format, int head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim = ", head_dim, ": the CUDA backend is built for head dims 64, 128 and 256"));
  }
  (void)kv_format;  // f32, f16, bf16, fp8 e4m3 and int8 are all built.
  return absl::OkStatus();
}

int PrefillRowsPerBlock(const KvStorageFormat& kv_format, int head_dim) {
  const KvType type = ToKvType(kv_format);
  const bool tensor_cores = (type == KvType::kF16 || type == KvType::kBF16) && head_dim != 256;
  return tensor_cores ? kMmaPrefillRows : kAttentionRowsPerBlock;
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

KvType ToKvType(const KvStorageFormat& kv_format) {
  switch (kv_format.quantization) {
    case KvQuantization::kFp8E4M3:
      return KvType::kFp8;
    case KvQuantization::kInt8:
      return KvType::kInt8;
    case KvQuantization::kNone:
      break;
  }
  return ToKvType(kv_format.element);
}

namespace {

// Calls fn.template operator()<kKv>() for the format's page type: the one switch over KV types.
template <typename Fn>
cudaError_t ForKvType(KvType type, Fn&& fn) {
  switch (type) {
    case KvType::kF32:
      return fn.template operator()<KvType::kF32>();
    case KvType::kF16:
      return fn.template operator()<KvType::kF16>();
    case KvType::kBF16:
      return fn.template operator()<KvType::kBF16>();
    case KvType::kFp8:
      return fn.template operator()<KvType::kFp8>();
    case KvType::kInt8:
      return fn.template operator()<KvType::kInt8>();
  }
  return cudaErrorInvalidValue;
}

}  // namespace

absl::Status RunPrefillAttention(const KvStorageFormat& kv_format, int head_dim,
                                 const AttentionParams& params, cudaStream_t stream) {
  if (absl::Status s = CheckAttentionSupported(kv_format, head_dim); !s.ok()) return s;
  const cudaError_t error = ForKvType(ToKvType(kv_format), [&]<KvType kKv>() {
    return Prefill<kKv>(head_dim, params, stream);
  });
  return CudaStatus(error, "prefill attention launch");
}

absl::Status RunDecodeAttention(const KvStorageFormat& kv_format, int head_dim,
                                const AttentionParams& params, int row_blocks,
                                cudaStream_t stream) {
  if (absl::Status s = CheckAttentionSupported(kv_format, head_dim); !s.ok()) return s;
  const cudaError_t error = ForKvType(ToKvType(kv_format), [&]<KvType kKv>() {
    return Decode<kKv>(head_dim, params, row_blocks, stream);
  });
  ATTNSERVE_CUDA_RETURN_IF_ERROR(error, "paged decode attention launch");
  return CudaStatus(LaunchCombineSplits(params, stream), "split-KV combine launch");
}

}  // namespace attnserve::cuda
