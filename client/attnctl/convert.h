// `attnctl convert`: MHA -> GQA/MQA conversion offline, written as a safetensors checkpoint.
//
//   attnctl convert --from=mha.json [--seed=S] --kv_heads=N --out=gqa.safetensors [--layer=I]
//   attnctl convert --from=CHECKPOINT --spec_file=mha.json [--layer=I] --kv_heads=N --out=...
//
// The MHA layer's weights come from the JSON spec's seeded weights (exactly what Configure with
// that seed draws) or from a safetensors file or save_pretrained directory read with the spec;
// their K/V heads are mean-pooled (kernels/model/kv_head_pooling.h) and written under
// "model.layers.<layer>.self_attn.*", in each source tensor's dtype. The target spec's JSON is
// stored in the file's __metadata__ ("attnserve_spec"), where the server reads it
// (server/session/checkpoint_spec.h): Configure with weights.checkpoint {path, layer_index} alone
// (`attnctl configure --checkpoint=gqa.safetensors --layer=I`) loads the converted layer.
#ifndef ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_
#define ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

struct ConvertOptions {
  std::string from;       // A .json MHA spec (seeded weights) or a checkpoint path.
  std::string spec_file;  // The MHA spec of a checkpoint `from`.
  uint64_t seed = 1;
  int layer = 0;  // Layer index read from a checkpoint and written to `out`.
  int kv_heads = 0;
  std::string out;
};

struct ConvertResult {
  LayerSpec source;
  LayerSpec target;
  int64_t tensors = 0;
};

// Reads, pools and writes as above. INVALID_ARGUMENT for an MLA source or a head count that does
// not divide the source's; NOT_FOUND for unreadable inputs; loader and writer errors as they are.
absl::StatusOr<ConvertResult> ConvertKvHeads(const ConvertOptions& options);

// ConvertOptions from attnctl's flags (--from --kv_heads --out, and the shared --spec_file --seed
// --layer); runs ConvertKvHeads and prints the result (JSON with `json`). Returns the exit code.
int RunConvert(bool json);

}  // namespace attnserve

#endif  // ATTNSERVE_CLIENT_ATTNCTL_CONVERT_H_
