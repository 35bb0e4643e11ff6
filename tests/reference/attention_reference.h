// An independent float64 reference for one attention layer, and helpers shared by the tests.
//
// The reference is deliberately naive: plain loops, the full [L, L] score matrix, a two-pass
// softmax, no paging, no online softmax and no shared code with the backends beyond the public
// types (LayerSpec, LayerWeights, Tensor). Its semantics are those of Hugging Face transformers:
//   MHA/MQA/GQA: LlamaAttention / MistralAttention (rotate_half RoPE, sliding window i-W < j <= i);
//                ALiBi as BloomAttention / MptAttention add it.
//   MLA:         DeepseekV3Attention (q_lora optional, RMSNorm on the q and kv latents, the RoPE
//                key shared by all heads). For the interleaved layout transformers permutes the
//                rotary dims and then rotates halves; q.k is the same as rotating adjacent pairs
//                (x[2i], x[2i+1]), which is what this reference does.
// Masks are defined on a token's index within its sequence, never on its RoPE position.
#ifndef ATTNSERVE_TESTS_REFERENCE_ATTENTION_REFERENCE_H_
#define ATTNSERVE_TESTS_REFERENCE_ATTENTION_REFERENCE_H_

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "kernels/core/tensor.h"
#include "kernels/model/layer_weights.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve::reference {

struct ReferenceOptions {
  // When set, the values a KV cache stores are rounded to this dtype before attention, as a
  // backend with that cache dtype would see them: MHA/MQA/GQA keys (after RoPE) and values; MLA
  // latent c_kv (after kv_a_layernorm) and shared RoPE key k_pe (after RoPE).
  std::optional<DType> kv_round;
};

// One layer's attention over a single whole sequence of L tokens.
//   hidden:    [L, d_model] row-major.
//   positions: [L] RoPE positions (ignored without RoPE). Masks use the row index instead.
//   returns    [L, d_model] row-major: o_proj of the concatenated heads (+ o_proj.bias).
// Weights may be of any dtype; they are read as the float values they hold. The spec and weights
// are assumed valid (ValidateLayerSpec / ValidateLayerWeights); this is test code.
std::vector<double> ReferenceAttention(const LayerSpec& spec, const LayerWeights& weights,
                                       const std::vector<double>& hidden,
                                       const std::vector<int64_t>& positions,
                                       const ReferenceOptions& options = {});

// ALiBi's per-head slopes [num_heads] as transformers computes them (build_alibi_tensor for
// kBloom, build_mpt_alibi_tensor for kMpt), in double; empty without ALiBi.
std::vector<double> AlibiSlopesReference(const LayerSpec& spec);

// Applies RoPE in place to `x` [rotary_dim] at `position`: inv_freq[i] = theta^(-2i/rotary_dim);
// kHalf rotates (x[i], x[i + d/2]), kInterleaved rotates (x[2i], x[2i + 1]); kNone does nothing.
void ApplyRopeReference(RopeLayout layout, double theta, int64_t position, double* x,
                        int rotary_dim);

// ---- Helpers ------------------------------------------------------------------------------------

// `rows * cols` independent N(0, stddev^2) values.
std::vector<double> RandomHidden(int64_t rows, int cols, std::mt19937_64& rng, double stddev = 2.0);

// Replaces every RMSNorm scale (q_a_layernorm.weight, kv_a_layernorm.weight) with values drawn
// from U(0.5, 1.5), so that tests notice a backend that ignores them. No-op for other variants.
void PerturbNormScales(LayerWeights& weights, std::mt19937_64& rng);

// ||actual - expected||_2 / ||expected||_2 in double. +infinity on a size mismatch, NaN when
// either side holds a NaN (so that every comparison with a bound fails).
double RelativeError(const std::vector<double>& actual, const std::vector<double>& expected);

// Max |actual - expected| / (max |expected|); same conventions as RelativeError.
double MaxRelativeError(const std::vector<double>& actual, const std::vector<double>& expected);

// The tensor's values (any dtype) widened to double.
std::vector<double> ToDoubles(const Tensor& tensor);

// A tensor of `dtype` and `shape` holding `values` rounded to float32 and then to `dtype`
// (round to nearest even at each step).
Tensor ToTensor(const std::vector<double>& values, std::vector<int64_t> shape, DType dtype);

// `values` rounded as ToTensor would and widened back: what a backend sees of them in `dtype`.
std::vector<double> RoundTo(const std::vector<double>& values, DType dtype);

// Rows [begin, end) of a row-major [*, cols] matrix.
std::vector<double> SliceRows(const std::vector<double>& values, int cols, int64_t begin,
                              int64_t end);

// 0, 1, ..., n - 1 shifted by `offset`.
std::vector<int64_t> IotaPositions(int64_t n, int64_t offset = 0);

}  // namespace attnserve::reference

#endif  // ATTNSERVE_TESTS_REFERENCE_ATTENTION_REFERENCE_H_
