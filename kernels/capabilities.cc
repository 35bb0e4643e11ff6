#include "kernels/capabilities.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cpu/cpu_capabilities.h"
#include "kernels/kv/quantization.h"
#include "kernels/spec/attention_variation.h"
#include "kernels/spec/rope_frequencies.h"

namespace attnserve {

namespace {

template <typename T>
bool Contains(const std::vector<T>& values, const T& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

std::string BackendTitle(const BackendCapabilities& c) { return absl::AsciiStrToUpper(c.backend); }

// What a rule finds: everything of a CapabilityGap but the hint, which depends on the CPU table.
struct Finding {
  absl::StatusCode code;
  std::string field;
  std::string short_name;
  std::string message;  // "<field> = <value>: the <BACKEND> backend <limit>".
};

using Rule = std::optional<Finding> (*)(const BackendCapabilities&, const LayerSpec&,
                                        const KvStorageFormat&);

std::optional<Finding> Variant(const BackendCapabilities& c, const LayerSpec& spec,
                               const KvStorageFormat&) {
  if (Contains(c.variants, spec.variant)) return std::nullopt;
  std::vector<std::string> served;
  for (AttentionVariant v : c.variants) served.emplace_back(VariantName(v));
  const std::string name = absl::AsciiStrToUpper(VariantName(spec.variant));
  return Finding{absl::StatusCode::kUnimplemented, "variant", name,
                 absl::StrCat("variant = ", VariantName(spec.variant), ": the ", BackendTitle(c),
                              " backend has no ", name, " kernels yet (it serves ",
                              absl::StrJoin(served, ", "), ")")};
}

std::optional<Finding> HeadDim(const BackendCapabilities& c, const LayerSpec& spec,
                               const KvStorageFormat&) {
  // MLA's widths come from MlaDims; head_dim is unused there.
  if (spec.variant == AttentionVariant::kMLA || c.head_dims.empty() ||
      Contains(c.head_dims, spec.head_dim)) {
    return std::nullopt;
  }
  return Finding{
      absl::StatusCode::kInvalidArgument, "head_dim", absl::StrCat("hd ", spec.head_dim),
      absl::StrCat("head_dim = ", spec.head_dim, ": the ", BackendTitle(c),
                   " backend is built for head dims ", absl::StrJoin(c.head_dims, ", "))};
}

// A layer variation the backend does not compute: INVALID_ARGUMENT, as the CUDA backend answered
// before the table.
Finding Variation(const BackendCapabilities& c, std::string field, std::string short_name,
                  const std::string& value, absl::string_view what) {
  std::string message = absl::StrCat(field, " = ", value, ": the ", BackendTitle(c),
                                     " backend does not implement ", what, " yet");
  return Finding{absl::StatusCode::kInvalidArgument, std::move(field), std::move(short_name),
                 std::move(message)};
}

std::optional<Finding> RopeScalingRule(const BackendCapabilities& c, const LayerSpec& spec,
                                       const KvStorageFormat&) {
  const RopeScalingType type = spec.rope_scaling.type;
  if (type != RopeScalingType::kNone && !Contains(c.rope_scalings, type)) {
    std::vector<std::string> served;
    for (RopeScalingType t : c.rope_scalings) served.emplace_back(RopeScalingTypeName(t));
    return Finding{absl::StatusCode::kInvalidArgument, "rope_scaling.type",
                   std::string(RopeScalingTypeName(type)),
                   absl::StrCat("rope_scaling.type = ", RopeScalingTypeName(type), ": the ",
                                BackendTitle(c), " backend applies ", absl::StrJoin(served, ", "))};
  }
  if (const double factor = RopeAttentionFactor(spec); !c.yarn_attention_factor && factor != 1.0) {
    return Finding{absl::StatusCode::kInvalidArgument, "rope_scaling", "attention factor",
                   absl::StrCat("rope_scaling: yarn attention factor ", factor,
                                " (from factor, mscale and mscale_all_dim) is not implemented on "
                                "the ",
                                BackendTitle(c),
                                " backend (a spec whose mscale equals mscale_all_dim has none)")};
  }
  return std::nullopt;
}

std::optional<Finding> KvFormat(const BackendCapabilities& c, const LayerSpec& spec,
                                const KvStorageFormat& format) {
  if (Contains(c.kv_formats, format)) return std::nullopt;
  std::vector<std::string> served;
  for (const KvStorageFormat& f : c.kv_formats) served.push_back(KvStorageFormatName(f));
  const std::string name = KvStorageFormatName(format);
  const std::string limit = absl::StrCat(": the ", BackendTitle(c), " backend stores KV as ",
                                         absl::StrJoin(served, ", "));
  // 8-bit pages are a storage scheme the backend has no code for; a plain dtype is a bad value.
  if (format.quantized()) {
    return Finding{absl::StatusCode::kUnimplemented, "kv_cache_quantization", name,
                   absl::StrCat("kv_cache_quantization = ", name, limit)};
  }
  return Finding{absl::StatusCode::kInvalidArgument, "kv_cache_dtype", name,
                 absl::StrCat("kv_cache_dtype = ", name, limit)};
}

// Before the variations (NamedVariations(), in their order), then after them.
constexpr Rule kRulesBefore[] = {Variant, HeadDim};
constexpr Rule kRulesAfter[] = {RopeScalingRule, KvFormat};

// "; CPU-only for now: use --backend=cpu" when the CPU backend serves what `c` refuses.
std::string CpuHint(const BackendCapabilities& c, bool cpu_serves) {
  if (c.backend == CpuCapabilities().backend || !cpu_serves) return "";
  return "; CPU-only for now: use --backend=cpu";
}

}  // namespace

bool ServesVariation(const BackendCapabilities& capabilities, absl::string_view name) {
  for (const std::string& served : capabilities.variations) {
    if (served == name) return true;
  }
  return false;
}

std::vector<CapabilityGap> FindCapabilityGaps(const BackendCapabilities& capabilities,
                                              const LayerSpec& spec,
                                              const KvStorageFormat& kv_format) {
  std::vector<CapabilityGap> gaps;
  const auto add = [&](const Finding& found, bool cpu_serves) {
    gaps.push_back(CapabilityGap{
        found.field, found.short_name,
        absl::Status(found.code, absl::StrCat(found.message, CpuHint(capabilities, cpu_serves)))});
  };
  const auto apply = [&](Rule rule) {
    if (std::optional<Finding> found = rule(capabilities, spec, kv_format)) {
      add(*found, !rule(CpuCapabilities(), spec, kv_format).has_value());
    }
  };
  for (Rule rule : kRulesBefore) apply(rule);
  // The variations: the one rule for all of them.
  for (const NamedVariation& v : NamedVariations()) {
    const std::string value = v.used(spec);
    if (value.empty() || ServesVariation(capabilities, v.name)) continue;
    add(Variation(capabilities, v.field, v.short_name, value, v.what),
        ServesVariation(CpuCapabilities(), v.name));
  }
  for (Rule rule : kRulesAfter) apply(rule);
  return gaps;
}

absl::Status CheckCapabilities(const BackendCapabilities& capabilities, const LayerSpec& spec,
                               const KvCacheConfig& kv_config) {
  std::vector<CapabilityGap> gaps = FindCapabilityGaps(capabilities, spec, kv_config.storage);
  return gaps.empty() ? absl::OkStatus() : gaps.front().status;
}

namespace {

struct OperationInfo {
  const char* field;  // The BackendCapabilities field.
  const char* rpc;    // What the caller asked for.
  const char* what;   // "does not <what>".
  const char* why;    // What it is for.
};

OperationInfo Info(LayerOperation operation) {
  switch (operation) {
    case LayerOperation::kFork:
      return {"fork", "Fork", "fork requests", "prefix sharing; "};
    case LayerOperation::kExportImport:
      return {"export_import", "ExportRequest/ImportRequest", "export or import requests",
              "moving a request between replicas; "};
    case LayerOperation::kStack:
      return {"stacks", "stack", "build hybrid stacks of layers", ""};
  }
  return {"unknown", "unknown", "do this", ""};
}

bool Serves(const BackendCapabilities& c, LayerOperation operation) {
  switch (operation) {
    case LayerOperation::kFork:
      return c.fork;
    case LayerOperation::kExportImport:
      return c.export_import;
    case LayerOperation::kStack:
      return c.stacks;
  }
  return false;
}

}  // namespace

absl::Status CheckOperation(const BackendCapabilities& capabilities, LayerOperation operation) {
  if (Serves(capabilities, operation)) return absl::OkStatus();
  const OperationInfo info = Info(operation);
  return absl::UnimplementedError(
      absl::StrCat(info.rpc, ": the ", BackendTitle(capabilities), " backend does not ", info.what,
                   " yet (", info.why, "capability ", info.field, " = false)",
                   CpuHint(capabilities, Serves(CpuCapabilities(), operation))));
}

absl::Status UnservedOperation(LayerOperation operation) {
  const OperationInfo info = Info(operation);
  return absl::UnimplementedError(absl::StrCat(info.rpc, ": this backend does not ", info.what,
                                               " (", info.why, "capability ", info.field,
                                               " = false)"));
}

absl::StatusOr<KvCacheConfig> CheckLayerRequest(const BackendCapabilities& capabilities,
                                                const LayerSpec& spec, const LayerWeights& weights,
                                                const KvCacheConfig& kv_config) {
  if (absl::Status s = ValidateLayerSpec(spec); !s.ok()) return s;
  if (absl::Status s = ValidateLayerWeights(spec, weights); !s.ok()) return s;
  if (absl::Status s = CheckCapabilities(capabilities, spec, kv_config); !s.ok()) return s;
  KvCacheConfig config = kv_config;
  if (config.page_size == 0) config.page_size = DefaultPageSize(spec);
  if (absl::Status s = ValidateKvPaging(config); !s.ok()) return s;
  return config;
}

}  // namespace attnserve
