#include "proto/codec/spec_codec.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "kernels/base/overloaded.h"
#include "kernels/spec/spec_field.h"

namespace attnserve {

v1::Variant VariantToProto(AttentionVariant variant) {
  switch (variant) {
    case AttentionVariant::kMHA:
      return v1::VARIANT_MHA;
    case AttentionVariant::kMQA:
      return v1::VARIANT_MQA;
    case AttentionVariant::kGQA:
      return v1::VARIANT_GQA;
    case AttentionVariant::kMLA:
      return v1::VARIANT_MLA;
  }
  return v1::VARIANT_UNSPECIFIED;
}

v1::RopeScalingType RopeScalingTypeToProto(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return v1::ROPE_SCALING_NONE;
    case RopeScalingType::kLinear:
      return v1::ROPE_SCALING_LINEAR;
    case RopeScalingType::kDynamic:
      return v1::ROPE_SCALING_DYNAMIC;
    case RopeScalingType::kLlama3:
      return v1::ROPE_SCALING_LLAMA3;
    case RopeScalingType::kYarn:
      return v1::ROPE_SCALING_YARN;
  }
  return v1::ROPE_SCALING_NONE;
}

namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Reflection;


const FieldDescriptor& ProtoField(const SpecField& field) {
  const FieldDescriptor* proto = v1::LayerSpec::descriptor()->FindFieldByNumber(field.proto_number);
  if (proto == nullptr) {  // spec_codec_test checks every row; this is a build that skipped it.
    std::fprintf(stderr, "attnserve.v1.LayerSpec has no field %d (%s)\n", field.proto_number,
                 std::string(field.name).c_str());
    std::abort();
  }
  return *proto;
}

// RopeScaling's proto, its type's own fields only (as LayerSpecFromJson).
absl::Status RopeScalingFromProto(const v1::RopeScaling& in, RopeScaling& r) {
  switch (in.type()) {
    case v1::ROPE_SCALING_NONE:
      r.type = RopeScalingType::kNone;
      break;
    case v1::ROPE_SCALING_LINEAR:
      r.type = RopeScalingType::kLinear;
      break;
    case v1::ROPE_SCALING_DYNAMIC:
      r.type = RopeScalingType::kDynamic;
      break;
    case v1::ROPE_SCALING_LLAMA3:
      r.type = RopeScalingType::kLlama3;
      break;
    case v1::ROPE_SCALING_YARN:
      r.type = RopeScalingType::kYarn;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.rope_scaling.type: unknown value ", static_cast<int>(in.type())));
  }
  // 0 = absent, as transformers' `rope_scaling.get("beta_fast") or 32`.
  auto or_default = [](double value, double fallback) { return value == 0.0 ? fallback : value; };
  if (r.type != RopeScalingType::kNone) r.factor = or_default(in.factor(), 1.0);
  if (r.type == RopeScalingType::kLlama3 || r.type == RopeScalingType::kYarn) {
    r.original_max_position_embeddings = in.original_max_position_embeddings();
  }
  if (r.type == RopeScalingType::kLlama3) {
    r.low_freq_factor = or_default(in.low_freq_factor(), 1.0);
    r.high_freq_factor = or_default(in.high_freq_factor(), 4.0);
  }
  if (r.type == RopeScalingType::kYarn) {
    r.beta_fast = or_default(in.beta_fast(), 32.0);
    r.beta_slow = or_default(in.beta_slow(), 1.0);
    r.mscale = in.mscale();
    r.mscale_all_dim = in.mscale_all_dim();
    r.truncate = !in.has_truncate() || in.truncate();
  }
  return absl::OkStatus();
}

void RopeScalingToProto(const RopeScaling& r, v1::RopeScaling& scaling) {
  scaling.set_type(RopeScalingTypeToProto(r.type));
  scaling.set_factor(r.factor);
  scaling.set_original_max_position_embeddings(r.original_max_position_embeddings);
  scaling.set_low_freq_factor(r.low_freq_factor);
  scaling.set_high_freq_factor(r.high_freq_factor);
  scaling.set_beta_fast(r.beta_fast);
  scaling.set_beta_slow(r.beta_slow);
  scaling.set_mscale(r.mscale);
  scaling.set_mscale_all_dim(r.mscale_all_dim);
  if (r.type == RopeScalingType::kYarn) scaling.set_truncate(r.truncate);
}

void MlaFromProto(const v1::MlaDims& in, MlaDims& mla) {
  mla.q_lora_rank = in.q_lora_rank();
  mla.kv_lora_rank = in.kv_lora_rank();
  mla.qk_nope_head_dim = in.qk_nope_head_dim();
  mla.qk_rope_head_dim = in.qk_rope_head_dim();
  mla.v_head_dim = in.v_head_dim();
  mla.rms_norm_eps = in.rms_norm_eps() == 0.0f ? 1e-6f : in.rms_norm_eps();
}

// A number read from the wire: 0 keeps LayerSpec{}'s default where the row says so.
template <typename T>
void SetNumber(const SpecField& field, T value, T& out) {
  if (value != T{0} || !field.wire_zero_is_default) out = value;
}

