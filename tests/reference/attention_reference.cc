#include "tests/reference/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace attnserve::reference {
namespace {

// A named weight or bias as doubles; empty when the tensor is absent (e.g. an optional bias).
std::vector<double> WeightValues(const LayerWeights& weights, const std::string& name) {
  auto it = weights.find(name);
  if (it == weights.end()) return {};
  return ToDoubles(it->second);
}

// y[L, out] = x[L, in] W^T (+ b), W as nn.Linear stores it: [out, in].
std::vector<double> Linear(const std::vector<double>& x, int64_t rows, int in, int out,
                           const std::vector<double>& w, const std::vector<double>& bias) {
  std::vector<double> y(static_cast<size_t>(rows) * out, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = &x[r * in];
    for (int o = 0; o < out; ++o) {
      const double* wo = &w[static_cast<size_t>(o) * in];
      double acc = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < in; ++i) acc += xr[i] * wo[i];
      y[r * out + o] = acc;
    }
  }
  return y;
}

// In place on each row of x[rows, width]: w * x / sqrt(mean(x^2) + eps) (transformers RMSNorm).
void RmsNormRows(std::vector<double>& x, int64_t rows, int width, const std::vector<double>& w,
                 double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double* xr = &x[r * width];
    double sum_sq = 0.0;
    for (int i = 0; i < width; ++i) sum_sq += xr[i] * xr[i];
    const double inv_rms = 1.0 / std::sqrt(sum_sq / width + eps);
    for (int i = 0; i < width; ++i) xr[i] = w[i] * xr[i] * inv_rms;
  }
}

// Whether query row i may attend to key row j (both indices within the sequence).
bool Allowed(const LayerSpec& spec, int64_t i, int64_t j) {
  if (spec.causal && j > i) return false;
  if (spec.sliding_window > 0 && j <= i - spec.sliding_window) return false;
  return true;
}

// ALiBi's bias on the logit of key j for query i over a sequence of `len` keys, as transformers
// adds it: BLOOM slope * j (build_alibi_tensor over the attention mask's cumsum), MPT
// slope * (j - (len - 1)) (build_mpt_alibi_tensor sliced to the keys). Both differ from the
// engine's slope * (j - i) by a per-row constant.
double AlibiBias(const LayerSpec& spec, const std::vector<double>& slopes, int h, int64_t len,
                 int64_t j) {
  if (spec.alibi == Alibi::kBloom) return slopes[h] * static_cast<double>(j);
  if (spec.alibi == Alibi::kMpt) return slopes[h] * static_cast<double>(j - (len - 1));
  return 0.0;
}

// Scaled-dot-product attention over one whole sequence, with the full score matrix.
//   q: [L, num_heads, dqk]; k: [L, num_kv_heads, dqk]; v: [L, num_kv_heads, dv].
//   Query head h reads kv head h / (num_heads / num_kv_heads).
//   returns [L, num_heads * dv].
std::vector<double> Attend(const LayerSpec& spec, int64_t len, int num_heads, int num_kv_heads,
                           int dqk, int dv, const std::vector<double>& q,
                           const std::vector<double>& k, const std::vector<double>& v) {
  const double scale = static_cast<double>(EffectiveSoftmaxScale(spec));
  const int group = num_heads / num_kv_heads;
  const std::vector<double> slopes = AlibiSlopesReference(spec);
  std::vector<double> out(static_cast<size_t>(len) * num_heads * dv, 0.0);
  std::vector<double> scores(static_cast<size_t>(len));
  for (int h = 0; h < num_heads; ++h) {
    const int kvh = h / group;
    for (int64_t i = 0; i < len; ++i) {
      const double* qi = &q[(i * num_heads + h) * dqk];
      double max_score = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        if (!Allowed(spec, i, j)) continue;
        const double* kj = &k[(j * num_kv_heads + kvh) * dqk];
        double dot = 0.0;
        for (int d = 0; d < dqk; ++d) dot += qi[d] * kj[d];
        scores[j] = scale * dot + AlibiBias(spec, slopes, h, len, j);
        max_score = std::max(max_score, scores[j]);
      }
      double denom = 0.0;
      for (int64_t j = 0; j < len; ++j) {
        if (!Allowed(spec, i, j)) continue;
        scores[j] = std::exp(scores[j] - max_score);
        denom += scores[j];
      }
      double* oi = &out[(i * num_heads + h) * dv];
      for (int64_t j = 0; j < len; ++j) {
        if (!Allowed(spec, i, j)) continue;
        const double p = scores[j] / denom;
        const double* vj = &v[(j * num_kv_heads + kvh) * dv];
        for (int d = 0; d < dv; ++d) oi[d] += p * vj[d];
      }
    }
  }
  return out;
}

