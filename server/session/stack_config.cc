#include "server/session/stack_config.h"

#include <openssl/evp.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/kv/quantization.h"
#include "kernels/model/layer_weights.h"
#include "proto/codec/spec_codec.h"
#include "server/session/checkpoint_spec.h"
#include "server/session/layer_fingerprint.h"
#include "server/session/parameter_budget.h"
#include "server/session/weight_source.h"

namespace attnserve::server {

namespace {

// The one-layer Configure request that layer `i` of the stack amounts to: its own spec (if
// stated) and, for a checkpoint, its own layer index.
v1::ConfigureRequest LayerRequest(const v1::ConfigureRequest& request, int i) {
  v1::ConfigureRequest layer;
  *layer.mutable_weights() = request.weights();
  if (request.weights().has_checkpoint()) {
    layer.mutable_weights()->mutable_checkpoint()->set_layer_index(
        request.weights().checkpoint().layer_index() + i);
  }
  if (i < request.stack().layers_size()) *layer.mutable_spec() = request.stack().layers(i);
  return layer;
}

absl::Status Prefixed(const absl::Status& status, const std::string& prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

std::string Sha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

}  // namespace

absl::StatusOr<std::vector<LayerSpec>> ResolveStackSpecs(const v1::ConfigureRequest& request,
                                                         const std::string& checkpoint_root) {
  if (!request.has_stack()) return std::vector<LayerSpec>();
  const v1::StackSpec& stack = request.stack();
  if (request.has_spec()) {
    return absl::InvalidArgumentError(
        "spec and stack: set one (a stack states each layer's spec in stack.layers)");
  }
  switch (request.weights().source_case()) {
    case v1::WeightSource::kSeed:
    case v1::WeightSource::kCheckpoint:
      break;
    case v1::WeightSource::kInlineWeights:
      return absl::InvalidArgumentError(
          "weights.inline_weights: not accepted for a stack (use a seed or a checkpoint)");
    case v1::WeightSource::kConvertFrom:
      return absl::InvalidArgumentError(
          "weights.convert_from: not accepted for a stack (use a seed or a checkpoint)");
    default:
      return absl::InvalidArgumentError("weights: required (a seed or a checkpoint for a stack)");
  }
  if (stack.num_layers() < 0 || stack.num_layers() > kMaxStackLayers) {
    return absl::InvalidArgumentError(absl::StrCat("stack.num_layers = ", stack.num_layers(),
                                                   ", must be in [0, ", kMaxStackLayers, "]"));
  }
  if (stack.layers_size() > kMaxStackLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("stack.layers: ", stack.layers_size(), " layers, at most ", kMaxStackLayers));
  }
  if (stack.layers_size() > 0 && stack.num_layers() != 0 &&
      stack.num_layers() != stack.layers_size()) {
    return absl::InvalidArgumentError(absl::StrCat("stack.num_layers = ", stack.num_layers(),
                                                   " but stack.layers has ", stack.layers_size(),
                                                   " layers (0 = as many as stack.layers)"));
  }
  int count = stack.layers_size() > 0 ? stack.layers_size() : stack.num_layers();
  if (count == 0 && stack.per_layer() && request.weights().has_checkpoint()) {
    // A model session of every layer from layer_index on.
    absl::StatusOr<int> layers = CheckpointNumLayers(request, checkpoint_root);
    if (!layers.ok()) return layers.status();
    count = *layers - request.weights().checkpoint().layer_index();
    if (count < 1 || count > kMaxStackLayers) {
      return absl::InvalidArgumentError(
          absl::StrCat("stack.num_layers = 0 (every layer from weights.checkpoint.layer_index = ",
                       request.weights().checkpoint().layer_index(), " of ", *layers, "): ", count,
                       " layers, must be in [1, ", kMaxStackLayers, "]"));
    }
  }
  if (count == 0) {
    return absl::InvalidArgumentError(
        "stack: needs stack.layers, or stack.num_layers with a checkpoint whose config.json "
        "describes its layers");
  }
  std::vector<LayerSpec> specs;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<LayerSpec> spec =
        ResolveConfigureSpec(LayerRequest(request, i), checkpoint_root);
    if (!spec.ok()) return Prefixed(spec.status(), absl::StrCat("stack.layers[", i, "]: "));
    specs.push_back(*std::move(spec));
  }
  return specs;
}

