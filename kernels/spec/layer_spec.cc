#include "kernels/spec/layer_spec.h"

#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/spec/spec_field.h"

namespace attnserve {

absl::string_view VariantName(AttentionVariant variant) {
  switch (variant) {
    case AttentionVariant::kMHA:
      return "mha";
    case AttentionVariant::kMQA:
      return "mqa";
    case AttentionVariant::kGQA:
      return "gqa";
    case AttentionVariant::kMLA:
      return "mla";
  }
  return "unknown";
}

absl::StatusOr<AttentionVariant> ParseVariant(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "mha") return AttentionVariant::kMHA;
  if (lower == "mqa") return AttentionVariant::kMQA;
  if (lower == "gqa") return AttentionVariant::kGQA;
  if (lower == "mla") return AttentionVariant::kMLA;
  return absl::InvalidArgumentError(
      absl::StrCat("variant: unknown '", name, "', expected mha, mqa, gqa or mla"));
}

absl::string_view RopeLayoutName(RopeLayout layout) {
  switch (layout) {
    case RopeLayout::kNone:
      return "none";
    case RopeLayout::kHalf:
      return "half";
    case RopeLayout::kInterleaved:
      return "interleaved";
  }
  return "unknown";
}

absl::StatusOr<RopeLayout> ParseRopeLayout(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "none" || lower.empty()) return RopeLayout::kNone;
  if (lower == "half" || lower == "llama") return RopeLayout::kHalf;
  if (lower == "interleaved" || lower == "deepseek") return RopeLayout::kInterleaved;
  return absl::InvalidArgumentError(
      absl::StrCat("rope: unknown layout '", name, "', expected none, half or interleaved"));
}

absl::string_view RopeScalingTypeName(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kDynamic:
      return "dynamic";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "unknown";
}

absl::StatusOr<RopeScalingType> ParseRopeScalingType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  // "default" is transformers' rope_type for no scaling.
  if (lower == "none" || lower == "default" || lower.empty()) return RopeScalingType::kNone;
  if (lower == "linear") return RopeScalingType::kLinear;
  if (lower == "dynamic") return RopeScalingType::kDynamic;
  if (lower == "llama3") return RopeScalingType::kLlama3;
  if (lower == "yarn") return RopeScalingType::kYarn;
  if (lower == "longrope" || lower == "su") {
    // _compute_longrope_parameters picks long_factor or short_factor by the current sequence
    // length against original_max_position_embeddings (Phi-3 128k/Phi-3.5/Phi-4-mini): like dynamic
    // NTK, the frequencies would depend on how a sequence was split into calls.
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling.type = ", name,
        " is not implemented (LongRoPE switches between long and short factors by sequence length, "
        "so cached keys would keep frequencies the next call no longer uses)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rope_scaling.type: unknown '", name, "', expected none, linear, dynamic, llama3 or yarn"));
}

absl::string_view QkNormName(QkNorm norm) {
  switch (norm) {
    case QkNorm::kNone:
      return "none";
    case QkNorm::kRms:
      return "rms";
    case QkNorm::kRmsUnitOffset:
      return "rms_unit_offset";
    case QkNorm::kRmsAcrossHeads:
      return "rms_across_heads";
    case QkNorm::kLayerNorm:
      return "layer_norm";
  }
  return "unknown";
}

absl::StatusOr<QkNorm> ParseQkNorm(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "none" || lower.empty()) return QkNorm::kNone;
  if (lower == "rms") return QkNorm::kRms;
  if (lower == "rms_unit_offset") return QkNorm::kRmsUnitOffset;
  if (lower == "rms_across_heads") return QkNorm::kRmsAcrossHeads;
  if (lower == "layer_norm") return QkNorm::kLayerNorm;
  return absl::InvalidArgumentError(
      absl::StrCat("qk_norm: unknown '", name,
                   "', expected none, rms, rms_unit_offset, rms_across_heads or layer_norm"));
}

absl::string_view AlibiName(Alibi alibi) {
  switch (alibi) {
    case Alibi::kNone:
      return "none";
    case Alibi::kBloom:
      return "bloom";
    case Alibi::kMpt:
      return "mpt";
  }
  return "unknown";
}

absl::StatusOr<Alibi> ParseAlibi(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "none" || lower.empty()) return Alibi::kNone;
  if (lower == "bloom") return Alibi::kBloom;
  if (lower == "mpt") return Alibi::kMpt;
  return absl::InvalidArgumentError(
      absl::StrCat("alibi: unknown '", name, "', expected none, bloom or mpt"));
}

double YarnMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

