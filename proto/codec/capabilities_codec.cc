#include "proto/codec/capabilities_codec.h"

#include "kernels/kv/quantization.h"
#include "proto/codec/spec_codec.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve {

v1::BackendCapabilities CapabilitiesToProto(const BackendCapabilities& c) {
  v1::BackendCapabilities out;
  for (AttentionVariant v : c.variants) out.add_variants(VariantToProto(v));
  for (int head_dim : c.head_dims) out.add_head_dims(head_dim);
  for (DType dtype : c.compute_dtypes) out.add_compute_dtypes(DTypeToProto(dtype));
  for (const KvStorageFormat& format : c.kv_formats) {
    out.add_kv_formats(KvStorageFormatName(format));
  }
  for (RopeScalingType type : c.rope_scalings) out.add_rope_scalings(RopeScalingTypeToProto(type));
  out.set_yarn_attention_factor(c.yarn_attention_factor);
  for (const std::string& name : c.variations) out.add_variations(name);
  // The flags older clients read, from the same list.
  const auto serves = [&](absl::string_view name) { return ServesVariation(c, name); };
  out.set_qk_norm(serves("qk_norm=rms") && serves("qk_norm=rms_unit_offset"));
  out.set_partial_rotary(serves("partial_rotary"));
  out.set_logit_softcapping(serves("logit_softcapping"));
  out.set_attention_sinks(serves("attention_sinks"));
  out.set_alibi(serves("alibi"));
  out.set_sliding_window(serves("sliding_window"));
  out.set_non_causal(serves("non_causal"));
  out.set_fork(c.fork);
  out.set_export_import(c.export_import);
  out.set_stacks(c.stacks);
  return out;
}

}  // namespace attnserve
