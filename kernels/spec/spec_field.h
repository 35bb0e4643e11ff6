// One field of a LayerSpec as its spec files, the wire and the Python client see it. The JSON key,
// the proto field and the LayerSpec member share one name, so LayerSpecFields(), one row per
// field, is all the JSON form (layer_spec_json.cc) and the wire codec (proto/codec/spec_codec.cc,
// by protobuf reflection) need: a new spec field is its member (layer_spec.h), its row (beside
// ValidateLayerSpec in layer_spec.cc) and its proto field. spec_codec_test checks the rows against
// the proto.
#ifndef ATTNSERVE_KERNELS_SPEC_SPEC_FIELD_H_
#define ATTNSERVE_KERNELS_SPEC_SPEC_FIELD_H_

#include <type_traits>
#include <utility>
#include <variant>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// An enum member, read and written by name ("rms_unit_offset"). On the wire it is the proto enum
// value of that name in upper case after the enum's prefix, which is its zero value's name less
// the last word (QK_NORM_NONE: QK_NORM_, so QK_NORM_RMS_UNIT_OFFSET).
struct EnumMember {
  int (*get)(const LayerSpec&);
  void (*set)(LayerSpec&, int);
  absl::string_view (*name)(int);
  // Refusals name the field ("qk_norm: unknown 'x', expected ...").
  absl::StatusOr<int> (*parse)(absl::string_view);
};

// EnumByName<&LayerSpec::qk_norm, QkNormName, ParseQkNorm>().
template <auto kMember, auto kName, auto kParse>
constexpr EnumMember EnumByName() {
  using Enum = std::remove_cvref_t<decltype(std::declval<LayerSpec&>().*kMember)>;
  return {
      .get = [](const LayerSpec& spec) { return static_cast<int>(spec.*kMember); },
      .set = [](LayerSpec& spec, int value) { spec.*kMember = static_cast<Enum>(value); },
      .name = [](int value) { return kName(static_cast<Enum>(value)); },
      .parse = [](absl::string_view text) -> absl::StatusOr<int> {
        absl::StatusOr<Enum> value = kParse(text);
        if (!value.ok()) return value.status();
        return static_cast<int>(*value);
      },
  };
}

// Where the field lives. The nested objects (rope_scaling, mla) have their own code in the JSON
// form and the codec: their keys depend on the scaling type and the variant.
using SpecMember =
    std::variant<int LayerSpec::*, float LayerSpec::*, double LayerSpec::*, bool LayerSpec::*,
                 EnumMember, RopeScaling LayerSpec::*, MlaDims LayerSpec::*>;

struct SpecField {
  absl::string_view name;  // JSON key, proto field and LayerSpec member.
  int proto_number;        // Its number in attnserve.v1.LayerSpec.
  SpecMember member;
  // A number whose 0 on the wire stands for LayerSpec{}'s default (rope_theta 0 = 10000): proto3
  // cannot tell an unset field from 0.
  bool wire_zero_is_default = false;
  // When set, the wire carries the field only for specs where this holds (given the fields before
  // it); elsewhere it reads as LayerSpec{}'s default, so adding it changed no fingerprint.
  bool (*on_wire_when)(const LayerSpec&) = nullptr;
};

// Every field of LayerSpec, in the JSON form's key order (layer_spec_json.h). Defined in
// layer_spec.cc.
absl::Span<const SpecField> LayerSpecFields();

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_SPEC_FIELD_H_
