#include "proto/codec/spec_codec.h"

#include "absl/strings/str_cat.h"

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

absl::StatusOr<LayerSpec> LayerSpecFromProto(const v1::LayerSpec& proto) {
  LayerSpec spec;
  switch (proto.variant()) {
    case v1::VARIANT_MHA:
      spec.variant = AttentionVariant::kMHA;
      break;
    case v1::VARIANT_MQA:
      spec.variant = AttentionVariant::kMQA;
      break;
    case v1::VARIANT_GQA:
      spec.variant = AttentionVariant::kGQA;
      break;
    case v1::VARIANT_MLA:
      spec.variant = AttentionVariant::kMLA;
      break;
    case v1::VARIANT_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "spec.variant: must be set (VARIANT_MHA, VARIANT_MQA, VARIANT_GQA or VARIANT_MLA)");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.variant: unknown value ", static_cast<int>(proto.variant())));
  }
  switch (proto.rope()) {
    case v1::ROPE_NONE:
      spec.rope = RopeLayout::kNone;
      break;
    case v1::ROPE_HALF:
      spec.rope = RopeLayout::kHalf;
      break;
    case v1::ROPE_INTERLEAVED:
      spec.rope = RopeLayout::kInterleaved;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.rope: unknown value ", static_cast<int>(proto.rope())));
  }
  spec.d_model = proto.d_model();
  spec.num_heads = proto.num_heads();
  spec.num_kv_heads = proto.num_kv_heads();
  spec.head_dim = proto.head_dim();
  spec.qkv_bias = proto.qkv_bias();
  spec.o_bias = proto.o_bias();
  spec.rope_theta = proto.rope_theta() == 0.0 ? 10000.0 : proto.rope_theta();
  if (proto.has_rope_scaling()) {
    const v1::RopeScaling& in = proto.rope_scaling();
    RopeScaling& r = spec.rope_scaling;
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
        return absl::InvalidArgumentError(absl::StrCat("spec.rope_scaling.type: unknown value ",
                                                       static_cast<int>(in.type())));
    }
    // 0 = absent, as transformers' `rope_scaling.get("beta_fast") or 32`.
    auto or_default = [](double value, double fallback) { return value == 0.0 ? fallback : value; };
    // Only the type's own fields are read (as LayerSpecFromJson), the rest keep their defaults.
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
  }
  spec.causal = proto.causal();
  spec.sliding_window = proto.sliding_window();
  spec.softmax_scale = proto.softmax_scale();
  spec.rotary_dim = proto.rotary_dim();
  switch (proto.qk_norm()) {
    case v1::QK_NORM_NONE:
      spec.qk_norm = QkNorm::kNone;
      break;
    case v1::QK_NORM_RMS:
      spec.qk_norm = QkNorm::kRms;
      break;
    case v1::QK_NORM_RMS_UNIT_OFFSET:
      spec.qk_norm = QkNorm::kRmsUnitOffset;
      break;
    case v1::QK_NORM_RMS_ACROSS_HEADS:
      spec.qk_norm = QkNorm::kRmsAcrossHeads;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.qk_norm: unknown value ", static_cast<int>(proto.qk_norm())));
  }
  spec.qk_norm_eps = proto.qk_norm_eps() == 0.0f ? 1e-6f : proto.qk_norm_eps();
  spec.attn_logit_softcapping = proto.attn_logit_softcapping();
  spec.attention_sinks = proto.attention_sinks();
  switch (proto.alibi()) {
    case v1::ALIBI_NONE:
      spec.alibi = Alibi::kNone;
      break;
    case v1::ALIBI_BLOOM:
      spec.alibi = Alibi::kBloom;
      break;
    case v1::ALIBI_MPT:
      spec.alibi = Alibi::kMpt;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.alibi: unknown value ", static_cast<int>(proto.alibi())));
  }
  // The slope range only means something with ALiBi, and LayerSpecToProto writes it only then;
  // without ALiBi it stays the default so a spec round-trips (and fingerprints) the same.
  spec.alibi_bias_max = spec.alibi == Alibi::kNone || proto.alibi_bias_max() == 0.0f
                            ? 8.0f
                            : proto.alibi_bias_max();
  if (spec.variant == AttentionVariant::kMLA) {
    const v1::MlaDims& mla = proto.mla();
    spec.mla.q_lora_rank = mla.q_lora_rank();
    spec.mla.kv_lora_rank = mla.kv_lora_rank();
    spec.mla.qk_nope_head_dim = mla.qk_nope_head_dim();
    spec.mla.qk_rope_head_dim = mla.qk_rope_head_dim();
    spec.mla.v_head_dim = mla.v_head_dim();
    spec.mla.rms_norm_eps = mla.rms_norm_eps() == 0.0f ? 1e-6f : mla.rms_norm_eps();
  }
  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", s.message()));
  }
  return spec;
}

