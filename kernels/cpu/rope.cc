#include "kernels/cpu/rope.h"

#include <cmath>

namespace attnserve {

RotaryEmbedding::RotaryEmbedding(RopeLayout layout, int rotary_dim, double theta)
    : layout_(layout), rotary_dim_(rotary_dim), inv_freq_(rotary_dim / 2) {
  for (int i = 0; i < rotary_dim / 2; ++i) {
    inv_freq_[i] = std::pow(theta, -2.0 * i / rotary_dim);
  }
}

void RotaryEmbedding::Apply(float* x, int64_t row_stride, int64_t num_heads, int64_t head_stride,
                            absl::Span<const int64_t> positions) const {
  if (layout_ == RopeLayout::kNone || rotary_dim_ == 0) return;
  const int half = rotary_dim_ / 2;
  std::vector<float> cos_table(half), sin_table(half);
  for (size_t row = 0; row < positions.size(); ++row) {
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(positions[row]) * inv_freq_[i];
      cos_table[i] = static_cast<float>(std::cos(angle));
      sin_table[i] = static_cast<float>(std::sin(angle));
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
