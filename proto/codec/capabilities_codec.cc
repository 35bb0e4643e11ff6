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
  out.set_qk_norm(!c.qk_norms.empty());
  for (QkNorm norm : c.qk_norms) out.add_qk_norms(std::string(QkNormName(norm)));
  out.set_partial_rotary(c.partial_rotary);
  out.set_logit_softcapping(c.logit_softcapping);
  out.set_attention_sinks(c.attention_sinks);
  out.set_alibi(c.alibi);
  out.set_sliding_window(c.sliding_window);
  out.set_non_causal(c.non_causal);
  out.set_fork(c.fork);
  out.set_export_import(c.export_import);
  out.set_stacks(c.stacks);
  return out;
}

}  // namespace attnserve
