#include "kernels/cuda/cuda_capabilities.h"

namespace attnserve {

const BackendCapabilities& CudaCapabilities() {
  static const BackendCapabilities* const capabilities = [] {
    auto* c = new BackendCapabilities;
    c->backend = "cuda";
    // No MLA kernels yet.
    c->variants = {AttentionVariant::kMHA, AttentionVariant::kMQA, AttentionVariant::kGQA};
    // The instantiations of kernels/cuda/attention/attention_*.cu (dispatch.cc).
    c->head_dims = {64, 128};
    // f32 pages compute in fp32; f16/bf16 pages run the projections and prefill in that dtype
    // with fp32 accumulation (kernels/cuda/layer/cuda_layer.h).
    c->compute_dtypes = {DType::kF32, DType::kF16, DType::kBF16};
    c->kv_formats = {DType::kF32, DType::kF16, DType::kBF16};  // No 8-bit pages yet.
    // The RoPE kernel takes per-pair frequencies, so every frequency rule applies ...
    c->rope_scalings = {RopeScalingType::kNone, RopeScalingType::kLinear, RopeScalingType::kLlama3,
                        RopeScalingType::kYarn};
    // ... but it does not multiply cos and sin: YaRN's attention factor would be dropped.
    c->yarn_attention_factor = false;
    // The model-family variations are computed by the CPU backend only (kernels/cpu/gqa_layer.h).
    c->qk_norm = false;
    c->partial_rotary = false;
    c->logit_softcapping = false;
    c->attention_sinks = false;
    c->sliding_window = true;
    c->non_causal = true;
    // The kernels do not call AttentionVariation's score bias yet (spec/attention_variation.h).
    c->alibi = false;
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
