#include "kernels/spec/layer_spec_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kTopLevelKeys[] = {
    "variant", "d_model",    "num_heads", "num_kv_heads",   "head_dim",      "qkv_bias", "o_bias",
    "rope",    "rope_theta", "causal",    "sliding_window", "softmax_scale", "mla",
    "rope_scaling", "rotary_dim", "qk_norm", "qk_norm_eps", "attn_logit_softcapping",
    "attention_sinks", "alibi", "alibi_bias_max"};
constexpr absl::string_view kMlaKeys[] = {"q_lora_rank",      "kv_lora_rank", "qk_nope_head_dim",
                                          "qk_rope_head_dim", "v_head_dim",   "rms_norm_eps"};

// Records the first syntax error of a SAX parse, so a malformed file gets nlohmann's message
// (with its byte position) without enabling exceptions on the DOM parse.
class SyntaxErrorCapture : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    message = e.what();
    return false;
  }

  std::string message;
};

absl::string_view JsonTypeName(const Json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number_float()) return "number";
  return value.type_name();
}

absl::Status WrongType(absl::string_view key, absl::string_view expected, const Json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": expected ", expected, ", got ", JsonTypeName(value), " ", value.dump()));
}

absl::Status CheckKeys(const Json& object, absl::Span<const absl::string_view> known,
                       absl::string_view prefix) {
  for (const auto& [key, value] : object.items()) {
    bool found = false;
    for (absl::string_view k : known) found = found || k == key;
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, key, ": unknown key (known keys: ", absl::StrJoin(known, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Reads object[key] into *out when present; `name` is the key's full dotted name for messages.
// A missing key leaves *out unchanged, or is an error when `required`.
class FieldReader {
 public:
  FieldReader(const Json& object, absl::string_view prefix) : object_(object), prefix_(prefix) {}

  absl::Status Int(absl::string_view key, bool required, int* out) const {
    const Json* value;
    if (absl::Status s = Find(key, required, &value); !s.ok() || value == nullptr) return s;
    if (!value->is_number_integer()) return WrongType(Name(key), "an integer", *value);
    // Range check in the wider type first: an unsigned value above INT64_MAX stays unsigned.
    if (value->is_number_unsigned()
            ? value->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())
            : (value->get<int64_t>() < std::numeric_limits<int>::min() ||
               value->get<int64_t>() > std::numeric_limits<int>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(key), ": ", value->dump(), " does not fit in a 32-bit int"));
    }
    *out = static_cast<int>(value->get<int64_t>());
    return absl::OkStatus();
  }

  absl::Status Double(absl::string_view key, bool required, double* out) const {
    const Json* value;
    if (absl::Status s = Find(key, required, &value); !s.ok() || value == nullptr) return s;
    if (!value->is_number()) return WrongType(Name(key), "a number", *value);
    *out = value->get<double>();
    return absl::OkStatus();
  }

  absl::Status Float(absl::string_view key, bool required, float* out) const {
    double wide = *out;
    if (absl::Status s = Double(key, required, &wide); !s.ok()) return s;
    if (std::abs(wide) > std::numeric_limits<float>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(key), ": ", wide, " is out of float range"));
    }
    *out = static_cast<float>(wide);
    return absl::OkStatus();
  }

  absl::Status Bool(absl::string_view key, bool required, bool* out) const {
    const Json* value;
    if (absl::Status s = Find(key, required, &value); !s.ok() || value == nullptr) return s;
    if (!value->is_boolean()) return WrongType(Name(key), "true or false", *value);
    *out = value->get<bool>();
    return absl::OkStatus();
  }

  // *out is untouched (and `*present` false) when the key is absent and not required.
  absl::Status String(absl::string_view key, bool required, std::string* out, bool* present) const {
    const Json* value;
    *present = false;
    if (absl::Status s = Find(key, required, &value); !s.ok() || value == nullptr) return s;
    if (!value->is_string()) return WrongType(Name(key), "a string", *value);
    *out = value->get<std::string>();
    *present = true;
    return absl::OkStatus();
  }

  std::string Name(absl::string_view key) const { return absl::StrCat(prefix_, key); }

 private:
  absl::Status Find(absl::string_view key, bool required, const Json** value) const {
    auto it = object_.find(std::string(key));
    if (it == object_.end()) {
      *value = nullptr;
      if (required) {
        return absl::InvalidArgumentError(absl::StrCat(Name(key), ": missing required key"));
      }
      return absl::OkStatus();
    }
    *value = &*it;
    return absl::OkStatus();
  }

  const Json& object_;
  std::string prefix_;
};

