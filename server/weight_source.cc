#include "server/weight_source.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/checkpoint_loader.h"
#include "proto/codec/tensor_codec.h"

namespace attnserve::server {

namespace {

// Prefixes the engine's message with the request field, keeping the code.
absl::Status WithField(const absl::Status& status, absl::string_view field) {
  return absl::Status(status.code(), absl::StrCat(field, ": ", status.message()));
}

absl::StatusOr<LayerWeights> FromCheckpoint(const v1::CheckpointWeights& checkpoint,
                                            const LayerSpec& spec) {
  const std::string& path = checkpoint.path();
  if (path.empty()) {
    return absl::InvalidArgumentError("weights.checkpoint.path: must not be empty");
  }
  if (checkpoint.layer_index() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights.checkpoint.layer_index = ", checkpoint.layer_index(), ", must be >= 0"));
  }
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      return absl::NotFoundError(
          absl::StrCat("weights.checkpoint.path: '", path, "' does not exist on the server"));
    }
    return absl::InvalidArgumentError(absl::StrCat("weights.checkpoint.path: '", path,
                                                   "' cannot be read: ", std::strerror(error)));
  }
  if (access(path.c_str(), S_ISDIR(info.st_mode) ? (R_OK | X_OK) : R_OK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("weights.checkpoint.path: '", path,
                                                   "' is not readable: ", std::strerror(errno)));
  }
  absl::StatusOr<LayerWeights> weights =
      LoadLayerWeightsFromSafetensors(path, spec, checkpoint.layer_index());
  if (!weights.ok()) return WithField(weights.status(), "weights.checkpoint");
  return weights;
}

absl::StatusOr<LayerWeights> FromInline(const v1::InlineWeights& inline_weights,
                                        const LayerSpec& spec) {
  LayerWeights weights;
  for (int i = 0; i < inline_weights.tensors_size(); ++i) {
    const v1::NamedTensor& named = inline_weights.tensors(i);
    const std::string field =
        absl::StrCat("weights.inline_weights.tensors[", i, "] ('", named.name(), "')");
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

}  // namespace

absl::StatusOr<LayerWeights> WeightsFromProto(const v1::WeightSource& source,
                                              const LayerSpec& spec) {
  switch (source.source_case()) {
    case v1::WeightSource::kSeed: {
      absl::StatusOr<LayerWeights> weights = RandomLayerWeights(spec, source.seed());
      if (!weights.ok()) return WithField(weights.status(), "weights.seed");
      return weights;
    }
    case v1::WeightSource::kCheckpoint:
      return FromCheckpoint(source.checkpoint(), spec);
    case v1::WeightSource::kInlineWeights:
      return FromInline(source.inline_weights(), spec);
    case v1::WeightSource::SOURCE_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "weights: one of seed, checkpoint or inline_weights must be set");
}

}  // namespace attnserve::server
