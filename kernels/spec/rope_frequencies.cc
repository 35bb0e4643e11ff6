#include "kernels/spec/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace attnserve {
namespace {

// _compute_default_rope_parameters: theta^(-2i/dim).
std::vector<double> DefaultInverseFrequencies(double theta, int dim) {
  std::vector<double> inv_freq(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) inv_freq[i] = std::pow(theta, -2.0 * i / dim);
  return inv_freq;
}

// _compute_llama3_parameters: wavelengths shorter than original/high_freq_factor are kept, longer
// than original/low_freq_factor divided by factor, and those between blended smoothly.
void ApplyLlama3(const RopeScaling& r, std::vector<double>& inv_freq) {
  const double old_context_len = r.original_max_position_embeddings;
  const double low_freq_wavelen = old_context_len / r.low_freq_factor;
  const double high_freq_wavelen = old_context_len / r.high_freq_factor;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_freq_wavelen) {
      f /= r.factor;
    } else if (!(wavelen < high_freq_wavelen)) {  // Medium frequency.
      const double smooth = (old_context_len / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f = (1.0 - smooth) * f / r.factor + smooth * f;
    }
  }
}

// _compute_yarn_parameters: pairs that rotate more than beta_fast times over the original context
// keep their frequency (extrapolation), fewer than beta_slow times are divided by factor
// (interpolation), with a linear ramp between (truncate: the ramp bounds rounded out to whole
// pairs; gpt-oss keeps them fractional).
void ApplyYarn(const RopeScaling& r, double theta, int dim, std::vector<double>& inv_freq) {
  const double original = r.original_max_position_embeddings;
  // find_correction_dim: the pair index whose wavelength fits num_rotations times in `original`.
  auto correction_dim = [&](double num_rotations) {
    return (dim * std::log(original / (num_rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(theta));
  };
  // find_correction_range.
  double low = correction_dim(r.beta_fast);
  double high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor: "Prevent singularity".
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation_weight = 1.0 - ramp;  // inv_freq_extrapolation_factor
    const double extrapolated = inv_freq[i];
    const double interpolated = inv_freq[i] / r.factor;
    inv_freq[i] = interpolated * (1.0 - extrapolation_weight) + extrapolated * extrapolation_weight;
  }
}

}  // namespace

std::vector<double> RopeInverseFrequencies(const LayerSpec& spec) {
  const int dim = RotaryDim(spec);
  std::vector<double> inv_freq = DefaultInverseFrequencies(spec.rope_theta, dim);
  const RopeScaling& r = spec.rope_scaling;
  switch (r.type) {
    case RopeScalingType::kNone:
    case RopeScalingType::kDynamic:  // Refused by ValidateLayerSpec.
      break;
    case RopeScalingType::kLinear:  // _compute_linear_scaling_rope_parameters
      for (double& f : inv_freq) f /= r.factor;
      break;
    case RopeScalingType::kLlama3:
      ApplyLlama3(r, inv_freq);
      break;
    case RopeScalingType::kYarn:
      ApplyYarn(r, spec.rope_theta, dim, inv_freq);
      break;
  }
  return inv_freq;
}

double RopeAttentionFactor(const LayerSpec& spec) {
  const RopeScaling& r = spec.rope_scaling;
  if (r.type != RopeScalingType::kYarn) return 1.0;
  // _compute_yarn_parameters: "Sets the attention factor as suggested in the paper".
  if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) {
    return YarnMscale(r.factor, r.mscale) / YarnMscale(r.factor, r.mscale_all_dim);
  }
  return YarnMscale(r.factor, 1.0);
}

}  // namespace attnserve