void MaybeRound(const ReferenceOptions& options, std::vector<double>& values) {
  if (options.kv_round.has_value()) values = RoundTo(values, *options.kv_round);
}

std::vector<double> StandardAttention(const LayerSpec& spec, const LayerWeights& weights,
                                      const std::vector<double>& hidden,
                                      const std::vector<int64_t>& positions,
                                      const ReferenceOptions& options) {
  const int64_t len = static_cast<int64_t>(positions.size());
  const int d_model = spec.d_model;
  const int heads = spec.num_heads;
  const int kv_heads = spec.num_kv_heads;
  const int dim = spec.head_dim;

  std::vector<double> q =
      Linear(hidden, len, d_model, heads * dim, WeightValues(weights, "q_proj.weight"),
             WeightValues(weights, "q_proj.bias"));
  std::vector<double> k =
      Linear(hidden, len, d_model, kv_heads * dim, WeightValues(weights, "k_proj.weight"),
             WeightValues(weights, "k_proj.bias"));
  std::vector<double> v =
      Linear(hidden, len, d_model, kv_heads * dim, WeightValues(weights, "v_proj.weight"),
             WeightValues(weights, "v_proj.bias"));
  for (int64_t t = 0; t < len; ++t) {
    for (int h = 0; h < heads; ++h) {
      ApplyRopeReference(spec.rope, spec.rope_theta, positions[t], &q[(t * heads + h) * dim], dim);
    }
    for (int h = 0; h < kv_heads; ++h) {
      ApplyRopeReference(spec.rope, spec.rope_theta, positions[t], &k[(t * kv_heads + h) * dim],
                         dim);
    }
  }
  MaybeRound(options, k);
  MaybeRound(options, v);

  const std::vector<double> attn = Attend(spec, len, heads, kv_heads, dim, dim, q, k, v);
  return Linear(attn, len, heads * dim, d_model, WeightValues(weights, "o_proj.weight"),
                WeightValues(weights, "o_proj.bias"));
}

