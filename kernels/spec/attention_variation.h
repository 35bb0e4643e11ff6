// The attention variations of the model families, one policy type each, composed once per layer
// into an AttentionVariation that the kernels call through hooks instead of branching on spec
// fields (the FlashInfer "variant" shape: logits transform, mask, softmax extra term).
//
//   KeyWindow      mask: which keys a query may see (causal, Mistral sliding window).
//   LogitSoftCap   logits transform: s = cap * tanh(s / cap) (Gemma 2).
//   AlibiBias      score bias: slope_h * (key - query) on each logit (BLOOM, MPT).
//   SoftmaxSinks   softmax extra term: one learned logit per head in every row's softmax (gpt-oss).
//   HeadRmsNorm    pre-RoPE transform: RMSNorm of q and k, per head (Qwen3, Gemma 3) or over all
//                  heads of a row at once (OLMo 2); LayerNorm per head (StableLM 2, Cohere).
//   RotaryPositions  position embedding: RoPE's rotation of q and k, half or interleaved pairs,
//                  partial rotary dims (Phi, GPT-J), YaRN's cos/sin factor.
//
// Why: a variation used to be a field threaded through LayerSpec, both params structs and every
// kernel body (16-24 files each, docs/design.md). Now a new one is a type here, a field of the
// spec and its mapping; the kernels call AttentionVariation's hooks and do not change.
//
// nvcc-safe: the hooks are ATTNSERVE_HD and the types hold plain values and pointers to data the
// layer owns (sinks, norm scales, RoPE frequencies), so CUDA kernels can take an
// AttentionVariation by value. Only FromSpec, which reads a LayerSpec (absl), is host-only.
#ifndef ATTNSERVE_KERNELS_SPEC_ATTENTION_VARIATION_H_
#define ATTNSERVE_KERNELS_SPEC_ATTENTION_VARIATION_H_

#include <math.h>

#include <cstdint>

#include "kernels/core/host_device.h"

#if !defined(__CUDACC__)
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/spec/rope_frequencies.h"
#endif

namespace attnserve {

// The one rule for which keys a query may see (VisibleKeyRange), shared by the CPU backend
// (KeyWindow below, 64-bit indices) and the CUDA kernels and their host planner (MaskSpec,
// kernels/cuda/attention/params.h, 32-bit indices).
//
// Causal with a Mistral sliding window W: the query at index i sees keys j with i - W < j <= i
// (W = 0: all j <= i). Non-causal: every key of the sequence, including those after the query.
// Indices are a token's index in its sequence (transformers' cache_position), never its RoPE
// position.
// Half-open [*begin, *end) of the keys visible to query index `query` of a sequence that holds
// `length` tokens.
template <typename Index>
ATTNSERVE_HD inline void VisibleKeyRange(bool causal, Index window, Index query, Index length,
                                         Index* begin, Index* end) {
  if (!causal) {
    *begin = 0;
    *end = length;
    return;
  }
  *begin = (window > 0 && query - window + 1 > 0) ? query - window + 1 : 0;
  *end = query + 1;
}

// Half-open range of key indices [begin, end) within a sequence.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
};

// Where one row of logits sits: its query head, the query's index in its sequence and the index
// of the row's first key (indices as the mask uses them, never RoPE positions).
struct LogitSite {
  int head = 0;
  int64_t query = 0;
  int64_t first_key = 0;
};

// Mask: the rule of VisibleKeyRange above with the spec's parameters.
struct KeyWindow {
  bool causal = true;
  int64_t window = 0;  // Sliding window in tokens; 0 = unlimited.

  // Keys visible to the query at index `query` of a sequence that holds `length` tokens.
  ATTNSERVE_HD KeyRange VisibleKeys(int64_t query, int64_t length) const {
    KeyRange keys;
    VisibleKeyRange<int64_t>(causal, window, query, length, &keys.begin, &keys.end);
    return keys;
  }
};

// Logits transform: Gemma 2's soft-capping of the scaled scores, as transformers computes it.
struct LogitSoftCap {
  float cap = 0.0f;  // 0 = none.

