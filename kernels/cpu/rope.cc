#include "kernels/cpu/rope.h"

#include <cmath>

#include "kernels/spec/rope_frequencies.h"

namespace attnserve {

RotaryEmbedding::RotaryEmbedding(const LayerSpec& spec)
    : layout_(spec.rope),
      rotary_dim_(RotaryDim(spec)),
      inv_freq_(RopeInverseFrequencies(spec)),
      attention_factor_(RopeAttentionFactor(spec)) {}

void RotaryEmbedding::Apply(float* x, int64_t row_stride, int64_t num_heads, int64_t head_stride,
                            absl::Span<const int64_t> positions) const {
  if (layout_ == RopeLayout::kNone || rotary_dim_ == 0) return;
  const int half = rotary_dim_ / 2;
  std::vector<float> cos_table(half), sin_table(half);
  for (size_t row = 0; row < positions.size(); ++row) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[row]) * inv_freq_[i];
      // As transformers: cos = emb.cos() * attention_scaling (float32 product).
      cos_table[i] = static_cast<float>(std::cos(angle)) * static_cast<float>(attention_factor_);
      sin_table[i] = static_cast<float>(std::sin(angle)) * static_cast<float>(attention_factor_);
    }
    for (int64_t head = 0; head < num_heads; ++head) {
      float* v = x + static_cast<int64_t>(row) * row_stride + head * head_stride;
      // Pair i is (v[i], v[i + half]) for the half layout, (v[2i], v[2i + 1]) interleaved.
      const int pair_gap = layout_ == RopeLayout::kHalf ? half : 1;
      const int pair_step = layout_ == RopeLayout::kHalf ? 1 : 2;
      for (int i = 0; i < half; ++i) {
        float& a = v[i * pair_step];
        float& b = v[i * pair_step + pair_gap];
        const float a0 = a, b0 = b;
        a = a0 * cos_table[i] - b0 * sin_table[i];
        b = b0 * cos_table[i] + a0 * sin_table[i];
      }
    }
  }
}

}  // namespace attnserve
