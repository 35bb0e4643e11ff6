#include "kernels/cuda/cuda_capabilities.h"

namespace attnserve {

const BackendCapabilities& CudaCapabilities() {
  static const BackendCapabilities* const capabilities = [] {
    auto* c = new BackendCapabilities;
    c->backend = "cuda";
    // MLA: CudaMlaLayer, the absorbed form over the CPU's latent pages (kernels/cuda/mla/).
    c->variants = {AttentionVariant::kMHA, AttentionVariant::kMQA, AttentionVariant::kGQA,
                   AttentionVariant::kMLA};
    // The instantiations of kernels/cuda/attention/attention_*.cu (dispatch.cc).
    c->head_dims = {64, 128, 256};
    // f32 pages compute in fp32; f16/bf16 pages run the projections and prefill in that dtype
    // with fp32 accumulation (kernels/cuda/layer/cuda_layer.h).
    c->compute_dtypes = {DType::kF32, DType::kF16, DType::kBF16};
    // 8-bit pages: quantize-on-append and dequantize-on-gather with the CPU's arithmetic
    // (kernels/kv/kv_codes.h), projections in fp32; MLA's latent pages too
    // (kernels/cuda/mla/: MlaQuantizedAppendBlock, MlaAttendRows).
    c->kv_formats = {DType::kF32, DType::kF16, DType::kBF16,
                     KvStorageFormat::Quantized(KvQuantization::kFp8E4M3),
                     KvStorageFormat::Quantized(KvQuantization::kInt8)};
    // The RoPE kernel takes per-pair frequencies, so every frequency rule applies, and multiplies
    // cos and sin by YaRN's attention factor.
    c->rope_scalings = {RopeScalingType::kNone, RopeScalingType::kLinear, RopeScalingType::kLlama3,
                        RopeScalingType::kYarn};
    c->yarn_attention_factor = true;
    // The model-family variations: hooks of kernels/cuda/attention/variant_hooks.cuh (q/k norm in
    // the RoPE/append kernel, soft-cap, ALiBi and sinks in the attention kernels and the combine);
    // the RoPE kernel rotates only the first rotary_dim dims. ALiBi and sinks run the native
    // kernels under --cuda_attention=flashinfer (FlashInferAttention::Serves).
    // Not qk_norm=rms_across_heads: OLMo 2's norm across a token's heads would need a reduction
    // across the RoPE/append kernel's per-head blocks (kernels/cuda/attention/rope_append.cuh).
    c->variations = {"qk_norm=rms",      "qk_norm=rms_unit_offset", "partial_rotary",
                     "logit_softcapping", "attention_sinks",        "alibi",
                     "sliding_window",    "non_causal"};
    // CudaGqaLayer::ForkSequence (device pages shared by reference count, the partial page
    // copied) and Export/ImportSequence (whole pages D2H/H2D in the CPU backend's byte format).
    c->fork = true;
    c->export_import = true;
    // A stack only composes its layers through AttentionLayer, which CudaGqaLayer implements.
    c->stacks = true;
    return c;
  }();
  return *capabilities;
}

}  // namespace attnserve