  ATTNSERVE_HD bool active() const { return cap > 0.0f; }
  ATTNSERVE_HD void Apply(float* s, int64_t n) const {
    const float inv_cap = 1.0f / cap;
    for (int64_t i = 0; i < n; ++i) s[i] = cap * tanhf(s[i] * inv_cap);
  }
};

// Score bias: ALiBi's slope_h * (j - i) for query i, key j (LayerSpec::alibi). Softmax is
// invariant to a per-row constant, so this equals BLOOM's slope * j and MPT's slope * (j - L + 1)
// while keeping the added values small. Slopes are computed per head in double and rounded once.
struct AlibiBias {
  int kind = 0;  // 0 none, 1 BLOOM's slopes, 2 MPT's (Alibi's values).
  int num_heads = 0;
  float bias_max = 8.0f;  // MPT's alibi_bias_max.

  ATTNSERVE_HD bool active() const { return kind != 0; }

  ATTNSERVE_HD float Slope(int head) const {
    if (kind == 1) {  // build_alibi_tensor: p = the largest power of two <= num_heads.
      int p = 1;
      while (p * 2 <= num_heads) p *= 2;
      const double exponent = head < p ? -8.0 * (head + 1) / p : -4.0 * (2 * (head - p) + 1) / p;
      return static_cast<float>(exp2(exponent));
    }
    int n = 1;  // build_mpt_alibi_tensor: n = the smallest power of two >= num_heads.
    while (n < num_heads) n *= 2;
    // With n > num_heads the slopes are taken odd indices first, then even.
    const int i = n == num_heads ? head : (head < n / 2 ? 2 * head + 1 : 2 * (head - n / 2));
    return static_cast<float>(exp2(-(i + 1) * static_cast<double>(bias_max) / n));
  }

  ATTNSERVE_HD void Apply(float* s, int64_t n, const LogitSite& site) const {
    const float slope = Slope(site.head);
    const int64_t offset = site.first_key - site.query;
    for (int64_t k = 0; k < n; ++k) s[k] += slope * static_cast<float>(offset + k);
  }
};

// Softmax extra term: gpt-oss's sink, one logit per query head that joins the row's softmax (its
// max and its sum) once, after every key, and is dropped from the output.
struct SoftmaxSinks {
  const float* logits = nullptr;  // [num_heads], owned by the layer; null = none.

  // Given a row's online-softmax max and sum over its keys, adds the sink to `*sum` (rescaled to
  // the new max) and returns the factor the row's unnormalised output takes; 1 without sinks.
  ATTNSERVE_HD float Join(int head, float max, float* sum) const {
    if (logits == nullptr) return 1.0f;
    const float sink = logits[head];
    const float new_max = max > sink ? max : sink;
    const float rescale = expf(max - new_max);  // 0 for a row that saw no key.
    *sum = *sum * rescale + expf(sink - new_max);
    return rescale;
  }
};

// Pre-RoPE transform: RMSNorm of q and k in float32, x / sqrt(mean(x^2) + eps) times a scale:
// per head over head_dim with a scale of [head_dim] (w for Qwen3RMSNorm, 1 + w for Gemma3RMSNorm,
// resolved by the layer), or, with `across_heads`, over a row's heads at once, as OLMo 2 norms
// the whole projection before splitting it into heads, with a scale of [heads * head_dim].
// With `centred` it is LayerNorm without bias, (x - mean) / sqrt(var + eps), var the mean of the
// centred squares, per head with each head's own scale (`per_head_scales`, [heads * head_dim]):
// StableLmLayerNormPerHead, CohereLayerNorm.
struct HeadRmsNorm {
  const float* q_scale = nullptr;  // [head_dim], or [num_heads * head_dim] across heads or per
                                   // head; owned by the layer; null = no q/k norm.
  const float* k_scale = nullptr;  // [head_dim], or [num_kv_heads * head_dim].
  double eps = 1e-6;
  int dim = 0;                    // head_dim
  bool across_heads = false;      // One norm over the `count` heads of Apply (OLMo 2).
  bool centred = false;           // Subtract the mean first: LayerNorm (StableLM 2, Cohere).
  bool per_head_scales = false;   // Head h's scale at scale + h * dim.

