// The description of one attention layer: variant, sizes, positional encoding and masking.
//
// Semantics follow Hugging Face `transformers` (LlamaAttention, MistralAttention,
// DeepseekV3Attention) so that a checkpoint's layer behaves here as it does there.
#ifndef ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_H_
#define ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/core/tensor.h"

namespace attnserve {

enum class AttentionVariant : uint8_t {
  kMHA,  // num_kv_heads == num_heads.
  kMQA,  // num_kv_heads == 1.
  kGQA,  // 1 <= num_kv_heads <= num_heads, num_heads % num_kv_heads == 0.
  kMLA,  // DeepSeek-V2/V3 multi-head latent attention (the mla_* fields below).
};

// "mha", "mqa", "gqa", "mla".
absl::string_view VariantName(AttentionVariant variant);
absl::StatusOr<AttentionVariant> ParseVariant(absl::string_view name);

enum class RopeLayout : uint8_t {
  kNone,         // No rotary embedding.
  kHalf,         // Rotate (x[i], x[i + d/2]) pairs: Llama, Mistral, Qwen2 (rotate_half).
  kInterleaved,  // Rotate (x[2i], x[2i + 1]) pairs: DeepSeek-V3 (rope_interleave=True), GPT-J.
};

absl::string_view RopeLayoutName(RopeLayout layout);
absl::StatusOr<RopeLayout> ParseRopeLayout(absl::string_view name);

// How the RoPE frequencies are stretched for contexts longer than pre-training (Hugging Face
// config.json "rope_scaling"). Semantics are transformers' modeling_rope_utils.py (the version
// pinned in tests/peer/requirements.txt); kernels/spec/rope_frequencies.h computes them.
enum class RopeScalingType : uint8_t {
  kNone,     // Plain theta^(-2i/d) (rope_type "default").
  kLinear,   // Every inverse frequency divided by factor (_compute_linear_scaling_rope_parameters).
  kDynamic,  // Dynamic NTK: frequencies depend on the batch's longest position; refused (see .cc).
  kLlama3,   // Llama 3.1 band-wise interpolation (_compute_llama3_parameters).
  kYarn,     // YaRN ramp + attention factor (_compute_yarn_parameters); DeepSeek-V2/V3, Qwen.
};

// "none", "linear", "dynamic", "llama3", "yarn".
absl::string_view RopeScalingTypeName(RopeScalingType type);
absl::StatusOr<RopeScalingType> ParseRopeScalingType(absl::string_view name);

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                       // linear, llama3, yarn: >= 1.
  int original_max_position_embeddings = 0;  // llama3, yarn: the pre-training context, >= 1.
  double low_freq_factor = 1.0;              // llama3.
  double high_freq_factor = 4.0;             // llama3: > low_freq_factor.
  double beta_fast = 32.0;                   // yarn: ramp boundary (rotations), > 0.
  double beta_slow = 1.0;                    // yarn: ramp boundary (rotations), > 0.
  // yarn: 0 = absent. With both set, cos/sin are multiplied by mscale(factor, mscale) /
  // mscale(factor, mscale_all_dim), else by mscale(factor, 1); for MLA a non-zero mscale_all_dim
  // also multiplies the default softmax scale by mscale(factor, mscale_all_dim)^2 (as
  // DeepseekV3Attention does). mscale(s, m) = 0.1 * m * ln(s) + 1 for s > 1, else 1.
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  // yarn: round the ramp's correction range out to whole pairs (find_correction_range's
  // truncate, default True); gpt-oss sets false and ramps between the fractional bounds.
  bool truncate = true;
};

struct MlaDims {
  int q_lora_rank = 0;       // 0: queries use a plain q_proj; else q_a_proj -> RMSNorm -> q_b_proj.
  int kv_lora_rank = 0;      // Width of the cached latent c_kv.
  int qk_nope_head_dim = 0;  // Per-head query/key width without RoPE.
  int qk_rope_head_dim = 0;  // Width of the decoupled RoPE part (key shared by all heads).
  int v_head_dim = 0;        // Per-head value width.
  float rms_norm_eps = 1e-6f;  // For q_a_layernorm and kv_a_layernorm.
};