std::vector<double> MlaAttention(const LayerSpec& spec, const LayerWeights& weights,
                                 const std::vector<double>& hidden,
                                 const std::vector<int64_t>& positions,
                                 const ReferenceOptions& options) {
  const MlaDims& m = spec.mla;
  const int64_t len = static_cast<int64_t>(positions.size());
  const int d_model = spec.d_model;
  const int heads = spec.num_heads;
  const int nope = m.qk_nope_head_dim;
  const int rope = m.qk_rope_head_dim;
  const int dqk = nope + rope;
  const int dv = m.v_head_dim;
  const int lora = m.kv_lora_rank;
  const double eps = static_cast<double>(m.rms_norm_eps);

  // Queries: [L, heads, nope + rope].
  std::vector<double> q;
  if (m.q_lora_rank == 0) {
    q = Linear(hidden, len, d_model, heads * dqk, WeightValues(weights, "q_proj.weight"), {});
  } else {
    std::vector<double> q_latent =
        Linear(hidden, len, d_model, m.q_lora_rank, WeightValues(weights, "q_a_proj.weight"), {});
    RmsNormRows(q_latent, len, m.q_lora_rank, WeightValues(weights, "q_a_layernorm.weight"), eps);
    q = Linear(q_latent, len, m.q_lora_rank, heads * dqk, WeightValues(weights, "q_b_proj.weight"),
               {});
  }

  // The compressed KV: latent c [L, lora] (normed) and the shared RoPE key k_pe [L, rope].
  const std::vector<double> kv_a = Linear(hidden, len, d_model, lora + rope,
                                          WeightValues(weights, "kv_a_proj_with_mqa.weight"), {});
  std::vector<double> latent(static_cast<size_t>(len) * lora);
  std::vector<double> k_pe(static_cast<size_t>(len) * rope);
  for (int64_t t = 0; t < len; ++t) {
    std::copy_n(kv_a.data() + t * (lora + rope), lora, latent.data() + t * lora);
    // .data() arithmetic: k_pe is empty when rope == 0, and &v[size()] is undefined.
    std::copy_n(kv_a.data() + t * (lora + rope) + lora, rope, k_pe.data() + t * rope);
  }
  RmsNormRows(latent, len, lora, WeightValues(weights, "kv_a_layernorm.weight"), eps);

  for (int64_t t = 0; t < len; ++t) {
    for (int h = 0; h < heads; ++h) {
      ApplyRopeReference(spec.rope, spec.rope_theta, positions[t], &q[(t * heads + h) * dqk + nope],
                         rope);
    }
    if (rope > 0) {
      ApplyRopeReference(spec.rope, spec.rope_theta, positions[t], k_pe.data() + t * rope, rope);
    }
  }
  MaybeRound(options, latent);
  MaybeRound(options, k_pe);

  // Up-projection: [L, heads, nope + dv]; key_h = [k_nope_h, k_pe], value_h = v_h.
  const std::vector<double> kv =
      Linear(latent, len, lora, heads * (nope + dv), WeightValues(weights, "kv_b_proj.weight"), {});
  std::vector<double> k(static_cast<size_t>(len) * heads * dqk);
  std::vector<double> v(static_cast<size_t>(len) * heads * dv);
  for (int64_t t = 0; t < len; ++t) {
    for (int h = 0; h < heads; ++h) {
      const double* src = &kv[(t * heads + h) * (nope + dv)];
      double* kh = &k[(t * heads + h) * dqk];
      std::copy_n(src, nope, kh);
      std::copy_n(k_pe.data() + t * rope, rope, kh + nope);
      std::copy_n(src + nope, dv, &v[(t * heads + h) * dv]);
    }
  }

  const std::vector<double> attn = Attend(spec, len, heads, heads, dqk, dv, q, k, v);
  return Linear(attn, len, heads * dv, d_model, WeightValues(weights, "o_proj.weight"), {});
}

}  // namespace

std::vector<double> ReferenceAttention(const LayerSpec& spec, const LayerWeights& weights,
                                       const std::vector<double>& hidden,
                                       const std::vector<int64_t>& positions,
                                       const ReferenceOptions& options) {
  if (spec.variant == AttentionVariant::kMLA) {
    return MlaAttention(spec, weights, hidden, positions, options);
  }
  return StandardAttention(spec, weights, hidden, positions, options);
}

std::vector<double> AlibiSlopesReference(const LayerSpec& spec) {
  const int heads = spec.num_heads;
  std::vector<double> slopes;
  if (spec.alibi == Alibi::kBloom) {
    // closest_power_of_2 = 2 ** floor(log2(n)); base = 2 ** (-(2 ** -(log2(p) - 3))); the
    // first p slopes are base ** 1..p, the rest extra_base ** 1, 3, 5, ... with p doubled.
    const int p = 1 << static_cast<int>(std::floor(std::log2(heads)));
    const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(p) - 3)));
    for (int i = 1; i <= p; ++i) slopes.push_back(std::pow(base, i));
    const double extra_base = std::pow(2.0, -std::pow(2.0, -(std::log2(2 * p) - 3)));
    for (int i = 0; i < std::min(p, heads - p); ++i) {
      slopes.push_back(std::pow(extra_base, 2 * i + 1));
    }
  } else if (spec.alibi == Alibi::kMpt) {
    // n = 2 ** ceil(log2(heads)); slopes 1 / 2 ** ((1..n) * bias_max / n); for n > heads the
    // odd-indexed slopes (1::2) then the even (::2), the first `heads` of them.
    const int n = 1 << static_cast<int>(std::ceil(std::log2(heads)));
    std::vector<double> all;
    for (int i = 1; i <= n; ++i) all.push_back(1.0 / std::pow(2.0, i * spec.alibi_bias_max / n));
    if (n == heads) return all;
    for (int i = 1; i < n; i += 2) slopes.push_back(all[i]);
    for (int i = 0; i < n; i += 2) slopes.push_back(all[i]);
    slopes.resize(heads);
  }
  return slopes;
}

