#include "client/attnctl/convert.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/common/client.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/model/kv_head_pooling.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/model/layer_weights.h"
#include "kernels/model/safetensors.h"
#include "nlohmann/json.hpp"

// Defined in attnctl.cc, shared with its other commands.
ABSL_DECLARE_FLAG(std::string, spec_file);
ABSL_DECLARE_FLAG(uint64_t, seed);
ABSL_DECLARE_FLAG(int, layer);

ABSL_FLAG(std::string, from, "",
          "convert: the MHA layer: a .json spec (weights from --seed) or a safetensors "
          "checkpoint (with --spec_file and --layer).");
ABSL_FLAG(int, kv_heads, 0, "convert: KV heads of the result (divides the source's).");
ABSL_FLAG(std::string, out, "", "convert: the .safetensors file to write.");

namespace attnserve {

namespace {

absl::StatusOr<LayerSpec> ReadSpec(const std::string& path, absl::string_view flag) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat(flag, ": cannot open ", path));
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(text);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": ", spec.status().message()));
  }
  return spec;
}

}  // namespace

absl::StatusOr<ConvertResult> ConvertKvHeads(const ConvertOptions& options) {
  if (options.from.empty() || options.out.empty() || options.kv_heads == 0) {
    return absl::InvalidArgumentError("convert needs --from, --kv_heads and --out");
  }
  if (options.layer < 0) return absl::InvalidArgumentError("--layer must be >= 0");
  ConvertResult result;
  absl::StatusOr<LayerWeights> weights;
  if (absl::EndsWith(options.from, ".json")) {
    absl::StatusOr<LayerSpec> spec = ReadSpec(options.from, "--from");
    if (!spec.ok()) return spec.status();
    result.source = *spec;
    // Validated before drawing, so an MLA spec is refused by the pooling's message, not drawn.
    if (absl::Status s = PooledKvSpec(result.source, options.kv_heads).status(); !s.ok()) return s;
    weights = RandomLayerWeights(result.source, options.seed);
  } else {
    if (options.spec_file.empty()) {
      return absl::InvalidArgumentError(
          "convert --from=CHECKPOINT needs --spec_file with the MHA layer's spec");
    }
    absl::StatusOr<LayerSpec> spec = ReadSpec(options.spec_file, "--spec_file");
    if (!spec.ok()) return spec.status();
    result.source = *spec;
    if (absl::Status s = PooledKvSpec(result.source, options.kv_heads).status(); !s.ok()) return s;
    weights = LoadLayerWeightsFromSafetensors(options.from, result.source, options.layer);
  }
  if (!weights.ok()) return weights.status();
  absl::StatusOr<LayerWeights> pooled = PoolKvHeads(result.source, *weights, options.kv_heads);
  if (!pooled.ok()) return pooled.status();
  result.target = *PooledKvSpec(result.source, options.kv_heads);
  std::map<std::string, Tensor> named;
  for (auto& [name, tensor] : *pooled) {
    named.emplace(HfAttentionPrefix(options.layer) + name, std::move(tensor));
  }
  result.tensors = static_cast<int64_t>(named.size());
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      // Read back by the server, so that the file configures without a spec (kSpecMetadataKey).
      {"attnserve_spec", LayerSpecToJson(result.target)},
      {"attnserve_converted_from", absl::StrCat(LayerSpecSummary(result.source),
                                                "; K/V heads mean-pooled to ", options.kv_heads)}};
  if (absl::Status s = WriteSafetensors(options.out, named, metadata); !s.ok()) return s;
  return result;
}

int RunConvert(bool json) {
  ConvertOptions options;
  options.from = absl::GetFlag(FLAGS_from);
  options.spec_file = absl::GetFlag(FLAGS_spec_file);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.layer = absl::GetFlag(FLAGS_layer);
  options.kv_heads = absl::GetFlag(FLAGS_kv_heads);
  options.out = absl::GetFlag(FLAGS_out);
  absl::StatusOr<ConvertResult> result = ConvertKvHeads(options);
  if (!result.ok()) return ReportError(result.status().ToString());
  if (json) {
    const nlohmann::json out = {
        {"out", options.out},
        {"layer", options.layer},
        {"tensors", result->tensors},
        {"source_spec", nlohmann::json::parse(LayerSpecToJson(result->source))},
        {"spec", nlohmann::json::parse(LayerSpecToJson(result->target))}};
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    absl::PrintF("wrote %s: %d tensors of layer %d\nfrom  %s\nto    %s\nspec  %s\n", options.out,
                 result->tensors, options.layer, LayerSpecSummary(result->source),
                 LayerSpecSummary(result->target), LayerSpecToJson(result->target));
  }
  return kExitOk;
}

}  // namespace attnserve