  ATTNSERVE_HD bool active() const { return q_scale != nullptr; }
  // `count` consecutive head vectors of `dim` floats at x (one row's q or k heads), in place:
  // each normed alone, or all of them as one vector of count * dim with `across_heads`.
  ATTNSERVE_HD void Apply(float* x, int64_t count, const float* scale) const {
    const int64_t width = across_heads ? count * dim : dim;
    for (int64_t v = 0; v < count * dim; v += width) {
      float* part = x + v;
      const float* part_scale = per_head_scales ? scale + v : scale;
      double sum = 0.0;
      if (centred) {
        for (int64_t i = 0; i < width; ++i) sum += part[i];
      }
      const double mean = sum / width;  // 0 for RMSNorm: x - 0 is x, bit for bit.
      double sum_sq = 0.0;
      for (int64_t i = 0; i < width; ++i) sum_sq += (part[i] - mean) * (part[i] - mean);
      const float inv_rms = static_cast<float>(1.0 / sqrt(sum_sq / width + eps));
      const float mean_f = static_cast<float>(mean);
      for (int64_t i = 0; i < width; ++i) part[i] = (part[i] - mean_f) * inv_rms * part_scale[i];
    }
  }
};

// Position embedding: RoPE (transformers' apply_rotary_pos_emb), rotating pairs of the first
// rotary_dim dims of each q and k head vector by position * inv_freq[i] radians. Pair i is
// (x[i], x[i + rotary_dim / 2]) in the half layout (Llama), (x[2i], x[2i + 1]) interleaved
// (DeepSeek's rope_interleave, GPT-J); rotary_dim < head_dim is partial rotary (the rest passes
// through). Angles are computed in double: float32 angles (as some implementations do) lose
// ~position * 2^-24 radians, visible past a few thousand. cos and sin are rounded to float, then
// multiplied by the attention factor in float32 (transformers: emb.cos() * attention_scaling).
//
// A row's heads share one position, so a caller computes a row's cos/sin once (FillTable, or a
// thread per pair with PairCosSin) and rotates every head with it (Rotate, or RotatePair);
// RotateRows does both for a block of rows.
struct RotaryPositions {
  const double* inv_freq = nullptr;  // [rotary_dim / 2] (RopeInverseFrequencies), owned by the
                                     // layer; unused when rotary_dim is 0.
  int rotary_dim = 0;                // 0 = no RoPE.
  bool interleaved = false;
  float attention_factor = 1.0f;  // RopeAttentionFactor: YaRN's; 1 otherwise.

  ATTNSERVE_HD bool active() const { return rotary_dim > 0; }
  ATTNSERVE_HD int pairs() const { return rotary_dim / 2; }

  // cos and sin of pair i at `position`.
  ATTNSERVE_HD void PairCosSin(int64_t position, int i, float* cos_out, float* sin_out) const {
    const double angle = static_cast<double>(position) * inv_freq[i];
    double s, c;
#if defined(__CUDA_ARCH__)
    sincos(angle, &s, &c);
#else
    s = sin(angle);
    c = cos(angle);
#endif
    *cos_out = static_cast<float>(c) * attention_factor;
    *sin_out = static_cast<float>(s) * attention_factor;
  }

  // Pair i of the head vector `in` rotated by (c, s) into `out` (which may be `in`):
  // (a, b) -> (a c - b s, b c + a s).
  ATTNSERVE_HD void RotatePair(const float* in, float* out, int i, float c, float s) const {
    const int ia = interleaved ? 2 * i : i;
    const int ib = interleaved ? 2 * i + 1 : i + rotary_dim / 2;
    const float a = in[ia], b = in[ib];
    // Written out with its roundings, so that every caller gets the same floats however the
    // compiler inlines and vectorises it (C++ lets a * c - b * s contract into an FMA, and GCC
    // contracted the table and the pair loops differently): one FMA with the other product
    // rounded where the target has FMA (the form GCC gave cpu/rope.cc's loop: the same floats,
    // checked bit for bit when this replaced it; nvcc contracts by default too), two products and
    // a sum where it has none, which cannot contract.
#if defined(__CUDA_ARCH__) || defined(__FMA__)
    out[ia] = fmaf(a, c, -(b * s));
    out[ib] = fmaf(b, c, a * s);
#else
    out[ia] = a * c - b * s;
    out[ib] = b * c + a * s;
#endif
  }