absl::Status ReadMla(const Json& object, MlaDims* mla) {
  if (!object.is_object()) return WrongType("mla", "an object", object);
  if (absl::Status s = CheckKeys(object, kMlaKeys, "mla."); !s.ok()) return s;
  const FieldReader r(object, "mla.");
  if (absl::Status s = r.Int("q_lora_rank", false, &mla->q_lora_rank); !s.ok()) return s;
  if (absl::Status s = r.Int("kv_lora_rank", true, &mla->kv_lora_rank); !s.ok()) return s;
  if (absl::Status s = r.Int("qk_nope_head_dim", true, &mla->qk_nope_head_dim); !s.ok()) return s;
  if (absl::Status s = r.Int("qk_rope_head_dim", true, &mla->qk_rope_head_dim); !s.ok()) return s;
  if (absl::Status s = r.Int("v_head_dim", true, &mla->v_head_dim); !s.ok()) return s;
  return r.Float("rms_norm_eps", false, &mla->rms_norm_eps);
}

// The keys each rope_scaling type reads; a key of another type is an error rather than ignored,
// so every accepted document is written back unchanged.
std::vector<absl::string_view> RopeScalingKeys(RopeScalingType type) {
  switch (type) {
    case RopeScalingType::kNone:
      return {"type"};
    case RopeScalingType::kLinear:
    case RopeScalingType::kDynamic:
      return {"type", "factor"};
    case RopeScalingType::kLlama3:
      return {"type", "factor", "original_max_position_embeddings", "low_freq_factor",
              "high_freq_factor"};
    case RopeScalingType::kYarn:
      return {"type",      "factor",    "original_max_position_embeddings",
              "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "truncate"};
  }
  return {"type"};
}

absl::Status ReadRopeScaling(const Json& object, RopeScaling* scaling) {
  if (!object.is_object()) return WrongType("rope_scaling", "an object", object);
  const FieldReader r(object, "rope_scaling.");
  std::string text;
  bool present = false;
  if (absl::Status s = r.String("type", true, &text, &present); !s.ok()) return s;
  absl::StatusOr<RopeScalingType> type = ParseRopeScalingType(text);
  if (!type.ok()) return type.status();  // Already names "rope_scaling.type".
  scaling->type = *type;
  const std::vector<absl::string_view> keys = RopeScalingKeys(*type);
  if (absl::Status s = CheckKeys(object, keys, "rope_scaling."); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " for type ", RopeScalingTypeName(*type)));
  }
  const auto wants = [&keys](absl::string_view key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  if (wants("factor")) {
    if (absl::Status s = r.Double("factor", false, &scaling->factor); !s.ok()) return s;
  }
  if (wants("original_max_position_embeddings")) {
    if (absl::Status s = r.Int("original_max_position_embeddings", true,
                               &scaling->original_max_position_embeddings);
        !s.ok()) {
      return s;
    }
  }
  if (wants("low_freq_factor")) {
    if (absl::Status s = r.Double("low_freq_factor", false, &scaling->low_freq_factor); !s.ok()) {
      return s;
    }
    if (absl::Status s = r.Double("high_freq_factor", false, &scaling->high_freq_factor);
        !s.ok()) {
      return s;
    }
  }
  if (wants("beta_fast")) {
    if (absl::Status s = r.Double("beta_fast", false, &scaling->beta_fast); !s.ok()) return s;
    if (absl::Status s = r.Double("beta_slow", false, &scaling->beta_slow); !s.ok()) return s;
    if (absl::Status s = r.Double("mscale", false, &scaling->mscale); !s.ok()) return s;
    if (absl::Status s = r.Double("mscale_all_dim", false, &scaling->mscale_all_dim); !s.ok()) {
      return s;
    }
    if (absl::Status s = r.Bool("truncate", false, &scaling->truncate); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The shortest decimal that reads back as `value` when parsed as a double and narrowed to float,
// as a double (so 1e-6f prints as 1e-06, not 9.999999974752427e-07).
double FloatForJson(float value) {
  char buffer[32];
  const std::to_chars_result printed = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double parsed = 0.0;
  if (printed.ec == std::errc() && std::from_chars(buffer, printed.ptr, parsed).ec == std::errc() &&
      static_cast<float>(parsed) == value) {
    return parsed;
  }
  return static_cast<double>(value);  // Exact, only less pretty.
}

}  // namespace

absl::StatusOr<LayerSpec> LayerSpecFromJson(absl::string_view json_text) {
  // absl::string_view is not std::string_view in this build; nlohmann wants iterators either way.
  const char* const begin = json_text.data();
  const char* const end = begin + json_text.size();
  const Json root = Json::parse(begin, end, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) {
    SyntaxErrorCapture capture;
    Json::sax_parse(begin, end, &capture);
    return absl::InvalidArgumentError(absl::StrCat(
        "layer spec: not valid JSON: ", capture.message.empty() ? "parse error" : capture.message));
  }
  if (!root.is_object()) return WrongType("layer spec", "a JSON object", root);
  if (absl::Status s = CheckKeys(root, kTopLevelKeys, ""); !s.ok()) return s;

  LayerSpec spec;
  const FieldReader r(root, "");
  std::string text;
  bool present = false;
  if (absl::Status s = r.String("variant", true, &text, &present); !s.ok()) return s;
  absl::StatusOr<AttentionVariant> variant = ParseVariant(text);
  if (!variant.ok()) return variant.status();  // Already names "variant".
  spec.variant = *variant;
  const bool is_mla = spec.variant == AttentionVariant::kMLA;

  if (absl::Status s = r.Int("d_model", true, &spec.d_model); !s.ok()) return s;
  if (absl::Status s = r.Int("num_heads", true, &spec.num_heads); !s.ok()) return s;
  // The defaults of attnctl's flags and the Python client's LayerSpec: num_kv_heads = num_heads
  // (mha) or 1 (mqa), required for gqa; head_dim = d_model / num_heads; RoPE "half".
  if (spec.variant == AttentionVariant::kMHA) spec.num_kv_heads = spec.num_heads;
  if (spec.variant == AttentionVariant::kMQA) spec.num_kv_heads = 1;
  const bool gqa = spec.variant == AttentionVariant::kGQA;
  if (absl::Status s = r.Int("num_kv_heads", gqa, &spec.num_kv_heads); !s.ok()) return s;
  if (!is_mla && spec.num_heads > 0) spec.head_dim = spec.d_model / spec.num_heads;
  if (absl::Status s = r.Int("head_dim", false, &spec.head_dim); !s.ok()) return s;
  if (absl::Status s = r.Bool("qkv_bias", false, &spec.qkv_bias); !s.ok()) return s;
  if (absl::Status s = r.Bool("o_bias", false, &spec.o_bias); !s.ok()) return s;
  spec.rope = RopeLayout::kHalf;
  if (absl::Status s = r.String("rope", false, &text, &present); !s.ok()) return s;
  if (present) {
    absl::StatusOr<RopeLayout> rope = ParseRopeLayout(text);
    if (!rope.ok()) return rope.status();  // Already names "rope".
    spec.rope = *rope;
  }
  if (absl::Status s = r.Double("rope_theta", false, &spec.rope_theta); !s.ok()) return s;
  if (const auto scaling = root.find("rope_scaling"); scaling != root.end()) {
    if (absl::Status s = ReadRopeScaling(*scaling, &spec.rope_scaling); !s.ok()) return s;
  }
  if (absl::Status s = r.Bool("causal", false, &spec.causal); !s.ok()) return s;
  if (absl::Status s = r.Int("sliding_window", false, &spec.sliding_window); !s.ok()) return s;
  if (absl::Status s = r.Float("softmax_scale", false, &spec.softmax_scale); !s.ok()) return s;
  if (absl::Status s = r.Int("rotary_dim", false, &spec.rotary_dim); !s.ok()) return s;
  if (absl::Status s = r.String("qk_norm", false, &text, &present); !s.ok()) return s;
  if (present) {
    absl::StatusOr<QkNorm> qk_norm = ParseQkNorm(text);
    if (!qk_norm.ok()) return qk_norm.status();  // Already names "qk_norm".
    spec.qk_norm = *qk_norm;
  }
  if (absl::Status s = r.Float("qk_norm_eps", false, &spec.qk_norm_eps); !s.ok()) return s;
  if (absl::Status s = r.Float("attn_logit_softcapping", false, &spec.attn_logit_softcapping);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = r.Bool("attention_sinks", false, &spec.attention_sinks); !s.ok()) return s;
  if (absl::Status s = r.String("alibi", false, &text, &present); !s.ok()) return s;
  if (present) {
    absl::StatusOr<Alibi> alibi = ParseAlibi(text);
    if (!alibi.ok()) return alibi.status();  // Already names "alibi".
    spec.alibi = *alibi;
  }
  if (absl::Status s = r.Float("alibi_bias_max", false, &spec.alibi_bias_max); !s.ok()) return s;

  const auto mla = root.find("mla");
  if (is_mla) {
    if (mla == root.end()) {
      return absl::InvalidArgumentError("mla: missing required key for variant mla");
    }
    if (absl::Status s = ReadMla(*mla, &spec.mla); !s.ok()) return s;
  } else if (mla != root.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mla: only allowed with variant mla, not ", VariantName(spec.variant)));
  }

  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) return s;
  return spec;
}

std::string LayerSpecToJson(const LayerSpec& spec) {
  nlohmann::ordered_json out;
  out["variant"] = std::string(VariantName(spec.variant));
  out["d_model"] = spec.d_model;
  out["num_heads"] = spec.num_heads;
  out["num_kv_heads"] = spec.num_kv_heads;
  out["head_dim"] = spec.head_dim;
  out["qkv_bias"] = spec.qkv_bias;
  out["o_bias"] = spec.o_bias;
  out["rope"] = std::string(RopeLayoutName(spec.rope));
  out["rope_theta"] = spec.rope_theta;
  if (spec.rope_scaling.type != RopeScalingType::kNone) {
    const RopeScaling& r = spec.rope_scaling;
    nlohmann::ordered_json& scaling = out["rope_scaling"];
    for (absl::string_view key : RopeScalingKeys(r.type)) {
      const std::string name(key);
      if (key == "type") scaling[name] = std::string(RopeScalingTypeName(r.type));
      if (key == "factor") scaling[name] = r.factor;
      if (key == "original_max_position_embeddings") {
        scaling[name] = r.original_max_position_embeddings;
      }
      if (key == "low_freq_factor") scaling[name] = r.low_freq_factor;
      if (key == "high_freq_factor") scaling[name] = r.high_freq_factor;
      if (key == "beta_fast") scaling[name] = r.beta_fast;
      if (key == "beta_slow") scaling[name] = r.beta_slow;
      if (key == "mscale") scaling[name] = r.mscale;
      if (key == "mscale_all_dim") scaling[name] = r.mscale_all_dim;
      if (key == "truncate") scaling[name] = r.truncate;
    }
  }
  out["causal"] = spec.causal;
  out["sliding_window"] = spec.sliding_window;
  out["softmax_scale"] = FloatForJson(spec.softmax_scale);
  out["rotary_dim"] = spec.rotary_dim;
  out["qk_norm"] = std::string(QkNormName(spec.qk_norm));
  out["qk_norm_eps"] = FloatForJson(spec.qk_norm_eps);
  out["attn_logit_softcapping"] = FloatForJson(spec.attn_logit_softcapping);
  out["attention_sinks"] = spec.attention_sinks;
  out["alibi"] = std::string(AlibiName(spec.alibi));
  out["alibi_bias_max"] = FloatForJson(spec.alibi_bias_max);
  if (spec.variant == AttentionVariant::kMLA) {
    nlohmann::ordered_json& mla = out["mla"];
    mla["q_lora_rank"] = spec.mla.q_lora_rank;
    mla["kv_lora_rank"] = spec.mla.kv_lora_rank;
    mla["qk_nope_head_dim"] = spec.mla.qk_nope_head_dim;
    mla["qk_rope_head_dim"] = spec.mla.qk_rope_head_dim;
    mla["v_head_dim"] = spec.mla.v_head_dim;
    mla["rms_norm_eps"] = FloatForJson(spec.mla.rms_norm_eps);
  }
  return out.dump(2) + "\n";
}

}  // namespace attnserve
