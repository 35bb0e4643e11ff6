#include "kernels/cpu/cpu_capabilities.h"

#include "kernels/spec/attention_variation.h"

namespace attnserve {

const BackendCapabilities& CpuCapabilities() {
  static const BackendCapabilities* const capabilities = [] {
    auto* c = new BackendCapabilities;
    c->backend = "cpu";
    c->variants = {AttentionVariant::kMHA, AttentionVariant::kMQA, AttentionVariant::kGQA,
                   AttentionVariant::kMLA};
    c->head_dims = {};  // Any: the kernels loop over head_dim.
    c->compute_dtypes = {DType::kF32};
    // No f16 pages: the CPU engine reads K/V as fp32 and keeps bf16 as its 16-bit format.
    c->kv_formats = {DType::kF32, DType::kBF16,
                     KvStorageFormat::Quantized(KvQuantization::kFp8E4M3),
                     KvStorageFormat::Quantized(KvQuantization::kInt8)};
    // Dynamic NTK is refused for every backend by ValidateLayerSpec, so it is not listed.
    c->rope_scalings = {RopeScalingType::kNone, RopeScalingType::kLinear, RopeScalingType::kLlama3,
                        RopeScalingType::kYarn};
    c->yarn_attention_factor = true;
    // Every variation: the CPU kernels run every hook of kernels/spec/attention_variation.h.
    for (const NamedVariation& v : NamedVariations()) c->variations.push_back(v.name);
    c->fork = true;           // CpuLayer::ForkSequence.
    c->export_import = true;  // CpuLayer::ExportSequence / ImportSequence.
    c->stacks = true;
    return c;
  }();
  return *capabilities;
}

}  // namespace attnserve
