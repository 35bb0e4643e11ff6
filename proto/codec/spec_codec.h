// Conversion between attnserve.v1.LayerSpec and attnserve::LayerSpec, driven by LayerSpecFields()
// (kernels/spec/spec_field.h): each row is the proto field of its number, read and written by
// reflection, so a new spec field needs no change here.
#ifndef ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_
#define ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/descriptor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// Resolves the proto's zero defaults (the rows' wire_zero_is_default: rope_theta 0 = 10000,
// qk_norm_eps 0 = 1e-6, ...; mla.rms_norm_eps 0 = 1e-6), then runs ValidateLayerSpec.
// INVALID_ARGUMENT naming "spec.<field>" on any error. The mla message is read only for
// VARIANT_MLA, a row with on_wire_when only where it holds.
absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& proto);

// Writes every field, causal included (proto3 defaults it to false; the engine to true), except a
// row's where its on_wire_when does not hold (alibi_bias_max without ALiBi), rope_scaling of type
// none and mla for other variants.
v1::LayerSpec LayerSpecToProto(const LayerSpec& spec);

// The prefix of a spec enum's proto value names: its zero value's name less the last word
// (QK_NORM_NONE: "QK_NORM_"). A LayerSpec enum named n is the proto value prefix + n in upper case.
std::string SpecEnumPrefix(const google::protobuf::EnumDescriptor& type);

v1::Variant VariantToProto(AttentionVariant variant);
v1::RopeScalingType RopeScalingTypeToProto(RopeScalingType type);

}  // namespace attnserve

#endif  // ATTNSERVE_PROTO_CODEC_SPEC_CODEC_H_
