// Builds a session's weights from the Configure request's WeightSource.
#ifndef ATTNSERVE_SERVER_SESSION_WEIGHT_SOURCE_H_
#define ATTNSERVE_SERVER_SESSION_WEIGHT_SOURCE_H_

#include <string>

#include "absl/status/statusor.h"
#include "attnserve/v1/attention_service.pb.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"

namespace attnserve::server {

struct WeightSourceOptions {
  // --checkpoint_root: checkpoint paths must resolve (realpath) inside this directory; a relative
  // path is taken relative to it. Empty: checkpoints by path are refused (FAILED_PRECONDITION).
  std::string checkpoint_root;
};

// OK when `root` is empty (no checkpoints by path) or an existing directory; otherwise
// INVALID_ARGUMENT naming --checkpoint_root, for the server to refuse to start.
absl::Status CheckCheckpointRoot(const std::string& root);

// The checkpoint's path resolved inside checkpoint_root (kernels/base/path_confinement.h), with
// the errors of a checkpoint source that do not depend on the spec: FAILED_PRECONDITION when the
// server has no root, INVALID_ARGUMENT for an empty path or a negative layer_index, and the one
// NOT_FOUND below for a path that cannot be used. Configure checks it before it asks for a spec,
// so that a typo in the path is answered as such, not as a missing spec.
absl::StatusOr<std::string> ResolveCheckpointPath(const v1::CheckpointWeights& checkpoint,
                                                  const std::string& checkpoint_root);

// seed:           RandomLayerWeights(spec, seed).
// checkpoint:     LoadLayerWeightsFromSafetensors confined to options.checkpoint_root. A path
//                 that does not exist, cannot be read, is neither a regular file nor a directory
//                 (a FIFO, a device), or resolves outside the root is NOT_FOUND with one message,
//                 "weights.checkpoint.path: '<path>' is not a readable checkpoint under the
//                 server's checkpoint root", so that a caller cannot tell which. Errors in a file
//                 opened under the root are precise but never quote the file's bytes.
// inline_weights: each tensor validated (tensor_codec.h), names distinct, then
//                 ValidateLayerWeights (missing, unexpected, mis-shaped or non-finite tensors).
// convert_from:   the MHA layer's weights (MhaSourceSpec(spec): spec with num_kv_heads =
//                 num_heads) from its seed, checkpoint or inline tensors as above, then
//                 PoolKvHeads to spec.num_kv_heads; an MLA spec is INVALID_ARGUMENT by name. Errors
//                 name "weights.convert_from".
// Unset: INVALID_ARGUMENT. Paths and names echoed in messages are clipped (clip_for_message.h).
absl::StatusOr<LayerWeights> WeightsFromProto(const v1::WeightSource& source, const LayerSpec& spec,
                                              const WeightSourceOptions& options = {});

}  // namespace attnserve::server

#endif  // ATTNSERVE_SERVER_SESSION_WEIGHT_SOURCE_H_