namespace {

// Upper bounds that keep every size product far inside int64 and catch unit mistakes early.
constexpr int kMaxDim = 1 << 16;
constexpr int kMaxHeads = 1024;

absl::Status Invalid(absl::string_view field, absl::string_view rule, int64_t value) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", rule));
}

absl::Status CheckRange(absl::string_view field, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return Invalid(field, absl::StrCat("must be in [", lo, ", ", hi, "]"), value);
  }
  return absl::OkStatus();
}

absl::Status ValidateMla(const LayerSpec& spec) {
  const MlaDims& mla = spec.mla;
  if (absl::Status s = CheckRange("mla.q_lora_rank", mla.q_lora_rank, 0, kMaxDim); !s.ok())
    return s;
  if (absl::Status s = CheckRange("mla.kv_lora_rank", mla.kv_lora_rank, 1, kMaxDim); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("mla.qk_nope_head_dim", mla.qk_nope_head_dim, 1, kMaxDim);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("mla.qk_rope_head_dim", mla.qk_rope_head_dim, 0, kMaxDim);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRange("mla.v_head_dim", mla.v_head_dim, 1, kMaxDim); !s.ok()) return s;
  if (spec.rope != RopeLayout::kNone && (mla.qk_rope_head_dim == 0 || mla.qk_rope_head_dim % 2)) {
    return Invalid("mla.qk_rope_head_dim", "must be even and positive when rope is enabled",
                   mla.qk_rope_head_dim);
  }
  if (!(mla.rms_norm_eps > 0.0f) || !std::isfinite(mla.rms_norm_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla.rms_norm_eps = ", mla.rms_norm_eps, ": must be finite and > 0"));
  }
  if (spec.qkv_bias || spec.o_bias) {
    return absl::InvalidArgumentError(
        "qkv_bias/o_bias: biases are not supported for MLA (DeepSeek-V2/V3 use "
        "attention_bias=False)");
  }
  return absl::OkStatus();
}

absl::Status InvalidReal(absl::string_view field, double value, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat(field, " = ", value, ": ", rule));
}

// Upper bound of every RoPE scaling parameter (factors, YaRN's betas and mscales). Published models
// use factors up to 64 and the rest in single or double digits; a value like 1e300 is a typo or an
// attack, and inverse frequencies, ramps and log-scales computed from it stop being meaningful.
constexpr double kMaxRopeScalingParameter = 1024.0;

// `value` finite and in [low, kMaxRopeScalingParameter], or (low, ...] when `low_open`.
absl::Status CheckRopeScalingParameter(absl::string_view field, double value, double low,
                                       bool low_open, absl::string_view low_text = "") {
  const bool above_low = low_open ? value > low : value >= low;
  if (std::isfinite(value) && above_low && value <= kMaxRopeScalingParameter) {
    return absl::OkStatus();
  }
  return InvalidReal(field, value,
                     absl::StrCat("must be finite and in ", low_open ? "(" : "[",
                                  low_text.empty() ? absl::StrCat(low) : std::string(low_text),
                                  ", ", kMaxRopeScalingParameter, "]"));
}

absl::Status ValidateRopeScaling(const LayerSpec& spec) {
  const RopeScaling& r = spec.rope_scaling;
  if (r.type == RopeScalingType::kNone) return absl::OkStatus();
  const std::string type = absl::StrCat("rope_scaling.type = ", RopeScalingTypeName(r.type));
  if (r.type == RopeScalingType::kDynamic) {
    // transformers recomputes dynamic NTK frequencies from the longest position of each forward
    // call (dynamic_rope_update), while keys already cached keep the frequencies they were rotated
    // with: the output depends on how a sequence was split into prefill and decode calls, which no
    // per-position rule here can reproduce.
    return absl::InvalidArgumentError(absl::StrCat(type, " is not implemented"));
  }
  if (spec.rope == RopeLayout::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(type, ": requires rope = half or interleaved"));
  }
  if (absl::Status s = CheckRopeScalingParameter("rope_scaling.factor", r.factor, 1.0, false);
      !s.ok()) {
    return s;
  }
  if (r.type != RopeScalingType::kYarn && !r.truncate) {
    return absl::InvalidArgumentError(
        absl::StrCat(type, ": truncate = false applies to yarn only"));
  }
  if (r.type == RopeScalingType::kLinear) return absl::OkStatus();
  if (absl::Status s = CheckRange("rope_scaling.original_max_position_embeddings",
                                  r.original_max_position_embeddings, 1,
                                  std::numeric_limits<int>::max());
      !s.ok()) {
    return s;
  }
  if (r.type == RopeScalingType::kLlama3) {
    if (absl::Status s = CheckRopeScalingParameter("rope_scaling.low_freq_factor",
                                                   r.low_freq_factor, 0.0, true);
        !s.ok()) {
      return s;
    }
    return CheckRopeScalingParameter(
        "rope_scaling.high_freq_factor", r.high_freq_factor, r.low_freq_factor, true,
        absl::StrCat("low_freq_factor = ", r.low_freq_factor));
  }
  // YaRN.
  if (absl::Status s =
          CheckRopeScalingParameter("rope_scaling.beta_fast", r.beta_fast, 0.0, true);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckRopeScalingParameter("rope_scaling.beta_slow", r.beta_slow, 0.0, true);
      !s.ok()) {
    return s;
  }
  // 0 = absent.
  if (absl::Status s = CheckRopeScalingParameter("rope_scaling.mscale", r.mscale, 0.0, false);
      !s.ok()) {
    return s;
  }
  return CheckRopeScalingParameter("rope_scaling.mscale_all_dim", r.mscale_all_dim, 0.0,
                                   false);  // truncate: either value.
}