absl::Status EnumFromProto(const SpecField& field, const EnumMember& member, int number,
                           const EnumDescriptor& type, LayerSpec& spec) {
  const EnumValueDescriptor* value = type.FindValueByNumber(number);
  const std::string name =
      value == nullptr
          ? ""
          : absl::AsciiStrToLower(absl::StripPrefix(value->name(), SpecEnumPrefix(type)));
  if (name == "unspecified") {  // VARIANT_UNSPECIFIED: the wire must name one of the others.
    std::vector<std::string> set;
    for (int i = 0; i < type.value_count(); ++i) {
      if (type.value(i)->number() != number) set.push_back(type.value(i)->name());
    }
    const std::string last = set.empty() ? "" : set.back();
    if (!set.empty()) set.pop_back();
    return absl::InvalidArgumentError(absl::StrCat("spec.", field.name, ": must be set (",
                                                   absl::StrJoin(set, ", "), " or ", last, ")"));
  }
  absl::StatusOr<int> parsed =
      value == nullptr ? absl::InvalidArgumentError("") : member.parse(name);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.", field.name, ": unknown value ", number));
  }
  member.set(spec, *parsed);
  return absl::OkStatus();
}

absl::Status FieldFromProto(const v1::LayerSpec& proto, const SpecField& field, LayerSpec& spec) {
  if (field.on_wire_when != nullptr && !field.on_wire_when(spec)) return absl::OkStatus();
  const FieldDescriptor& wire = ProtoField(field);
  const Reflection& reflection = *proto.GetReflection();
  return std::visit(
      Overloaded{
          [&](int LayerSpec::*member) {
            SetNumber(field, static_cast<int>(reflection.GetInt32(proto, &wire)),
                      spec.*member);
            return absl::OkStatus();
          },
          [&](float LayerSpec::*member) {
            SetNumber(field, reflection.GetFloat(proto, &wire), spec.*member);
            return absl::OkStatus();
          },
          [&](double LayerSpec::*member) {
            SetNumber(field, reflection.GetDouble(proto, &wire), spec.*member);
            return absl::OkStatus();
          },
          [&](bool LayerSpec::*member) {
            spec.*member = reflection.GetBool(proto, &wire);
            return absl::OkStatus();
          },
          [&](const EnumMember& member) {
            return EnumFromProto(field, member, reflection.GetEnumValue(proto, &wire),
                                 *wire.enum_type(), spec);
          },
          [&](RopeScaling LayerSpec::*member) {
            if (!proto.has_rope_scaling()) return absl::OkStatus();
            return RopeScalingFromProto(proto.rope_scaling(), spec.*member);
          },
          [&](MlaDims LayerSpec::*member) {
            // Read only for MLA.
            if (spec.variant == AttentionVariant::kMLA) MlaFromProto(proto.mla(), spec.*member);
            return absl::OkStatus();
          },
      },
      field.member);
}

void FieldToProto(const LayerSpec& spec, const SpecField& field, v1::LayerSpec& proto) {
  if (field.on_wire_when != nullptr && !field.on_wire_when(spec)) return;
  const FieldDescriptor& wire = ProtoField(field);
  const Reflection& reflection = *proto.GetReflection();
  std::visit(
      Overloaded{
          [&](int LayerSpec::*member) { reflection.SetInt32(&proto, &wire, spec.*member); },
          [&](float LayerSpec::*member) { reflection.SetFloat(&proto, &wire, spec.*member); },
          [&](double LayerSpec::*member) { reflection.SetDouble(&proto, &wire, spec.*member); },
          [&](bool LayerSpec::*member) { reflection.SetBool(&proto, &wire, spec.*member); },
          [&](const EnumMember& member) {
            const EnumDescriptor& type = *wire.enum_type();
            const std::string name = absl::StrCat(
                SpecEnumPrefix(type), absl::AsciiStrToUpper(member.name(member.get(spec))));
            const EnumValueDescriptor* value = type.FindValueByName(name);
            if (value == nullptr) {  // spec_codec_test checks every name.
              std::fprintf(stderr, "%s has no value %s\n", std::string(type.full_name()).c_str(),
                           name.c_str());
              std::abort();
            }
            reflection.SetEnumValue(&proto, &wire, value->number());
          },
          [&](RopeScaling LayerSpec::*member) {
            const RopeScaling& r = spec.*member;
            if (r.type != RopeScalingType::kNone) {
              RopeScalingToProto(r, *proto.mutable_rope_scaling());
            }
          },
          [&](MlaDims LayerSpec::*member) {
            if (spec.variant != AttentionVariant::kMLA) return;
            const MlaDims& in = spec.*member;
            v1::MlaDims* mla = proto.mutable_mla();
            mla->set_q_lora_rank(in.q_lora_rank);
            mla->set_kv_lora_rank(in.kv_lora_rank);
            mla->set_qk_nope_head_dim(in.qk_nope_head_dim);
            mla->set_qk_rope_head_dim(in.qk_rope_head_dim);
            mla->set_v_head_dim(in.v_head_dim);
            mla->set_rms_norm_eps(in.rms_norm_eps);
          },
      },
      field.member);
}

}  // namespace

std::string SpecEnumPrefix(const EnumDescriptor& type) {
  const EnumValueDescriptor* zero = type.FindValueByNumber(0);
  if (zero == nullptr) return "";
  const std::string& name = zero->name();
  const size_t last_word = name.rfind('_');
  return last_word == std::string::npos ? "" : name.substr(0, last_word + 1);
}

absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& proto) {
  LayerSpec spec;
  for (const SpecField& field : LayerSpecFields()) {
    if (absl::Status s = FieldFromProto(proto, field, spec); !s.ok()) return s;
  }
  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", s.message()));
  }
  return spec;
}

v1::LayerSpec LayerSpecToProto(const LayerSpec& spec) {
  v1::LayerSpec out;
  for (const SpecField& field : LayerSpecFields()) FieldToProto(spec, field, out);
  return out;
}

}  // namespace attnserve
