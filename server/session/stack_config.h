// Hybrid stacks in Configure (ConfigureRequest.stack, docs/hybrid_stacks.md): which layers a
// request asks for, what they cost, and the LayerStack built from their weights. Configure itself
// (server/rpc/attention_service.cc) stays one road for one layer and for a stack: these functions
// answer the questions it asks differently for a stack.
#ifndef ATTNSERVE_SERVER_SESSION_STACK_CONFIG_H_
#define ATTNSERVE_SERVER_SESSION_STACK_CONFIG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/backend.h"
#include "kernels/kv/cache_config.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/stack/layer_stack.h"

namespace attnserve::server {

// The stack's layer specs, bottom first; empty when the request has no stack. Explicit
// `stack.layers` (with a checkpoint directory's config.json, each must agree with config.json's
// layer layer_index + i), or `stack.num_layers` layers read from the checkpoint's config.json from
// weights.checkpoint.layer_index on. INVALID_ARGUMENT, naming the fields: spec and stack both set;
// num_layers outside [0, kMaxStackLayers] or unlike layers_size(); neither layers nor a checkpoint
// with num_layers; inline_weights or convert_from with a stack; an unset weight source.
absl::StatusOr<std::vector<LayerSpec>> ResolveStackSpecs(const v1::ConfigureRequest& request,
                                                         const std::string& checkpoint_root);

// Layer 0's spec, causal only when every layer is: what a session checks inputs against (d_model)
// and whether a Forward may be prefilled in chunks.
LayerSpec StackSessionSpec(const std::vector<LayerSpec>& stack);

// Sums over the layers, as parameter_budget.h counts one layer.
int64_t StackParameterCount(const std::vector<LayerSpec>& stack);
int64_t StackParameterBytes(const std::vector<LayerSpec>& stack);      // fp32 bound
int64_t StackPeakParameterBytes(const std::vector<LayerSpec>& stack);  // while being built
// KV bytes per token of every layer together, before any window evicts (the all-global rate).
int64_t StackKvBytesPerToken(const std::vector<LayerSpec>& stack, const KvStorageFormat& storage,
                             int page_size);

// The longest single context `free_bytes` of pool hold for `layer` (a window layer's pages stop
// growing at its window, so a stack holds more than free_bytes / bytes-per-token).
int64_t MaxContextTokens(const AttentionLayer& layer, int64_t free_bytes);

// Draws or loads every layer's weights (seed: layer i from seed + i; checkpoint: layer
// layer_index + i) and builds the stack on `backend` (LayerStack::Create). `fingerprint` receives
// a SHA-256 over the layers' fingerprints (server/session/layer_fingerprint.h) in order, `kv_usage`
// the stack's KV bytes by layer kind (LayerStack::kv_usage). CANCELLED when `cancelled` says so
// between layers.
absl::StatusOr<std::unique_ptr<AttentionLayer>> BuildStack(
    const v1::ConfigureRequest& request, const std::vector<LayerSpec>& stack,
    AttentionBackend& backend, const KvCacheConfig& kv_config, const std::string& checkpoint_root,
    const std::function<bool()>& cancelled, std::string* fingerprint,
    std::shared_ptr<StackKvUsage>* kv_usage);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_STACK_CONFIG_H_