  // One row's cos_table[i] and sin_table[i], i < pairs(), at `position`.
  ATTNSERVE_HD void FillTable(int64_t position, float* cos_table, float* sin_table) const {
    for (int i = 0; i < pairs(); ++i) PairCosSin(position, i, &cos_table[i], &sin_table[i]);
  }

  // Rotates `count` head vectors `stride` floats apart from x, in place, with one row's table.
  ATTNSERVE_HD void Rotate(float* x, int64_t count, int64_t stride, const float* cos_table,
                           const float* sin_table) const {
    for (int64_t head = 0; head < count; ++head) {
      float* v = x + head * stride;
      for (int i = 0; i < pairs(); ++i) RotatePair(v, v, i, cos_table[i], sin_table[i]);
    }
  }

  // Host loop of the two above: in each of `rows` rows `row_stride` floats apart from x, rotates
  // `count` head vectors `stride` apart in place, row r at positions[r]. `table` is scratch of
  // rotary_dim floats, one row's cos and sin, computed once per row, not per head.
  ATTNSERVE_HD void RotateRows(float* x, int64_t rows, int64_t row_stride, int64_t count,
                               int64_t stride, const int64_t* positions, float* table) const {
    float* cos_table = table;
    float* sin_table = table + pairs();
    for (int64_t r = 0; r < rows; ++r) {
      FillTable(positions[r], cos_table, sin_table);
      Rotate(x + r * row_stride, count, stride, cos_table, sin_table);
    }
  }
};

// The data a variation needs from the weights and the spec, owned by the layer and outliving the
// variation.
struct VariationWeights {
  const float* sinks = nullptr;    // [num_heads]; null without attention_sinks.
  const float* q_scale = nullptr;  // QkNormWidth(spec, num_heads) floats; null without qk_norm.
  const float* k_scale = nullptr;  // QkNormWidth(spec, num_kv_heads) floats.
  // RopeInverseFrequencies(spec); null without RoPE, or where the caller sets rope.inv_freq
  // itself (the CUDA layers point it at a device copy).
  const double* rope_inv_freq = nullptr;
};

// Every variation of one layer, built once at layer creation (FromSpec) and passed by value to the
// kernels, which call only these hooks.
struct AttentionVariation {
  float scale = 1.0f;  // Multiplies q.k (EffectiveSoftmaxScale).
  KeyWindow mask;
  LogitSoftCap softcap;
  AlibiBias alibi;
  SoftmaxSinks sinks;
  HeadRmsNorm qk_norm;
  RotaryPositions rope;

  // Logits transform of one row: `s` holds scale * q.k of `n` keys from site.first_key on, all
  // visible to the query; rewritten in place to the logits the softmax takes: soft-capped, then
  // biased (a bias is part of the mask, which transformers adds after any capping).
  ATTNSERVE_HD void TransformLogits(float* s, int64_t n, const LogitSite& site) const {
    if (softcap.active()) softcap.Apply(s, n);
    if (alibi.active()) alibi.Apply(s, n, site);
  }

#if !defined(__CUDACC__)
  static AttentionVariation FromSpec(const LayerSpec& spec, const VariationWeights& weights = {}) {
    AttentionVariation v;
    v.scale = EffectiveSoftmaxScale(spec);
    v.mask = {spec.causal, spec.sliding_window};
    v.softcap.cap = spec.attn_logit_softcapping;
    static_assert(static_cast<int>(Alibi::kBloom) == 1 && static_cast<int>(Alibi::kMpt) == 2);
    v.alibi = {static_cast<int>(spec.alibi), spec.num_heads, spec.alibi_bias_max};
    v.sinks.logits = spec.attention_sinks ? weights.sinks : nullptr;
    if (spec.qk_norm != QkNorm::kNone) {
      const bool layer_norm = spec.qk_norm == QkNorm::kLayerNorm;
      v.qk_norm = {weights.q_scale, weights.k_scale, spec.qk_norm_eps, spec.head_dim,
                   spec.qk_norm == QkNorm::kRmsAcrossHeads, layer_norm, layer_norm};
    }
    if (RotaryDim(spec) > 0) {
      v.rope = {weights.rope_inv_freq, RotaryDim(spec), spec.rope == RopeLayout::kInterleaved,
                static_cast<float>(RopeAttentionFactor(spec))};
    }
    return v;
  }
#endif
};