// A norm of q and k after the projections and before RoPE, computed in float32: RMSNorm
// x / sqrt(mean(x^2) + qk_norm_eps), or LayerNorm (x - mean(x)) / sqrt(var(x) + qk_norm_eps), times
// a learned scale ("q_norm.weight", "k_norm.weight"), per head over head_dim (scales of
// [head_dim], one for all heads, or one per head) or over the whole projection (scales of
// [num_heads * head_dim] for q and [num_kv_heads * head_dim] for k: QkNormWidth).
enum class QkNorm : uint8_t {
  kNone,
  kRms,  // Per head, scale w (Qwen3RMSNorm).
  // Per head, scale (1 + w) (Gemma3RMSNorm; the stored weight is the offset from 1).
  kRmsUnitOffset,
  // Over all heads of a token at once, scale w (Olmo2RMSNorm on q_proj's and k_proj's whole
  // output).
  kRmsAcrossHeads,
  // LayerNorm per head without bias, each head its own scale w: [num_heads, head_dim] and
  // [num_kv_heads, head_dim] (StableLmLayerNormPerHead; CohereLayerNorm with use_qk_norm).
  kLayerNorm,
};

// "none", "rms", "rms_unit_offset", "rms_across_heads", "layer_norm".
absl::string_view QkNormName(QkNorm norm);
absl::StatusOr<QkNorm> ParseQkNorm(absl::string_view name);

// ALiBi (Press et al. 2022): no position embedding; each head h adds slope_h * (j - i) to the
// logit of key j for query i (indices in the sequence, as the mask). Only the slopes differ:
enum class Alibi : uint8_t {
  kNone,
  // transformers' build_alibi_tensor (BLOOM): for the largest power of two p <= num_heads,
  // slope_h = 2^(-8 (h + 1) / p); the heads past p take the odd powers of 2^(-4 / p).
  kBloom,
  // transformers' build_mpt_alibi_tensor (MPT): for the smallest power of two n >= num_heads,
  // s_i = 2^(-(i + 1) alibi_bias_max / n); when n > num_heads the odd i first, then the even.
  kMpt,
};

// "none", "bloom", "mpt".
absl::string_view AlibiName(Alibi alibi);
absl::StatusOr<Alibi> ParseAlibi(absl::string_view name);

struct LayerSpec {
  AttentionVariant variant = AttentionVariant::kMHA;
  int d_model = 0;        // Hidden size of the layer's input and output.
  int num_heads = 0;      // Query heads.
  int num_kv_heads = 0;   // Key/value heads (MHA/MQA/GQA). Ignored for MLA.
  int head_dim = 0;       // Per-head width of q, k, v (MHA/MQA/GQA); need not be d_model/num_heads.
  bool qkv_bias = false;  // Bias on q_proj, k_proj and v_proj (MHA/MQA/GQA only).
  bool o_bias = false;    // Bias on o_proj (MHA/MQA/GQA only).

  RopeLayout rope = RopeLayout::kNone;
  double rope_theta = 10000.0;  // Base of the RoPE frequencies: theta^(-2i/rotary_dim).
  RopeScaling rope_scaling;     // type kNone: the plain frequencies above.

  bool causal = true;
  // Mistral semantics: the query at position i sees keys j with i - W < j <= i (the last W tokens,
  // itself included). 0 = unlimited. Requires causal.
  int sliding_window = 0;
  // Multiplies q.k. 0 = 1/sqrt(qk head dim) (head_dim, or qk_nope + qk_rope for MLA). Gemma 2/3's
  // query_pre_attn_scalar s is softmax_scale = s^-0.5.
  float softmax_scale = 0.0f;

  MlaDims mla;