// rotary_dim, qk_norm, attn_logit_softcapping, attention_sinks and alibi (Qwen3, Gemma 2/3,
// gpt-oss, Phi-3, BLOOM, MPT). MLA layers have none of them (DeepseekV3Attention), so a set one is refused there.
absl::Status ValidateAttentionVariations(const LayerSpec& spec) {
  if (!std::isfinite(spec.qk_norm_eps) || !(spec.qk_norm_eps > 0.0f)) {
    return InvalidReal("qk_norm_eps", spec.qk_norm_eps, "must be finite and > 0");
  }
  if (!std::isfinite(spec.attn_logit_softcapping) || spec.attn_logit_softcapping < 0.0f) {
    return InvalidReal("attn_logit_softcapping", spec.attn_logit_softcapping,
                       "must be finite and >= 0 (0 = no soft-capping)");
  }
  if (!std::isfinite(spec.alibi_bias_max) || !(spec.alibi_bias_max > 0.0f)) {
    return InvalidReal("alibi_bias_max", spec.alibi_bias_max, "must be finite and > 0");
  }
  if (spec.variant == AttentionVariant::kMLA) {
    const absl::string_view mla_has_none =
        "is not supported for MLA (DeepSeek-V2/V3 attention has no such feature)";
    if (spec.rotary_dim != 0) {
      return Invalid("rotary_dim",
                     absl::StrCat(mla_has_none, "; MLA's rotated width is mla.qk_rope_head_dim"),
                     spec.rotary_dim);
    }
    if (spec.qk_norm != QkNorm::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("qk_norm = ", QkNormName(spec.qk_norm), ": ", mla_has_none));
    }
    if (spec.attn_logit_softcapping != 0.0f) {
      return InvalidReal("attn_logit_softcapping", spec.attn_logit_softcapping, mla_has_none);
    }
    if (spec.attention_sinks) {
      return absl::InvalidArgumentError(absl::StrCat("attention_sinks = true: ", mla_has_none));
    }
    if (spec.alibi != Alibi::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat("alibi = ", AlibiName(spec.alibi), ": ", mla_has_none));
    }
    return absl::OkStatus();
  }
  if (spec.rotary_dim != 0) {
    if (spec.rope == RopeLayout::kNone) {
      return Invalid("rotary_dim", "requires rope = half or interleaved (0 without RoPE)",
                     spec.rotary_dim);
    }
    if (spec.rotary_dim < 0 || spec.rotary_dim % 2 != 0 || spec.rotary_dim > spec.head_dim) {
      return Invalid("rotary_dim",
                     absl::StrCat("must be 0 (the whole head) or even and in [2, head_dim = ",
                                  spec.head_dim, "]"),
                     spec.rotary_dim);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Span<const SpecField> LayerSpecFields() {
  using S = LayerSpec;
  static constexpr SpecField kFields[] = {
      {"variant", 1, EnumByName<&S::variant, VariantName, ParseVariant>()},
      {"d_model", 2, &S::d_model},
      {"num_heads", 3, &S::num_heads},
      {"num_kv_heads", 4, &S::num_kv_heads},
      {"head_dim", 5, &S::head_dim},
      {"qkv_bias", 6, &S::qkv_bias},
      {"o_bias", 7, &S::o_bias},
      {"rope", 8, EnumByName<&S::rope, RopeLayoutName, ParseRopeLayout>()},
      {"rope_theta", 9, &S::rope_theta, /*wire_zero_is_default=*/true},
      {"rope_scaling", 14, &S::rope_scaling},
      {"causal", 10, &S::causal},
      {"sliding_window", 11, &S::sliding_window},
      {"softmax_scale", 12, &S::softmax_scale},
      {"rotary_dim", 15, &S::rotary_dim},
      {"qk_norm", 16, EnumByName<&S::qk_norm, QkNormName, ParseQkNorm>()},
      {"qk_norm_eps", 17, &S::qk_norm_eps, /*wire_zero_is_default=*/true},
      {"attn_logit_softcapping", 18, &S::attn_logit_softcapping},
      {"attention_sinks", 19, &S::attention_sinks},
      {"alibi", 20, EnumByName<&S::alibi, AlibiName, ParseAlibi>()},
      {"alibi_bias_max", 21, &S::alibi_bias_max, /*wire_zero_is_default=*/true,
       /*on_wire_when=*/[](const S& spec) { return spec.alibi != Alibi::kNone; }},
      {"mla", 13, &S::mla},
  };
  return kFields;
}

absl::Status ValidateLayerSpec(const LayerSpec& spec) {
  if (absl::Status s = CheckRange("d_model", spec.d_model, 1, kMaxDim); !s.ok()) return s;
  if (absl::Status s = CheckRange("num_heads", spec.num_heads, 1, kMaxHeads); !s.ok()) return s;
  if (spec.variant == AttentionVariant::kMLA) {
    if (absl::Status s = ValidateMla(spec); !s.ok()) return s;
  } else {
    if (absl::Status s = CheckRange("head_dim", spec.head_dim, 1, kMaxDim); !s.ok()) return s;
    if (absl::Status s = CheckRange("num_kv_heads", spec.num_kv_heads, 1, spec.num_heads);
        !s.ok()) {
      return s;
    }
    if (spec.num_heads % spec.num_kv_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("num_kv_heads = ", spec.num_kv_heads,
                                                     ": must divide num_heads = ", spec.num_heads));
    }
    if (spec.variant == AttentionVariant::kMHA && spec.num_kv_heads != spec.num_heads) {
      return absl::InvalidArgumentError(absl::StrCat("num_kv_heads = ", spec.num_kv_heads,
                                                     ": variant mha requires num_kv_heads == "
                                                     "num_heads = ",
                                                     spec.num_heads));
    }
    if (spec.variant == AttentionVariant::kMQA && spec.num_kv_heads != 1) {
      return Invalid("num_kv_heads", "variant mqa requires num_kv_heads == 1", spec.num_kv_heads);
    }
    if (spec.rope != RopeLayout::kNone && spec.head_dim % 2 != 0) {
      return Invalid("head_dim", "must be even when rope is enabled", spec.head_dim);
    }
  }
  // Checked even without RoPE, where it is unused: NaN and infinity have no JSON form, and the
  // wire reads 0 as "the default 10000", so a spec file and the wire could not carry such a spec
  // unchanged (layer_spec_json.h, spec_codec.h).
  if (!std::isfinite(spec.rope_theta) || !(spec.rope_theta > 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_theta = ", spec.rope_theta, ": must be finite and > 1"));
  }
  if (absl::Status s = ValidateRopeScaling(spec); !s.ok()) return s;
  if (spec.sliding_window < 0) {
    return Invalid("sliding_window", "must be >= 0 (0 = full attention)", spec.sliding_window);
  }
  if (spec.sliding_window > 0 && !spec.causal) {
    return Invalid("sliding_window", "requires causal = true (Mistral semantics)",
                   spec.sliding_window);
  }
  if (spec.softmax_scale < 0.0f || !std::isfinite(spec.softmax_scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax_scale = ", spec.softmax_scale,
                     ": must be finite and >= 0 (0 = 1/sqrt(head dim))"));
  }
  return ValidateAttentionVariations(spec);
}

int QkHeadDim(const LayerSpec& spec) {
  return spec.variant == AttentionVariant::kMLA
             ? spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim
             : spec.head_dim;
}

int VHeadDim(const LayerSpec& spec) {
  return spec.variant == AttentionVariant::kMLA ? spec.mla.v_head_dim : spec.head_dim;
}

int RotaryDim(const LayerSpec& spec) {
  if (spec.rope == RopeLayout::kNone) return 0;
  if (spec.variant == AttentionVariant::kMLA) return spec.mla.qk_rope_head_dim;
  return spec.rotary_dim != 0 ? spec.rotary_dim : spec.head_dim;
}

int64_t QkNormWidth(const LayerSpec& spec, int heads) {
  if (spec.qk_norm == QkNorm::kNone) return 0;
  const bool scale_per_head =
      spec.qk_norm == QkNorm::kRmsAcrossHeads || spec.qk_norm == QkNorm::kLayerNorm;
  return scale_per_head ? int64_t{heads} * spec.head_dim : spec.head_dim;
}

float EffectiveSoftmaxScale(const LayerSpec& spec) {
  if (spec.softmax_scale > 0.0f) return spec.softmax_scale;
  double scale = 1.0 / std::sqrt(static_cast<double>(QkHeadDim(spec)));
  const RopeScaling& r = spec.rope_scaling;
  if (spec.variant == AttentionVariant::kMLA && r.type == RopeScalingType::kYarn &&
      r.mscale_all_dim != 0.0) {
    const double mscale = YarnMscale(r.factor, r.mscale_all_dim);  // DeepseekV3Attention.__init__
    scale *= mscale * mscale;
  }
  return static_cast<float>(scale);
}

int64_t KvScalarsPerToken(const LayerSpec& spec) {
  if (spec.variant == AttentionVariant::kMLA) {
    return int64_t{spec.mla.kv_lora_rank} + spec.mla.qk_rope_head_dim;
  }
  return 2 * int64_t{spec.num_kv_heads} * spec.head_dim;
}

int64_t ParameterCount(const LayerSpec& spec) {
  const int64_t d = spec.d_model;
  const int64_t h = spec.num_heads;
  if (spec.variant == AttentionVariant::kMLA) {
    const MlaDims& m = spec.mla;
    const int64_t qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const int64_t q_params =
        m.q_lora_rank == 0 ? h * qk * d : int64_t{m.q_lora_rank} * (d + 1 + h * qk);
    const int64_t kv_params = (int64_t{m.kv_lora_rank} + m.qk_rope_head_dim) * d + m.kv_lora_rank +
                              h * (m.qk_nope_head_dim + m.v_head_dim) * int64_t{m.kv_lora_rank};
    return q_params + kv_params + d * h * m.v_head_dim;
  }
  const int64_t q = h * spec.head_dim;
  const int64_t kv = int64_t{spec.num_kv_heads} * spec.head_dim;
  int64_t params = d * q + 2 * d * kv + q * d;
  if (spec.qkv_bias) params += q + 2 * kv;
  if (spec.o_bias) params += d;
  params += QkNormWidth(spec, spec.num_heads) + QkNormWidth(spec, spec.num_kv_heads);
  if (spec.attention_sinks) params += h;
  return params;
}

int DefaultPageSize(const LayerSpec& spec) {
  return spec.variant == AttentionVariant::kMLA ? 64 : 16;
}

std::string LayerSpecSummary(const LayerSpec& spec) {
  std::string out =
      absl::StrCat(VariantName(spec.variant), " d_model=", spec.d_model, " heads=", spec.num_heads);
  if (spec.variant == AttentionVariant::kMLA) {
    absl::StrAppend(&out, " q_lora=", spec.mla.q_lora_rank, " kv_lora=", spec.mla.kv_lora_rank,
                    " nope=", spec.mla.qk_nope_head_dim, " rope=", spec.mla.qk_rope_head_dim,
                    " v=", spec.mla.v_head_dim);
  } else {
    absl::StrAppend(&out, " kv_heads=", spec.num_kv_heads, " head_dim=", spec.head_dim);
  }
  absl::StrAppend(&out, " rope=", RopeLayoutName(spec.rope));
  if (spec.rotary_dim != 0) absl::StrAppend(&out, " rotary_dim=", spec.rotary_dim);
  if (spec.rope_scaling.type != RopeScalingType::kNone) {
    absl::StrAppend(&out, " rope_scaling=", RopeScalingTypeName(spec.rope_scaling.type), "x",
                    spec.rope_scaling.factor);
  }
  absl::StrAppend(&out, spec.causal ? " causal" : " bidir");
  if (spec.sliding_window > 0) absl::StrAppend(&out, " window=", spec.sliding_window);
  if (spec.qk_norm != QkNorm::kNone) absl::StrAppend(&out, " qk_norm=", QkNormName(spec.qk_norm));
  if (spec.attn_logit_softcapping != 0.0f) {
    absl::StrAppend(&out, " softcap=", spec.attn_logit_softcapping);
  }
  if (spec.attention_sinks) absl::StrAppend(&out, " sinks");
  if (spec.alibi != Alibi::kNone) absl::StrAppend(&out, " alibi=", AlibiName(spec.alibi));
  return out;
}

}  // namespace attnserve
