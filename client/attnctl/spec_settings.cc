#include "client/attnctl/spec_settings.h"

#include <set>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "kernels/base/overloaded.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/spec/spec_field.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

using Json = nlohmann::json;

absl::Status BadSetting(absl::string_view setting, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--spec ", setting, ": ", why));
}

// 512 -> 512, 1e-5 -> 1e-5, true -> true, rms -> "rms": the JSON reader then checks the type.
Json SettingValue(absl::string_view text) {
  Json value = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return Json(std::string(text));
  return value;
}

// The names an enum row reads and writes. The spec's enums count up from 0 and their name
// functions answer "unknown" past the last value (layer_spec.cc).
std::vector<std::string> EnumNames(const EnumMember& member) {
  std::vector<std::string> names;
  for (int value = 0; value < 256; ++value) {
    const absl::string_view name = member.name(value);
    if (name == "unknown") break;
    names.emplace_back(name);
  }
  return names;
}

}  // namespace

absl::StatusOr<LayerSpec> ApplySpecSettings(const std::optional<LayerSpec>& base,
                                            absl::Span<const std::string> settings) {
  Json document = Json::object();
  if (base.has_value()) {
    document = Json::parse(LayerSpecToJson(*base), /*cb=*/nullptr, /*allow_exceptions=*/false);
  }
  std::set<std::string> replaced;  // Nested objects the settings give.
  for (const std::string& setting : settings) {
    const size_t equals = setting.find('=');
    if (equals == std::string::npos || equals == 0) {
      return BadSetting(setting, "expected KEY=VALUE (attnctl --help lists the keys)");
    }
    const std::string key = setting.substr(0, equals);
    const Json value = SettingValue(absl::string_view(setting).substr(equals + 1));
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      document[key] = value;
      continue;
    }
    const std::string object = key.substr(0, dot);
    if (replaced.insert(object).second || !document[object].is_object()) {
      document[object] = Json::object();
    }
    document[object][key.substr(dot + 1)] = value;
  }
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(document.dump());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--spec: ", spec.status().message()));
  }
  return spec;
}

std::string SpecSettingsHelp() {
  std::string help;
  for (const SpecField& field : LayerSpecFields()) {
    const std::string kind = std::visit(
        Overloaded{
            [](int LayerSpec::*) -> std::string { return "integer"; },
            [](float LayerSpec::*) -> std::string { return "number"; },
            [](double LayerSpec::*) -> std::string { return "number"; },
            [](bool LayerSpec::*) -> std::string { return "true | false"; },
            [](const EnumMember& member) { return absl::StrJoin(EnumNames(member), " | "); },
            [](RopeScaling LayerSpec::*) -> std::string {
              return "rope_scaling.type, rope_scaling.factor, ... (layer_spec_json.h)";
            },
            [](MlaDims LayerSpec::*) -> std::string {
              return "mla.kv_lora_rank, mla.q_lora_rank, ... (layer_spec_json.h)";
            },
        },
        field.member);
    absl::StrAppend(&help, "  ", field.name, ": ", kind, "\n");
  }
  return help;
}

}  // namespace attnserve