v1::LayerSpec LayerSpecToProto(const LayerSpec& spec) {
  v1::LayerSpec out;
  out.set_variant(VariantToProto(spec.variant));
  out.set_d_model(spec.d_model);
  out.set_num_heads(spec.num_heads);
  out.set_num_kv_heads(spec.num_kv_heads);
  out.set_head_dim(spec.head_dim);
  out.set_qkv_bias(spec.qkv_bias);
  out.set_o_bias(spec.o_bias);
  switch (spec.rope) {
    case RopeLayout::kNone:
      out.set_rope(v1::ROPE_NONE);
      break;
    case RopeLayout::kHalf:
      out.set_rope(v1::ROPE_HALF);
      break;
    case RopeLayout::kInterleaved:
      out.set_rope(v1::ROPE_INTERLEAVED);
      break;
  }
  out.set_rope_theta(spec.rope_theta);
  if (spec.rope_scaling.type != RopeScalingType::kNone) {
    const RopeScaling& r = spec.rope_scaling;
    v1::RopeScaling* scaling = out.mutable_rope_scaling();
    scaling->set_type(RopeScalingTypeToProto(r.type));
    scaling->set_factor(r.factor);
    scaling->set_original_max_position_embeddings(r.original_max_position_embeddings);
    scaling->set_low_freq_factor(r.low_freq_factor);
    scaling->set_high_freq_factor(r.high_freq_factor);
    scaling->set_beta_fast(r.beta_fast);
    scaling->set_beta_slow(r.beta_slow);
    scaling->set_mscale(r.mscale);
    scaling->set_mscale_all_dim(r.mscale_all_dim);
    if (r.type == RopeScalingType::kYarn) scaling->set_truncate(r.truncate);
  }
  out.set_causal(spec.causal);
  out.set_sliding_window(spec.sliding_window);
  out.set_softmax_scale(spec.softmax_scale);
  out.set_rotary_dim(spec.rotary_dim);
  switch (spec.qk_norm) {
    case QkNorm::kNone:
      out.set_qk_norm(v1::QK_NORM_NONE);
      break;
    case QkNorm::kRms:
      out.set_qk_norm(v1::QK_NORM_RMS);
      break;
    case QkNorm::kRmsUnitOffset:
      out.set_qk_norm(v1::QK_NORM_RMS_UNIT_OFFSET);
      break;
    case QkNorm::kRmsAcrossHeads:
      out.set_qk_norm(v1::QK_NORM_RMS_ACROSS_HEADS);
      break;
  }
  out.set_qk_norm_eps(spec.qk_norm_eps);
  out.set_attn_logit_softcapping(spec.attn_logit_softcapping);
  out.set_attention_sinks(spec.attention_sinks);
  out.set_alibi(spec.alibi == Alibi::kBloom ? v1::ALIBI_BLOOM
                : spec.alibi == Alibi::kMpt ? v1::ALIBI_MPT
                                            : v1::ALIBI_NONE);
  // Only with ALiBi: a spec without it serializes as before, so its fingerprint is unchanged.
  if (spec.alibi != Alibi::kNone) out.set_alibi_bias_max(spec.alibi_bias_max);
  if (spec.variant == AttentionVariant::kMLA) {
    v1::MlaDims* mla = out.mutable_mla();
    mla->set_q_lora_rank(spec.mla.q_lora_rank);
    mla->set_kv_lora_rank(spec.mla.kv_lora_rank);
    mla->set_qk_nope_head_dim(spec.mla.qk_nope_head_dim);
    mla->set_qk_rope_head_dim(spec.mla.qk_rope_head_dim);
    mla->set_v_head_dim(spec.mla.v_head_dim);
    mla->set_rms_norm_eps(spec.mla.rms_norm_eps);
  }
  return out;
}

}  // namespace attnserve
