// The named weight tensors of one attention layer, under Hugging Face's names.
//
// Names are those of `transformers` attention modules with the "model.layers.N.self_attn." prefix
// removed, and tensors keep PyTorch's nn.Linear layout [out_features, in_features]:
//   MHA/MQA/GQA: q_proj.weight [H*D, d_model], k_proj.weight [KV*D, d_model],
//                v_proj.weight [KV*D, d_model], o_proj.weight [d_model, H*D]
//                (+ q_proj.bias, k_proj.bias, v_proj.bias when qkv_bias; o_proj.bias when o_bias;
//                q_norm.weight, k_norm.weight [D] when qk_norm, or [H*D] and [KV*D] for
//                rms_across_heads, [H, D] and [KV, D] for layer_norm; sinks [H] when
//                attention_sinks)
//   MLA:         q_proj.weight [H*(nope+rope), d_model]            when q_lora_rank == 0, else
//                q_a_proj.weight [q_lora, d_model], q_a_layernorm.weight [q_lora],
//                q_b_proj.weight [H*(nope+rope), q_lora];
//                kv_a_proj_with_mqa.weight [kv_lora+rope, d_model], kv_a_layernorm.weight
//                [kv_lora], kv_b_proj.weight [H*(nope+v), kv_lora], o_proj.weight [d_model, H*v]
#ifndef ATTNSERVE_KERNELS_MODEL_LAYER_WEIGHTS_H_
#define ATTNSERVE_KERNELS_MODEL_LAYER_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/core/tensor.h"

namespace attnserve {

// Name -> tensor. Any dtype; backends convert to their compute type.
using LayerWeights = std::map<std::string, Tensor>;

struct WeightShape {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm_scale = false;  // RMSNorm scale (initialised to norm_scale_init), not a projection.
  bool is_bias = false;
  // 1, or 0 for a (1 + w) norm (QkNorm::kRmsUnitOffset): either way the seeded norm is the identity
  // scale, as transformers initialises them.
  float norm_scale_init = 1.0f;
};

// Every tensor the spec requires, in a stable order.
std::vector<WeightShape> ExpectedWeightShapes(const LayerSpec& spec);

// OK when `weights` holds exactly the expected tensors with the expected shapes (any dtype), all
// of them finite. Otherwise INVALID_ARGUMENT naming the missing, unexpected or mis-shaped tensor
// and both shapes, or the tensor and the index of its first NaN or infinite element.
absl::Status ValidateLayerWeights(const LayerSpec& spec, const LayerWeights& weights);

// The tensor `name` converted to float32, or empty when `weights` has none (an optional bias or
// norm the spec does not use). Backends call it once, when they build a layer.
std::vector<float> FloatsOrEmpty(const LayerWeights& weights, const std::string& name);

// Deterministic weights from `seed`, as PyTorch initialises nn.Linear: every projection weight and
// bias ~ U(-1/sqrt(in_features), +1/sqrt(in_features)); RMSNorm scales = 1 (0 for a (1 + w) norm);
// gpt-oss sinks ~ U(-1, 1) (logits of the size of the scores). Each tensor draws from
// its own std::mt19937_64 stream seeded by (seed, tensor name), so a tensor's values do not depend
// on which other tensors the spec has. Tensors are float32. The tensors are drawn in parallel,
// one thread each; `cancelled` (optional) is polled as they fill, and once it returns true the
// draw stops and answers CANCELLED, so a huge layer's deadline is honoured.
absl::StatusOr<LayerWeights> RandomLayerWeights(const LayerSpec& spec, uint64_t seed,
                                                const std::function<bool()>& cancelled = nullptr);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_MODEL_LAYER_WEIGHTS_H_