#if !defined(__CUDACC__)
// The variations as the backends' capability tables name them (BackendCapabilities::variations,
// kernels/capabilities.h), declared once, beside their hooks: which spec uses each and how a
// refusal names it. capabilities.cc's one rule refuses a used variation a table does not list; the
// CPU table lists every one (it runs every hook); GetServerInfo reports the names. A new variation
// is a row here, not a capability field, rule, proto field and report row of its own.
struct NamedVariation {
  const char* name;        // In the tables and on the wire: "qk_norm=rms", "alibi", ...
  const char* field;       // The spec field a refusal names.
  const char* short_name;  // The README family table's refusal: "qk_norm", "soft-cap", ...
  const char* what;        // "the <BACKEND> backend does not implement <what> yet".
  // The field's value as a refusal quotes it when `spec` uses the variation; empty otherwise.
  std::string (*used)(const LayerSpec& spec);
};

inline std::string QkNormUsed(const LayerSpec& spec, QkNorm kind) {
  return spec.qk_norm == kind ? std::string(QkNormName(kind)) : "";
}

// In the order refusals list them.
inline const std::vector<NamedVariation>& NamedVariations() {
  static const std::vector<NamedVariation>* const table = new std::vector<NamedVariation>{
      {"qk_norm=rms", "qk_norm", "qk_norm", "q/k norm",
       [](const LayerSpec& s) { return QkNormUsed(s, QkNorm::kRms); }},
      {"qk_norm=rms_unit_offset", "qk_norm", "qk_norm", "q/k norm",
       [](const LayerSpec& s) { return QkNormUsed(s, QkNorm::kRmsUnitOffset); }},
      {"qk_norm=rms_across_heads", "qk_norm", "q/k norm across heads",
       "q/k norm across heads (OLMo 2)",
       [](const LayerSpec& s) { return QkNormUsed(s, QkNorm::kRmsAcrossHeads); }},
      {"qk_norm=layer_norm", "qk_norm", "q/k LayerNorm", "q/k LayerNorm (StableLM 2, Cohere)",
       [](const LayerSpec& s) { return QkNormUsed(s, QkNorm::kLayerNorm); }},
      {"partial_rotary", "rotary_dim", "rotary_dim", "partial rotary",
       [](const LayerSpec& s) {
         return s.rotary_dim == 0 || s.rotary_dim == s.head_dim
                    ? std::string()
                    : absl::StrCat(s.rotary_dim, " (of head_dim ", s.head_dim, ")");
       }},
      {"logit_softcapping", "attn_logit_softcapping", "soft-cap", "logit soft-capping",
       [](const LayerSpec& s) {
         return s.attn_logit_softcapping == 0.0f ? std::string()
                                                 : absl::StrCat(s.attn_logit_softcapping);
       }},
      {"attention_sinks", "attention_sinks", "sinks", "attention sinks",
       [](const LayerSpec& s) { return std::string(s.attention_sinks ? "true" : ""); }},
      {"alibi", "alibi", "ALiBi", "ALiBi",
       [](const LayerSpec& s) {
         return s.alibi == Alibi::kNone ? std::string() : std::string(AlibiName(s.alibi));
       }},
      {"sliding_window", "sliding_window", "sliding window", "sliding windows",
       [](const LayerSpec& s) {
         return s.sliding_window == 0 ? std::string() : absl::StrCat(s.sliding_window);
       }},
      {"non_causal", "causal", "non-causal", "non-causal attention",
       [](const LayerSpec& s) { return std::string(s.causal ? "" : "false"); }},
  };
  return *table;
}
#endif

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_ATTENTION_VARIATION_H_
