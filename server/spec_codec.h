// Conversion between attnserve.v1.LayerSpec and attnserve::LayerSpec.
#ifndef ATTNSERVE_SERVER_SPEC_CODEC_H_
#define ATTNSERVE_SERVER_SPEC_CODEC_H_

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/layer_spec.h"

namespace attnserve::server {

// Resolves the proto's zero defaults (rope_theta 0 = 10000, rms_norm_eps 0 = 1e-6), then runs
// ValidateLayerSpec. INVALID_ARGUMENT naming "spec.<field>" on any error. The mla message is read
// only for VARIANT_MLA.
absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& proto);

void LayerSpecToProto(const LayerSpec& spec, v1::LayerSpec* proto);

v1::Variant VariantToProto(AttentionVariant variant);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SPEC_CODEC_H_
