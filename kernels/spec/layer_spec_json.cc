#include "kernels/spec/layer_spec_json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/base/overloaded.h"
#include "kernels/spec/spec_field.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

using Json = nlohmann::json;

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

// The known keys as an unknown key's message lists them: in the proto's field order.
std::vector<absl::string_view> TopLevelKeys() {
  std::vector<const SpecField*> fields;
  for (const SpecField& field : LayerSpecFields()) fields.push_back(&field);
  std::sort(fields.begin(), fields.end(), [](const SpecField* a, const SpecField* b) {
    return a->proto_number < b->proto_number;
  });
  std::vector<absl::string_view> keys;
  for (const SpecField* field : fields) keys.push_back(field->name);
  return keys;
}

// The keys a file must give: variant, d_model, num_heads, and num_kv_heads for gqa.
bool Required(absl::string_view key, const LayerSpec& spec) {
  return key == "variant" || key == "d_model" || key == "num_heads" ||
         (key == "num_kv_heads" && spec.variant == AttentionVariant::kGQA);
}

// The defaults of attnctl's flags and the Python client's LayerSpec where they differ from
// LayerSpec{}, set just before the key is read: num_kv_heads = num_heads (mha) or 1 (mqa),
// head_dim = d_model / num_heads, RoPE "half".
void SetFileDefault(absl::string_view key, LayerSpec& spec) {
  const AttentionVariant variant = spec.variant;
  if (key == "num_kv_heads" && variant == AttentionVariant::kMHA) {
    spec.num_kv_heads = spec.num_heads;
  }
  if (key == "num_kv_heads" && variant == AttentionVariant::kMQA) spec.num_kv_heads = 1;
  if (key == "head_dim" && variant != AttentionVariant::kMLA && spec.num_heads > 0) {
    spec.head_dim = spec.d_model / spec.num_heads;
  }
  if (key == "rope") spec.rope = RopeLayout::kHalf;
}


absl::Status ReadField(const Json& root, const FieldReader& r, const SpecField& field,
                       LayerSpec& spec) {
  const absl::string_view key = field.name;
  const bool required = Required(key, spec);
  return std::visit(
      Overloaded{
          [&](int LayerSpec::*member) { return r.Int(key, required, &(spec.*member)); },
          [&](float LayerSpec::*member) { return r.Float(key, required, &(spec.*member)); },
          [&](double LayerSpec::*member) { return r.Double(key, required, &(spec.*member)); },
          [&](bool LayerSpec::*member) { return r.Bool(key, required, &(spec.*member)); },
          [&](const EnumMember& member) {
            std::string text;
            bool present = false;
            if (absl::Status s = r.String(key, required, &text, &present); !s.ok() || !present) {
              return s;
            }
            absl::StatusOr<int> value = member.parse(text);
            if (!value.ok()) return value.status();  // Already names the key.
            member.set(spec, *value);
            return absl::OkStatus();
          },
          [&](RopeScaling LayerSpec::*member) {
            const auto scaling = root.find(std::string(key));
            if (scaling == root.end()) return absl::OkStatus();
            return ReadRopeScaling(*scaling, &(spec.*member));
          },
          [&](MlaDims LayerSpec::*member) {
            const auto mla = root.find("mla");
            if (spec.variant == AttentionVariant::kMLA) {
              if (mla == root.end()) {
                return absl::InvalidArgumentError("mla: missing required key for variant mla");
              }
              return ReadMla(*mla, &(spec.*member));
            }
            if (mla != root.end()) {
              return absl::InvalidArgumentError(absl::StrCat(
                  "mla: only allowed with variant mla, not ", VariantName(spec.variant)));
            }
            return absl::OkStatus();
          },
      },
      field.member);
}

void WriteField(const SpecField& field, const LayerSpec& spec, nlohmann::ordered_json& out) {
  const std::string key(field.name);
  std::visit(
      Overloaded{
          [&](int LayerSpec::*member) { out[key] = spec.*member; },
          [&](float LayerSpec::*member) { out[key] = FloatForJson(spec.*member); },
          [&](double LayerSpec::*member) { out[key] = spec.*member; },
          [&](bool LayerSpec::*member) { out[key] = spec.*member; },
          [&](const EnumMember& member) { out[key] = std::string(member.name(member.get(spec))); },
          [&](RopeScaling LayerSpec::*member) {
            const RopeScaling& r = spec.*member;
            if (r.type == RopeScalingType::kNone) return;
            nlohmann::ordered_json& scaling = out[key];
            for (absl::string_view scaling_key : RopeScalingKeys(r.type)) {
              const std::string name(scaling_key);
              if (name == "type") scaling[name] = std::string(RopeScalingTypeName(r.type));
              if (name == "factor") scaling[name] = r.factor;
              if (name == "original_max_position_embeddings") {
                scaling[name] = r.original_max_position_embeddings;
              }
              if (name == "low_freq_factor") scaling[name] = r.low_freq_factor;
              if (name == "high_freq_factor") scaling[name] = r.high_freq_factor;
              if (name == "beta_fast") scaling[name] = r.beta_fast;
              if (name == "beta_slow") scaling[name] = r.beta_slow;
              if (name == "mscale") scaling[name] = r.mscale;
              if (name == "mscale_all_dim") scaling[name] = r.mscale_all_dim;
              if (name == "truncate") scaling[name] = r.truncate;
            }
          },
          [&](MlaDims LayerSpec::*member) {
            if (spec.variant != AttentionVariant::kMLA) return;
            const MlaDims& dims = spec.*member;
            nlohmann::ordered_json& mla = out[key];
            mla["q_lora_rank"] = dims.q_lora_rank;
            mla["kv_lora_rank"] = dims.kv_lora_rank;
            mla["qk_nope_head_dim"] = dims.qk_nope_head_dim;
            mla["qk_rope_head_dim"] = dims.qk_rope_head_dim;
            mla["v_head_dim"] = dims.v_head_dim;
            mla["rms_norm_eps"] = FloatForJson(dims.rms_norm_eps);
          },
      },
      field.member);
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
  if (absl::Status s = CheckKeys(root, TopLevelKeys(), ""); !s.ok()) return s;

  LayerSpec spec;
  const FieldReader r(root, "");
  for (const SpecField& field : LayerSpecFields()) {
    SetFileDefault(field.name, spec);
    if (absl::Status s = ReadField(root, r, field, spec); !s.ok()) return s;
  }

  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) return s;
  return spec;
}

std::string LayerSpecToJson(const LayerSpec& spec) {
  nlohmann::ordered_json out;
  for (const SpecField& field : LayerSpecFields()) WriteField(field, spec, out);
  return out.dump(2) + "\n";
}

}  // namespace attnserve
