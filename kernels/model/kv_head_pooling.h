// MHA -> GQA/MQA conversion by mean-pooling key/value heads (Ainslie et al. 2023, "GQA: Training
// Generalized Multi-Query Transformer Models from Multi-Head Checkpoints", section 2.1).
//
// The query heads are split into num_kv_heads groups of consecutive heads, as GQA models and
// transformers' repeat_kv pair them (query head h reads KV head h / (num_heads / num_kv_heads)).
// Each group's K heads become one K head whose projection rows are the mean of the group's rows
// (V likewise, and k_proj.bias / v_proj.bias when qkv_bias); q_proj and o_proj are kept as they
// are. The paper then uptrains the pooled model briefly; this conversion is the step before that,
// so its output error against the MHA layer is what an unadapted conversion costs.
//
// The source may be any MHA/GQA layer whose KV head count the target count divides (pooling 8 ->
// 4 -> 2 equals pooling 8 -> 2: the groups nest and have equal sizes). MLA caches a latent, not
// heads, and is refused by name; so is a k norm whose scale spans the KV heads (OLMo 2's across
// heads, the per-head LayerNorm's scale per head), which has no scale for a pooled head.
#ifndef ATTNSERVE_KERNELS_MODEL_KV_HEAD_POOLING_H_
#define ATTNSERVE_KERNELS_MODEL_KV_HEAD_POOLING_H_

#include "absl/status/statusor.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"

namespace attnserve {

// `source` with `num_kv_heads` KV heads; the variant follows the count: mha when it equals
// num_heads, mqa when it is 1, gqa otherwise. INVALID_ARGUMENT for an MLA source, a count outside
// [1, source.num_kv_heads], or one that does not divide source.num_kv_heads (the message names
// both counts).
absl::StatusOr<LayerSpec> PooledKvSpec(const LayerSpec& source, int num_kv_heads);

// The MHA layer a GQA/MQA `target` is converted from: `target` with num_kv_heads = num_heads and
// variant mha, everything else equal. INVALID_ARGUMENT for an MLA target.
absl::StatusOr<LayerSpec> MhaSourceSpec(const LayerSpec& target);

// The weights of PooledKvSpec(source, num_kv_heads) from `source_weights`: pooled K/V rows are
// averaged in float64 and stored once rounded in the source tensor's dtype; every other tensor is
// copied bit for bit. INVALID_ARGUMENT as PooledKvSpec, or as ValidateLayerWeights(source, ...)
// when the source weights do not fit the source spec.
absl::StatusOr<LayerWeights> PoolKvHeads(const LayerSpec& source,
                                         const LayerWeights& source_weights, int num_kv_heads);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_MODEL_KV_HEAD_POOLING_H_