  // The variations below are MHA/MQA/GQA only (MLA refuses them: DeepseekV3Attention has none).
  // 0 = RoPE rotates the whole head; else only the leading rotary_dim dims of each q/k head (even,
  // <= head_dim), the rest pass through: transformers' partial_rotary_factor, rotary_dim =
  // int(head_dim * partial_rotary_factor) (Phi-3/Phi-4-mini, GPT-NeoX). Frequencies use
  // rotary_dim: theta^(-2i/rotary_dim).
  int rotary_dim = 0;
  // Qwen3: kRms; Gemma 3: kRmsUnitOffset; OLMo 2: kRmsAcrossHeads; StableLM 2, Cohere: kLayerNorm.
  QkNorm qk_norm = QkNorm::kNone;
  float qk_norm_eps = 1e-6f;
  // 0 = none; else the scaled scores s become cap * tanh(s / cap) before masking and softmax
  // (Gemma 2's attn_logit_softcapping).
  float attn_logit_softcapping = 0.0f;
  // gpt-oss: a learned logit per query head ("sinks" [num_heads]) joins every query row's softmax
  // as one more column and is dropped after it, so the row's weights sum to less than 1.
  bool attention_sinks = false;
  // Linear biases instead of (or with) RoPE (BLOOM, MPT); MHA/MQA/GQA only.
  Alibi alibi = Alibi::kNone;
  float alibi_bias_max = 8.0f;  // kMpt's slope range (MPT's attn_config.alibi_bias_max), > 0.
};

// OK, or INVALID_ARGUMENT naming the offending field and the rule it breaks.
absl::Status ValidateLayerSpec(const LayerSpec& spec);

// transformers' get_mscale / yarn_get_mscale: 0.1 * mscale * ln(scale) + 1, or 1 when scale <= 1.
double YarnMscale(double scale, double mscale);

// Width of one head's q and k (MLA: qk_nope_head_dim + qk_rope_head_dim).
int QkHeadDim(const LayerSpec& spec);
// Width of one head's v and attention output (MLA: v_head_dim).
int VHeadDim(const LayerSpec& spec);
// Width of the rotated part of q and k: rotary_dim when set, else head_dim, or qk_rope_head_dim
// for MLA; 0 without RoPE.
int RotaryDim(const LayerSpec& spec);
// Floats in the q/k norm's scale for `heads` heads (num_heads: q_norm.weight; num_kv_heads:
// k_norm.weight): head_dim for a scale all heads share, heads * head_dim for kRmsAcrossHeads and
// kLayerNorm's per-head scales, 0 without qk_norm.
int64_t QkNormWidth(const LayerSpec& spec, int heads);
// The scale actually applied to q.k (resolves the 0 default; for MLA with YaRN's mscale_all_dim,
// 1/sqrt(qk head dim) * mscale(factor, mscale_all_dim)^2 as DeepseekV3Attention).
float EffectiveSoftmaxScale(const LayerSpec& spec);

// Number of scalars cached per token: 2 * num_kv_heads * head_dim, or for MLA
// kv_lora_rank + qk_rope_head_dim (the latent and the shared RoPE key, nothing else).
int64_t KvScalarsPerToken(const LayerSpec& spec);
inline int64_t KvBytesPerToken(const LayerSpec& spec, DType kv_dtype) {
  return KvScalarsPerToken(spec) * static_cast<int64_t>(DTypeSize(kv_dtype));
}

// Number of learned parameters of the layer (weights, biases and norm scales).
int64_t ParameterCount(const LayerSpec& spec);

// Default KV page size in tokens: 64 for MLA (as FlashMLA), 16 otherwise (as vLLM).
int DefaultPageSize(const LayerSpec& spec);

// One-line human-readable summary, e.g. "gqa d_model=512 heads=8 kv_heads=2 head_dim=64 ...".
std::string LayerSpecSummary(const LayerSpec& spec);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_H_
