#include "server/session/weight_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/model/checkpoint_loader.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/model/kv_head_pooling.h"
#include "kernels/base/path_confinement.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server {

namespace {

// Prefixes the engine's message with the request field, keeping the code.
absl::Status WithField(const absl::Status& status, absl::string_view field) {
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

// The one answer for every checkpoint path that cannot be used: missing, unreadable, not a
// regular file or directory, or outside the root. One code and one message, so that a client
// cannot probe which paths exist on the server.
absl::Status NotAReadableCheckpoint(const std::string& path) {
  return absl::NotFoundError(absl::StrCat("weights.checkpoint.path: '", ClipForMessage(path),
                                          "' is not a readable checkpoint under the server's "
                                          "checkpoint root"));
}

absl::StatusOr<LayerWeights> FromCheckpoint(const v1::CheckpointWeights& checkpoint,
                                            const LayerSpec& spec,
                                            const WeightSourceOptions& options) {
  absl::StatusOr<std::string> resolved =
      ResolveCheckpointPath(checkpoint, options.checkpoint_root);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<LayerWeights> weights = LoadLayerWeightsFromSafetensors(
      *resolved, spec, checkpoint.layer_index(), options.checkpoint_root);
  if (!weights.ok()) return WithField(weights.status(), "weights.checkpoint");
  return weights;
}

absl::StatusOr<LayerWeights> FromInline(const v1::InlineWeights& inline_weights,
                                        const LayerSpec& spec) {
  LayerWeights weights;
  for (int i = 0; i < inline_weights.tensors_size(); ++i) {
    const v1::NamedTensor& named = inline_weights.tensors(i);
    const std::string field = absl::StrCat("weights.inline_weights.tensors[", i, "] ('",
                                           ClipForMessage(named.name()), "')");
    if (named.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name: must not be empty"));
    }
    absl::StatusOr<Tensor> tensor = TensorFromProto(named.tensor(), -1, field);
    if (!tensor.ok()) return tensor.status();
    if (!weights.emplace(named.name(), *std::move(tensor)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: appears more than once; names must be distinct"));
    }
  }
  if (absl::Status s = ValidateLayerWeights(spec, weights); !s.ok()) {
    return WithField(s, "weights.inline_weights");
  }
  return weights;
}

// The MHA layer's weights from `conversion`, their K/V heads pooled to spec.num_kv_heads
// (kernels/model/kv_head_pooling.h). The MHA weights are read for MhaSourceSpec(spec), so a
// checkpoint or inline tensors of another shape are refused as they would be for that spec.
absl::StatusOr<LayerWeights> FromConversion(const v1::ConvertFrom& conversion,
                                            const LayerSpec& spec,
                                            const WeightSourceOptions& options) {
  absl::StatusOr<LayerSpec> mha = MhaSourceSpec(spec);
  if (!mha.ok()) return WithField(mha.status(), "weights.convert_from");
  absl::StatusOr<LayerWeights> mha_weights;
  switch (conversion.mha_weights_case()) {
    case v1::ConvertFrom::kSeed:
      mha_weights = RandomLayerWeights(*mha, conversion.seed());
      break;
    case v1::ConvertFrom::kCheckpoint:
      mha_weights = FromCheckpoint(conversion.checkpoint(), *mha, options);
      break;
    case v1::ConvertFrom::kInlineWeights:
      mha_weights = FromInline(conversion.inline_weights(), *mha);
      break;
    case v1::ConvertFrom::MHA_WEIGHTS_NOT_SET:
      return absl::InvalidArgumentError(
          "weights.convert_from: one of seed, checkpoint or inline_weights must be set (the "
          "weights of the MHA layer to convert)");
  }
  if (!mha_weights.ok()) return WithField(mha_weights.status(), "weights.convert_from (MHA)");
  absl::StatusOr<LayerWeights> pooled = PoolKvHeads(*mha, *mha_weights, spec.num_kv_heads);
  if (!pooled.ok()) return WithField(pooled.status(), "weights.convert_from");
  return pooled;
}

}  // namespace

absl::Status CheckCheckpointRoot(const std::string& root) {
  if (root.empty()) return absl::OkStatus();
  struct stat info;
  if (stat(root.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint_root: '", root, "' is not an existing directory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolveCheckpointPath(const v1::CheckpointWeights& checkpoint,
                                                  const std::string& checkpoint_root) {
  const std::string& path = checkpoint.path();
  if (checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        "weights.checkpoint: this server loads no checkpoints by path; start it with "
        "--checkpoint_root");
  }
  if (path.empty()) {
    return absl::InvalidArgumentError("weights.checkpoint.path: must not be empty");
  }
  if (checkpoint.layer_index() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights.checkpoint.layer_index = ", checkpoint.layer_index(), ", must be >= 0"));
  }
  const std::optional<std::string> resolved = ResolveInsideRoot(checkpoint_root, path);
  if (!resolved.has_value()) return NotAReadableCheckpoint(path);
  // stat, not open: the loader opens files itself, without blocking (regular_file.h).
  struct stat info;
  if (stat(resolved->c_str(), &info) != 0) return NotAReadableCheckpoint(path);
  const bool is_directory = S_ISDIR(info.st_mode);
  if (!is_directory && !S_ISREG(info.st_mode)) return NotAReadableCheckpoint(path);
  if (access(resolved->c_str(), is_directory ? (R_OK | X_OK) : R_OK) != 0) {
    return NotAReadableCheckpoint(path);
  }
  return *resolved;
}

absl::StatusOr<LayerWeights> WeightsFromProto(const v1::WeightSource& source, const LayerSpec& spec,
                                              const WeightSourceOptions& options) {
  switch (source.source_case()) {
    case v1::WeightSource::kSeed: {
      absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, source.seed());
      if (!weights.ok()) return WithField(weights.status(), "weights.seed");
      return weights;
    }
    case v1::WeightSource::kCheckpoint:
      return FromCheckpoint(source.checkpoint(), spec, options);
    case v1::WeightSource::kInlineWeights:
      return FromInline(source.inline_weights(), spec);
    case v1::WeightSource::kConvertFrom:
      return FromConversion(source.convert_from(), spec, options);
    case v1::WeightSource::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "weights: one of seed, checkpoint, inline_weights or convert_from must be set");
}

}  // namespace attnserve::server
