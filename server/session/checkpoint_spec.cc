#include "server/session/checkpoint_spec.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/clip_for_message.h"
#include "kernels/model/hf_config.h"
#include "kernels/model/safetensors.h"
#include "kernels/spec/layer_spec_json.h"
#include "kernels/base/path_confinement.h"
#include "kernels/base/regular_file.h"
#include "server/session/weight_source.h"
#include "proto/codec/spec_codec.h"

namespace attnserve::server {
namespace {

// Real configs are a few KiB; anything far larger is not one.
constexpr uint64_t kMaxConfigBytes = 1 << 20;

// The text of the config.json of the checkpoint at `resolved` (ResolveCheckpointPath); nullopt
// when there is none beside the weights.
absl::StatusOr<std::optional<std::string>> ReadCheckpointConfig(
    const v1::WeightSource& weights, const std::string& resolved,
    const std::string& checkpoint_root) {
  struct stat info;
  if (stat(resolved.c_str(), &info) != 0) return std::nullopt;
  const std::string directory = S_ISDIR(info.st_mode)
                                    ? resolved
                                    : resolved.substr(0, resolved.find_last_of('/') + 1);
  const std::string candidate = absl::StrCat(directory, "/config.json");
  if (stat(candidate.c_str(), &info) != 0 && errno == ENOENT) return std::nullopt;
  // It exists: from here on every failure is an error, never a silent fallback.
  const std::optional<std::string> config_path = ResolveInsideRoot(checkpoint_root, candidate);
  const absl::Status unreadable = absl::NotFoundError(
      absl::StrCat("weights.checkpoint: the checkpoint's config.json ('",
                   ClipForMessage(weights.checkpoint().path()),
                   "'/config.json) is not a readable file under the server's checkpoint root"));
  if (!config_path.has_value()) return unreadable;
  absl::StatusOr<OpenedFile> file = OpenRegularFile(*config_path, FinalSymlink::kRefuse);
  if (!file.ok()) return unreadable;
  if (file->size > kMaxConfigBytes) {
    close(file->fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "weights.checkpoint: config.json has ", file->size, " bytes, more than a config (at most ",
        kMaxConfigBytes, ")"));
  }
  std::string text(file->size, '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = read(file->fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(file->fd);
  if (done != text.size()) return unreadable;
  return text;
}

// The spec a safetensors file states in its __metadata__ ("attnserve_spec", the JSON of
// kernels/spec/layer_spec_json.h, as `attnctl convert` writes it), for the checkpoint at `resolved`
// (ResolveCheckpointPath); nullopt when it is not such a file (a directory, a file without the
// key, or one the weights loader will refuse with its own message).
absl::StatusOr<std::optional<LayerSpec>> ReadMetadataSpec(const std::string& resolved) {
  struct stat info;
  if (stat(resolved.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return std::nullopt;
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Open(resolved, FinalSymlink::kRefuse);
  if (!file.ok()) return std::nullopt;
  const auto it = file->metadata().find(kSpecMetadataKey);
  if (it == file->metadata().end()) return std::nullopt;
  absl::StatusOr<LayerSpec> spec = LayerSpecFromJson(it->second);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights.checkpoint: __metadata__ ", kSpecMetadataKey, ": ", spec.status().message()));
  }
  return *spec;
}

}  // namespace

absl::StatusOr<LayerSpec> ResolveConfigureSpec(const v1::ConfigureRequest& request,
                                               const std::string& checkpoint_root) {
  // The path first: a typo, a path outside the root or no root at all is answered as such, not as
  // the missing spec that a checkpoint which cannot be read would leave.
  const v1::WeightSource& weights = request.weights();
  if (weights.has_convert_from() && weights.convert_from().has_checkpoint()) {
    if (absl::StatusOr<std::string> resolved =
            ResolveCheckpointPath(weights.convert_from().checkpoint(), checkpoint_root);
        !resolved.ok()) {
      // As weight_source.cc's conversion names it.
      return absl::Status(resolved.status().code(),
                          absl::StrCat("weights.convert_from (MHA): ", resolved.status().message()));
    }
  }
  absl::StatusOr<std::optional<std::string>> config = std::nullopt;
  if (weights.has_checkpoint()) {
    absl::StatusOr<std::string> resolved =
        ResolveCheckpointPath(weights.checkpoint(), checkpoint_root);
    if (!resolved.ok()) return resolved.status();
    absl::StatusOr<std::optional<LayerSpec>> stated_by_file = ReadMetadataSpec(*resolved);
    if (!stated_by_file.ok()) return stated_by_file.status();
    if (stated_by_file->has_value()) {
      if (!request.has_spec()) return **stated_by_file;
      absl::StatusOr<LayerSpec> stated = LayerSpecFromProto(request.spec());
      if (!stated.ok()) return stated.status();
      if (const std::string difference = LayerSpecDifference(*stated, **stated_by_file);
          !difference.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec contradicts the checkpoint file's __metadata__ ", kSpecMetadataKey, ": ",
            difference, " (spec vs file); leave spec unset to take it from the file"));
      }
      return stated;
    }
    config = ReadCheckpointConfig(weights, *resolved, checkpoint_root);
  }
  if (!config.ok()) return config.status();
  if (!config->has_value()) {
    if (!request.has_spec()) {
      return absl::InvalidArgumentError(
          "spec: required (only a checkpoint with a config.json, or a safetensors file with the "
          "spec in its __metadata__ as attnctl convert writes, can supply it)");
    }
    return LayerSpecFromProto(request.spec());
  }
  const int layer_index = request.weights().checkpoint().layer_index();
  absl::StatusOr<LayerSpec> from_config = LayerSpecFromHfConfig(**config, layer_index);
  if (!from_config.ok()) {
    return absl::Status(from_config.status().code(),
                        absl::StrCat("weights.checkpoint: ", from_config.status().message()));
  }
  if (!request.has_spec()) return from_config;
  absl::StatusOr<LayerSpec> stated = LayerSpecFromProto(request.spec());
  if (!stated.ok()) return stated.status();
  if (const std::string difference = LayerSpecDifference(*stated, *from_config);
      !difference.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec contradicts the checkpoint's config.json for layer ", layer_index, ": ", difference,
        " (spec vs config.json); leave spec unset to take it from config.json"));
  }
  return stated;
}

absl::StatusOr<int> CheckpointNumLayers(const v1::ConfigureRequest& request,
                                        const std::string& checkpoint_root) {
  absl::StatusOr<std::string> resolved =
      ResolveCheckpointPath(request.weights().checkpoint(), checkpoint_root);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<std::optional<std::string>> config =
      ReadCheckpointConfig(request.weights(), *resolved, checkpoint_root);
  if (!config.ok()) return config.status();
  if (!config->has_value()) {
    return absl::InvalidArgumentError(
        "stack.num_layers: 0 means every layer of the checkpoint, which needs its config.json "
        "(num_hidden_layers); give stack.num_layers");
  }
  absl::StatusOr<int> layers = NumHiddenLayersFromHfConfig(**config);
  if (!layers.ok()) {
    return absl::Status(layers.status().code(),
                        absl::StrCat("weights.checkpoint: ", layers.status().message()));
  }
  return *layers;
}

}  // namespace attnserve::server
