#include "kernels/model/kv_head_pooling.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace attnserve {

namespace {

absl::Status RefuseMla(absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(what,
                   " is mla: MLA caches one latent per token, not key/value heads, so "
                   "there are no heads to pool; conversion applies to mha/gqa layers"));
}

// Rows [kv * head_dim, ...) of a K or V projection (weight [kv * head_dim, in] or bias
// [kv * head_dim]) pooled to `target_heads` heads: output row (t, r) is the mean over the group's
// heads s = t * group + j of input row (s, r).
Tensor PoolRows(const Tensor& source, int source_heads, int target_heads, int head_dim) {
  const std::vector<float> values = source.ToFloats();
  const int64_t columns = source.rank() == 2 ? source.dim(1) : 1;
  const int group = source_heads / target_heads;
  std::vector<int64_t> shape = source.shape();
  shape[0] = int64_t{target_heads} * head_dim;
  std::vector<float> pooled(static_cast<size_t>(shape[0] * columns));
  std::vector<double> sum(static_cast<size_t>(columns));
  for (int t = 0; t < target_heads; ++t) {
    for (int r = 0; r < head_dim; ++r) {
      sum.assign(sum.size(), 0.0);
      for (int j = 0; j < group; ++j) {
        const int64_t row = (int64_t{t} * group + j) * head_dim + r;
        const float* in = values.data() + row * columns;
        for (int64_t c = 0; c < columns; ++c) sum[c] += in[c];
      }
      float* out = pooled.data() + (int64_t{t} * head_dim + r) * columns;
      for (int64_t c = 0; c < columns; ++c) out[c] = static_cast<float>(sum[c] / group);
    }
  }
  Tensor result = Tensor::FromFloats(std::move(shape), pooled);
  return source.dtype() == DType::kF32 ? result : result.CastTo(source.dtype());
}

}  // namespace

absl::StatusOr<LayerSpec> PooledKvSpec(const LayerSpec& source, int num_kv_heads) {
  if (source.variant == AttentionVariant::kMLA) return RefuseMla("the source spec");
  if (num_kv_heads < 1 || num_kv_heads > source.num_kv_heads ||
      source.num_kv_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_kv_heads = ", num_kv_heads, ": pooling needs a count in [1, ",
                     source.num_kv_heads, "] that divides the source's ", source.num_kv_heads,
                     " KV heads, so that every group averages the same number of heads"));
  }
  LayerSpec pooled = source;
  pooled.num_kv_heads = num_kv_heads;
  // A k norm whose scale spans the KV heads (OLMo 2's across heads, the per-head LayerNorm's one
  // scale per head) norms each source head with its own scales: the mean of a group's heads has
  // none. Pooling the scales too would be a guess, so it is refused rather than left to fail as
  // weights that do not fit.
  if (num_kv_heads != source.num_kv_heads &&
      QkNormWidth(pooled, num_kv_heads) != QkNormWidth(source, source.num_kv_heads)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_norm = ", QkNormName(source.qk_norm), ": the k norm's scale spans the ",
        source.num_kv_heads, " KV heads (k_norm.weight of ",
        QkNormWidth(source, source.num_kv_heads),
        " floats), which has no counterpart for pooled heads; pooling applies to layers without "
        "a q/k norm or with one scale for all heads"));
  }
  pooled.variant = num_kv_heads == source.num_heads ? AttentionVariant::kMHA
                   : num_kv_heads == 1              ? AttentionVariant::kMQA
                                                    : AttentionVariant::kGQA;
  return pooled;
}

absl::StatusOr<LayerSpec> MhaSourceSpec(const LayerSpec& target) {
  if (target.variant == AttentionVariant::kMLA) return RefuseMla("the target spec");
  LayerSpec source = target;
  source.variant = AttentionVariant::kMHA;
  source.num_kv_heads = target.num_heads;
  return source;
}

absl::StatusOr<LayerWeights> PoolKvHeads(const LayerSpec& source,
                                         const LayerWeights& source_weights, int num_kv_heads) {
  absl::StatusOr<LayerSpec> target = PooledKvSpec(source, num_kv_heads);
  if (!target.ok()) return target.status();
  if (absl::Status s = ValidateLayerWeights(source, source_weights); !s.ok()) return s;
  LayerWeights pooled;
  for (const auto& [name, tensor] : source_weights) {
    const bool is_kv = name == "k_proj.weight" || name == "v_proj.weight" ||
                       name == "k_proj.bias" || name == "v_proj.bias";
    pooled.emplace(name, is_kv
                             ? PoolRows(tensor, source.num_kv_heads, num_kv_heads, source.head_dim)
                             : tensor);
  }
  // The shapes follow from the spec; checking them here keeps a future weight name honest.
  if (absl::Status s = ValidateLayerWeights(*target, pooled); !s.ok()) {
    return absl::InternalError(
        absl::StrCat("pooled weights do not fit the target spec: ", s.message()));
  }
  return pooled;
}

}  // namespace attnserve
