// Conversion between attnserve.v1.LayerSpec and attnserve::LayerSpec.
#ifndef ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_
#define ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// Resolves the proto's zero defaults (rope_theta 0 = 10000, rms_norm_eps and qk_norm_eps 0 = 1e-6),
// then runs ValidateLayerSpec. INVALID_ARGUMENT naming "spec.<field>" on any error. The mla message
// is read only for VARIANT_MLA.
absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& proto);

// Writes every field, causal included (proto3 defaults it to false; the engine to true).
v1::LayerSpec LayerSpecToProto(const LayerSpec& spec);

v1::Variant VariantToProto(AttentionVariant variant);
v1::RopeScalingType RopeScalingTypeToProto(RopeScalingType type);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_