LayerSpec StackSessionSpec(const std::vector<LayerSpec>& stack) {
  LayerSpec spec = stack.front();
  for (const LayerSpec& layer : stack) spec.causal = spec.causal && layer.causal;
  return spec;
}

int64_t StackParameterCount(const std::vector<LayerSpec>& stack) {
  int64_t count = 0;
  for (const LayerSpec& layer : stack) count += ParameterCount(layer);
  return count;
}

int64_t StackParameterBytes(const std::vector<LayerSpec>& stack) {
  int64_t bytes = 0;
  for (const LayerSpec& layer : stack) bytes += LayerParameterBytes(layer);
  return bytes;
}

int64_t StackPeakParameterBytes(const std::vector<LayerSpec>& stack) {
  // Every layer's loaded weights and its built copy are alive together until the stack is built.
  return 2 * StackParameterBytes(stack);
}

int64_t StackKvBytesPerToken(const std::vector<LayerSpec>& stack, const KvStorageFormat& storage,
                             int page_size) {
  int64_t bytes = 0;
  for (const LayerSpec& layer : stack) bytes += KvBytesPerTokenOf(layer, storage, page_size);
  return bytes;
}

int64_t MaxContextTokens(const AttentionLayer& layer, int64_t free_bytes) {
  // KvBytesAtLength never decreases with the length: the largest n with KvBytesAtLength(n) <=
  // free_bytes, by bisection over [0, one page per token of the whole pool].
  const KvPoolUsage usage = layer.PoolUsage();
  int64_t lo = 0;
  int64_t hi = std::max<int64_t>(0, free_bytes / std::max<int64_t>(1, usage.page_bytes) + 1) *
               usage.page_size;
  if (layer.KvBytesAtLength(hi) <= free_bytes) return hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (layer.KvBytesAtLength(mid) <= free_bytes ? lo : hi) = mid;
  }
  return lo;
}

absl::StatusOr<std::unique_ptr<AttentionLayer>> BuildStack(
    const v1::ConfigureRequest& request, const std::vector<LayerSpec>& stack,
    AttentionBackend& backend, const KvCacheConfig& kv_config, const std::string& checkpoint_root,
    const std::function<bool()>& cancelled, std::string* fingerprint,
    std::shared_ptr<StackKvUsage>* kv_usage) {
  std::vector<LayerWeights> weights;
  // The mode is part of what the session computes (a model session's calls run one layer).
  const StackMode mode = request.stack().per_layer() ? StackMode::kPerLayer : StackMode::kResidual;
  std::string fingerprints =
      mode == StackMode::kPerLayer ? "attnserve model session" : "attnserve stack";
  for (size_t i = 0; i < stack.size(); ++i) {
    if (cancelled()) {
      return absl::CancelledError("Configure cancelled or past its deadline; nothing was kept");
    }
    const std::string field = absl::StrCat("stack.layers[", i, "]: ");
    absl::StatusOr<LayerWeights> layer_weights;
    if (request.weights().has_checkpoint()) {
      layer_weights = WeightsFromProto(LayerRequest(request, static_cast<int>(i)).weights(),
                                       stack[i], {checkpoint_root});
    } else {
      // Layer i is drawn as a one-layer session of seed + i would be.
      layer_weights = RandomLayerWeights(stack[i], request.weights().seed() + i, cancelled);
      if (!layer_weights.ok()) {
        layer_weights = Prefixed(layer_weights.status(), "weights.seed: ");
      }
    }
    if (!layer_weights.ok()) return Prefixed(layer_weights.status(), field);
    absl::StrAppend(&fingerprints, LayerFingerprint(stack[i], kv_config.storage,
                                                    kv_config.page_size, *layer_weights));
    weights.push_back(*std::move(layer_weights));
  }
  absl::StatusOr<std::unique_ptr<LayerStack>> built =
      LayerStack::Create(backend, stack, weights, kv_config, mode);
  if (!built.ok()) return built.status();
  *fingerprint = Sha256(fingerprints);
  *kv_usage = (*built)->kv_usage();
  return std::unique_ptr<AttentionLayer>(*std::move(built));
}

}  // namespace attnserve::server
