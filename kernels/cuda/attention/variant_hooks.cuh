// The model-family variations of MHA/MQA/GQA attention as small hooks (FlashInfer's variants.cuh
// idea): the kernels (paged_attention.cuh, prefill_mma.cuh, combine.cuh, rope_append.cuh) call
// these at fixed points and never branch on a variant's fields in their bodies.
//   pre-RoPE    RmsNormHead     q/k RMSNorm (Qwen3: scale w; Gemma 3: 1 + w, folded on the host)
//   logits      TransformLogit  Gemma 2's soft-cap of the scaled score, then ALiBi's bias
//                               (slope from AlibiSlope, once per row), before the softmax
//   finish      JoinSink        gpt-oss's learned sink: one more column of a row's softmax
//               OutputScale     what a row's unnormalised O is multiplied by (1 / l, sink joined)
// Each is the arithmetic of the CPU backend (kernels/cpu/gqa_layer.cc, simd_kernels.cc,
// decode_attention.cc, prefill_attention.cc), which the emulated tests compare against. Written
// against simt.h, so they run on the device and on the CPU block emulator alike.
#ifndef ATTNSERVE_KERNELS_CUDA_ATTENTION_VARIANT_HOOKS_CUH_
#define ATTNSERVE_KERNELS_CUDA_ATTENTION_VARIANT_HOOKS_CUH_

#include <cmath>

#include "kernels/cuda/attention/params.h"
#include "kernels/cuda/simt/simt.h"

namespace attnserve::cuda {

// x[0, dim) <- x * inv_rms(x) * scale, inv_rms = 1 / sqrt(mean(x^2) + eps). One thread per head:
// the sum of squares in fp64 and index order, as the CPU's GqaLayer::NormalizeHeads, so both
// backends round the same value.
ATTNSERVE_SIMT void RmsNormHead(float* x, int dim, const float* scale, double eps) {
  double sum_sq = 0.0;
  for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv_rms = static_cast<float>(1.0 / sqrt(sum_sq / dim + eps));
  for (int i = 0; i < dim; ++i) x[i] = x[i] * inv_rms * scale[i];
}

// ALiBi's slope of query head `head`, 0 without ALiBi. AlibiBias::Slope itself (the CPU's value,
// fp64 rounded once); it loops and calls exp2, so the kernels take it once per row, not per key.
ATTNSERVE_SIMT float AlibiSlope(const AttentionVariantParams& v, int head) {
  return v.alibi.active() ? v.alibi.Slope(head) : 0.0f;
}

// A visible key's scaled score s (q.k * scale) as the softmax sees it: cap * tanh(s / cap) with a
// soft-cap, then + slope * (key - query) with ALiBi, in AttentionVariation::TransformLogits' order
// and arithmetic. `slope` is AlibiSlope of the row's head; `key_minus_query` is the key's index
// minus the query's, both indices in the sequence (the CPU's LogitSite), never RoPE positions.
// Masked keys stay -inf and never reach this (tanh would make them finite).
ATTNSERVE_SIMT float TransformLogit(const AttentionVariantParams& v, float s, float slope,
                                    int key_minus_query) {
  if (v.softcap > 0.0f) s = v.softcap * tanhf(s * (1.0f / v.softcap));
  if (v.alibi.active()) s += slope * static_cast<float>(key_minus_query);
  return s;
}

// The sink's share of a softmax denominator whose running max is *max: raises *max to the sink
// when larger and returns exp(sink - *max); 0 (and *max untouched) without sinks.
ATTNSERVE_SIMT float JoinSink(const AttentionVariantParams& v, int head, float* max) {
  if (v.sinks == nullptr) return 0.0f;
  const float sink = v.sinks[head];
  *max = fmaxf(*max, sink);
  return expf(sink - *max);
}

// A finished row's output is O * OutputScale(...), O unnormalised under running max m and sum l:
// 1 / l, or with a sink exp(m - M) / (l exp(m - M) + exp(sink - M)), M = max(m, sink). 0 for a row
// that saw no key (O = 0).
ATTNSERVE_SIMT float OutputScale(const AttentionVariantParams& v, int head, float m, float l) {
  float max = m;
  const float sink = JoinSink(v, head, &max);
  const float rescale = m == -INFINITY ? 0.0f : expf(m - max);
  const float total = l * rescale + sink;
  return total > 0.0f ? rescale / total : 0.0f;
}

}  // namespace attnserve::cuda

#endif  // ATTNSERVE_KERNELS_CUDA_ATTENTION_VARIANT_HOOKS_CUH_
