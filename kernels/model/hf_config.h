// The LayerSpec that a Hugging Face checkpoint's config.json describes for one of its layers.
//
// The semantics are those of `transformers` (the version pinned in tests/peer/requirements.txt):
// each supported model_type maps its config keys the way its attention module reads them,
// including per-layer differences (which layers slide; Gemma 3's local RoPE base on sliding
// layers). The supported model_type values are one list, kSupportedModelTypes in hf_config.cc,
// which the refusal of any other names in full (`attnserve_capabilities --families` and README's
// table show the families).
//
// Nothing is ignored silently. Every key of config.json is one of
//   - mapped into the spec (hidden_size, num_key_value_heads, rope_scaling, layer_types, ...);
//   - known not to change what one attention layer computes (names and metadata, "_"-prefixed
//     keys, token ids, generation settings, vocabulary, MLP, MoE routing, the block's norms,
//     dropout: the one list is KeysOutsideAttention in hf_config.cc), and skipped;
//   - refused with INVALID_ARGUMENT naming the key and why (quantization_config, LongRoPE,
//     bidirectional Gemma 3, a layer type other than sliding/full attention, ...). A key this
//     file does not know is refused too: a newer transformers may give it a meaning here.
// A key that is absent means what the family's config class defaults it to (Gemma 2's
// attn_logit_softcapping 50, gpt-oss's YaRN rope_scaling, Qwen3's head_dim 128, ...); JSON null
// is Python's None, read as the class and attention module read it.
//
// DeepSeek-V2 note: transformers' DeepseekV2Attention keeps 1/sqrt(qk_head_dim) as its softmax
// scale, while DeepSeek's own modeling code (and vLLM/SGLang) multiply it by
// mscale(factor, mscale_all_dim)^2 under YaRN. The spec follows DeepSeek (softmax_scale 0, whose
// default for MLA includes that factor), as the released checkpoints were trained that way.
#ifndef ATTNSERVE_KERNELS_MODEL_HF_CONFIG_H_
#define ATTNSERVE_KERNELS_MODEL_HF_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// The spec of layer `layer_index` (0-based, < num_hidden_layers) of the model `config_json`
// describes, validated (ValidateLayerSpec). INVALID_ARGUMENT names the key at fault, as
// "config.json: <key>: ...".
absl::StatusOr<LayerSpec> LayerSpecFromHfConfig(absl::string_view config_json, int layer_index);

// The model's num_hidden_layers (as its config class defaults it when absent). INVALID_ARGUMENT
// for a config.json that is not an object or has no such integer.
absl::StatusOr<int> NumHiddenLayersFromHfConfig(absl::string_view config_json);

// Empty when `a` and `b` describe the same layer; else the first field where they differ and both
// values, e.g. "sliding_window: 4096 vs 0" (field names as in the spec's JSON form,
// layer_spec_json.h, nested fields dotted: "rope_scaling.factor").
std::string LayerSpecDifference(const LayerSpec& a, const LayerSpec& b);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_MODEL_HF_CONFIG_H_
