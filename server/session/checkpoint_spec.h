// The layer spec of a Configure request: the one it states, the one its checkpoint states, or both
// when they agree.
//
// A safetensors file that states its layer's spec in its __metadata__ (key "attnserve_spec", the
// JSON of kernels/spec/layer_spec_json.h; `attnctl convert` writes it) is the authority on it,
// ahead of any config.json beside it: spec unset takes it, spec set must agree (INVALID_ARGUMENT
// naming the first field that differs). Otherwise:
//
// A Hugging Face checkpoint directory carries config.json beside its weights; that file, read by
// kernels/model/hf_config.h for the requested layer, is the authority on what the layer computes:
//   - spec unset, checkpoint with config.json:  the spec is read from config.json;
//   - spec set, checkpoint with config.json:    both must describe the same layer, else
//                                               INVALID_ARGUMENT naming the first field that
//                                               differs ("sliding_window: 4096 vs 0");
//   - spec set, no config.json (a bare .safetensors file, or no checkpoint): the spec as stated;
//   - spec unset, no config.json:               INVALID_ARGUMENT (spec required).
// The checkpoint's path is checked before any of that (ResolveCheckpointPath in weight_source.h):
// a path that cannot be used gets its own answer (NOT_FOUND, or FAILED_PRECONDITION without
// --checkpoint_root), with or without a spec.
// config.json is looked up in the checkpoint directory, or beside a checkpoint file, and read
// under the same confinement as the weights (--checkpoint_root, symlinks resolved, regular files
// only). A config.json that cannot be read or is refused by hf_config.h fails the Configure: its
// contents are never skipped.
#ifndef ATTNSERVE_SERVER_SESSION_CHECKPOINT_SPEC_H_
#define ATTNSERVE_SERVER_SESSION_CHECKPOINT_SPEC_H_

#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::server {

// The safetensors __metadata__ key of a file's layer spec (JSON).
inline constexpr char kSpecMetadataKey[] = "attnserve_spec";

absl::StatusOr<LayerSpec> ResolveConfigureSpec(const v1::ConfigureRequest& request,
                                               const std::string& checkpoint_root);

// The number of layers the checkpoint's config.json gives (num_hidden_layers), for a stack of
// all layers from weights.checkpoint.layer_index on. INVALID_ARGUMENT without a config.json.
absl::StatusOr<int> CheckpointNumLayers(const v1::ConfigureRequest& request,
                                        const std::string& checkpoint_root);

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_CHECKPOINT_SPEC_H_