void ApplyRopeReference(RopeLayout layout, double theta, int64_t position, double* x,
                        int rotary_dim) {
  if (layout == RopeLayout::kNone) return;
  const int half = rotary_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * i / rotary_dim);
    const double angle = static_cast<double>(position) * inv_freq;
    const double c = std::cos(angle);
    const double s = std::sin(angle);
    // (a, b) is the rotated pair; a' = a cos - b sin, b' = b cos + a sin.
    double& a = layout == RopeLayout::kHalf ? x[i] : x[2 * i];
    double& b = layout == RopeLayout::kHalf ? x[i + half] : x[2 * i + 1];
    const double a0 = a;
    const double b0 = b;
    a = a0 * c - b0 * s;
    b = b0 * c + a0 * s;
  }
}

std::vector<double> RandomHidden(int64_t rows, int cols, std::mt19937_64& rng, double stddev) {
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> values(static_cast<size_t>(rows) * cols);
  for (double& value : values) value = normal(rng);
  return values;
}

void PerturbNormScales(LayerWeights& weights, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.5f, 1.5f);
  for (const char* name : {"q_a_layernorm.weight", "kv_a_layernorm.weight"}) {
    auto it = weights.find(name);
    if (it == weights.end()) continue;
    std::vector<float> values(static_cast<size_t>(it->second.num_elements()));
    for (float& value : values) value = uniform(rng);
    it->second = Tensor::FromFloats(it->second.shape(), values).CastTo(it->second.dtype());
  }
}

double RelativeError(const std::vector<double>& actual, const std::vector<double>& expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double diff_sq = 0.0;
  double ref_sq = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = actual[i] - expected[i];
    diff_sq += diff * diff;
    ref_sq += expected[i] * expected[i];
  }
  return std::sqrt(diff_sq) / std::sqrt(ref_sq);
}

double MaxRelativeError(const std::vector<double>& actual, const std::vector<double>& expected) {
  if (actual.size() != expected.size()) return std::numeric_limits<double>::infinity();
  double max_diff = 0.0;
  double max_ref = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double diff = std::abs(actual[i] - expected[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::quiet_NaN();
    max_diff = std::max(max_diff, diff);
    max_ref = std::max(max_ref, std::abs(expected[i]));
  }
  return max_diff / max_ref;
}

std::vector<double> ToDoubles(const Tensor& tensor) {
  const std::vector<float> floats = tensor.ToFloats();
  return std::vector<double>(floats.begin(), floats.end());
}

Tensor ToTensor(const std::vector<double>& values, std::vector<int64_t> shape, DType dtype) {
  const std::vector<float> floats(values.begin(), values.end());
  return Tensor::FromFloats(std::move(shape), floats).CastTo(dtype);
}

std::vector<double> RoundTo(const std::vector<double>& values, DType dtype) {
  return ToDoubles(ToTensor(values, {static_cast<int64_t>(values.size())}, dtype));
}

std::vector<double> SliceRows(const std::vector<double>& values, int cols, int64_t begin,
                              int64_t end) {
  return std::vector<double>(values.begin() + begin * cols, values.begin() + end * cols);
}

std::vector<int64_t> IotaPositions(int64_t n, int64_t offset) {
  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[i] = offset + i;
  return positions;
}

}  // namespace attnserve::reference
