// attnctl's --spec=KEY=VALUE[,KEY=VALUE...]: any field of the layer spec, by its JSON name.
//
// The keys are the rows of LayerSpecFields() (kernels/spec/spec_field.h) and the values are read
// by the JSON form's own reader (kernels/spec/layer_spec_json.h), so a new spec field is settable
// here with no attnctl change, with the same types, defaults and refusals as in a spec file:
//   --spec=d_model=512,qk_norm=rms_across_heads,attention_sinks=true,qk_norm_eps=1e-5
//   --spec=rope_scaling.type=linear,rope_scaling.factor=2   (a nested object's keys, dotted)
// A value is JSON when it parses as JSON (512, 1e-5, true) and a string otherwise (rms, bloom).
#ifndef ATTNSERVE_CLIENT_ATTNCTL_SPEC_SETTINGS_H_
#define ATTNSERVE_CLIENT_ATTNCTL_SPEC_SETTINGS_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// `settings` over `base` (the spec of the other flags or of --spec_file), or, without a base, the
// whole spec as a spec file would give it (variant, d_model and num_heads required; the file's
// defaults for the rest). A nested object named by a setting (rope_scaling.*, mla.*) is the
// settings' alone: the base's is dropped, so a new rope_scaling type keeps no key of the old one.
// INVALID_ARGUMENT naming the setting or key at fault; the result is validated
// (ValidateLayerSpec).
absl::StatusOr<LayerSpec> ApplySpecSettings(const std::optional<LayerSpec>& base,
                                            absl::Span<const std::string> settings);

// The keys --spec takes, one per line, with each one's type or names:
// "  qk_norm: none | rms | ...".
std::string SpecSettingsHelp();

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_SPEC_SETTINGS_H_
