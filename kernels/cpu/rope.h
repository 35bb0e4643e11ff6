// Rotary position embedding (RoPE), applied in place.
#ifndef ATTNSERVE_KERNELS_CPU_ROPE_H_
#define ATTNSERVE_KERNELS_CPU_ROPE_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

class RotaryEmbedding {
 public:
  // Rotates RotaryDim(spec) wide vectors with RopeInverseFrequencies(spec) (rope scaling
  // included), cos and sin multiplied by RopeAttentionFactor(spec). `spec` must be valid.
  explicit RotaryEmbedding(const LayerSpec& spec);

  // Rotates `num_heads` vectors per row, each `rotary_dim` wide and `head_stride` apart, starting
  // at x + row * row_stride. Row r uses positions[r]. Angles are computed in double: float32 angles
  // (as some implementations do) lose ~position * 2^-24 radians, visible past a few thousand.
  void Apply(float* x, int64_t row_stride, int64_t num_heads, int64_t head_stride,
             absl::Span<const int64_t> positions) const;

 private:
  RopeLayout layout_;
  int rotary_dim_;
  std::vector<double> inv_freq_;
  double attention_factor_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_CPU_ROPE_H_
