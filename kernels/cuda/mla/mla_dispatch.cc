#include "kernels/cuda/mla/mla_dispatch.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention/dispatch.h"
#include "kernels/cuda/runtime/cuda_status.h"

namespace attnserve::cuda {

absl::Status CheckMlaKernelDims(int kv_lora_rank, int qk_rope_head_dim, int qk_nope_head_dim) {
  if (kv_lora_rank % 32 != 0 || kv_lora_rank > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mla.kv_lora_rank = ", kv_lora_rank,
        ": the CUDA MLA kernels take a multiple of 32 up to 1024; CPU-only for now: use "
        "--backend=cpu"));
  }
  const int64_t bytes = MlaTileLayout(kv_lora_rank, qk_rope_head_dim).bytes();
  if (bytes > kMlaMaxSharedBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mla.kv_lora_rank + mla.qk_rope_head_dim = ", kv_lora_rank + qk_rope_head_dim,
        ": the CUDA MLA attention tile would take ", bytes, " bytes of shared memory, more than ",
        kMlaMaxSharedBytes, "; CPU-only for now: use --backend=cpu"));
  }
  if (int64_t{kMlaProjectionRows} * qk_nope_head_dim * 4 > 48 * 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla.qk_nope_head_dim = ", qk_nope_head_dim,
                     ": the CUDA MLA query kernel takes at most 768; CPU-only for now: use "
                     "--backend=cpu"));
  }
  return absl::OkStatus();
}

absl::Status RunMlaPrefillAttention(const KvStorageFormat& kv_format,
                                    const MlaAttentionParams& params, cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
  switch (ToKvType(kv_format)) {
    case KvType::kF32:
      e = LaunchMlaPrefill<KvType::kF32>(params, stream);
      break;
    case KvType::kF16:
      e = LaunchMlaPrefill<KvType::kF16>(params, stream);
      break;
    case KvType::kBF16:
      e = LaunchMlaPrefill<KvType::kBF16>(params, stream);
      break;
    case KvType::kFp8:
      e = LaunchMlaPrefill<KvType::kFp8>(params, stream);
      break;
    case KvType::kInt8:
      e = LaunchMlaPrefill<KvType::kInt8>(params, stream);
      break;
  }
  return CudaStatus(e, "MLA prefill attention launch");
}

absl::Status RunMlaDecodeAttention(const KvStorageFormat& kv_format,
                                   const MlaAttentionParams& params, cudaStream_t stream) {
  cudaError_t e = cudaErrorInvalidValue;
  switch (ToKvType(kv_format)) {
    case KvType::kF32:
      e = LaunchMlaDecode<KvType::kF32>(params, stream);
      break;
    case KvType::kF16:
      e = LaunchMlaDecode<KvType::kF16>(params, stream);
      break;
    case KvType::kBF16:
      e = LaunchMlaDecode<KvType::kBF16>(params, stream);
      break;
    case KvType::kFp8:
      e = LaunchMlaDecode<KvType::kFp8>(params, stream);
      break;
    case KvType::kInt8:
      e = LaunchMlaDecode<KvType::kInt8>(params, stream);
      break;
  }
  if (absl::Status s = CudaStatus(e, "MLA decode attention launch"); !s.ok()) return s;
  // The GQA path's combine, seeing one "KV head" of head_dim = latent per query head.
  AttentionParams combine;
  combine.out = params.out;
  combine.num_heads = params.num_heads;
  combine.kv.head_dim = params.kv.latent_dim;
  combine.kv.num_kv_heads = 1;
  combine.sequences = params.sequences;
  combine.batch = params.batch;
  combine.partial_max = params.partial_max;
  combine.partial_sum = params.partial_sum;
  combine.partial_acc = params.partial_acc;
  combine.item_begin = params.item_begin;
  return CudaStatus(LaunchCombineSplits(combine, stream), "MLA split-KV combine launch");
}

}  // namespace attnserve::cuda
