#include "kernels/model/hf_config.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec_json.h"
#include "nlohmann/json.hpp"

namespace attnserve {
namespace {

using Json = nlohmann::json;

constexpr absl::string_view kSupportedModelTypes[] = {
    "llama",   "mistral",     "mixtral", "qwen2",       "qwen3",      "qwen3_moe",
    "phi3",    "gemma2",      "gemma3_text", "gpt_oss", "deepseek_v2", "deepseek_v3",
    "bloom",   "mpt",         "olmo2",       "cohere",  "stablelm"};

// THE LIST OF ACCEPTED KEYS: keys that cannot change what one attention layer computes, skipped
// without a word wherever they appear at the top level of config.json, whatever their value. Any
// other key is either read by the mapping below (and then its value is checked or used) or refused
// by name. Keys starting with "_" are accepted too (see IsAcceptedKey): transformers keeps private
// state and file metadata under them (_name_or_path, _commit_hash, _attn_implementation, which
// picks a kernel for the same math; Gemma 3's _sliding_window_pattern, which Gemma3TextConfig
// overwrites from sliding_window_pattern on load).
const absl::flat_hash_set<std::string>& KeysOutsideAttention() {
  static const auto* const keys = new absl::flat_hash_set<std::string>{
      // Names and metadata: which classes and tools wrote the file, the weights' storage dtype
      // (the loader reads the tensors' own dtypes).
      "architectures", "auto_map", "transformers_version", "transformers.js_config", "dtype",
      "torch_dtype", "use_bfloat16", "is_llama_config", "tokenizer_class", "finetuning_task",
      "problem_type", "id2label", "label2id", "task_specific_params", "prefix",
      // Token ids: the tokenizer's and the generation loop's business.
      "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "sep_token_id",
      "decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id",
      "begin_suppress_tokens", "suppress_tokens", "bad_words_ids",
      // Generation settings (sampling, beams, lengths, penalties, the KV cache implementation).
      "do_sample", "temperature", "top_k", "top_p", "typical_p", "num_beams", "num_beam_groups",
      "diversity_penalty", "num_return_sequences", "max_length", "min_length", "early_stopping",
      "length_penalty", "repetition_penalty", "no_repeat_ngram_size",
      "encoder_no_repeat_ngram_size", "exponential_decay_length_penalty",
      "remove_invalid_values", "use_cache", "cache_implementation",
      // What a forward call returns, export and training switches of PretrainedConfig.
      "output_attentions", "output_hidden_states", "output_scores", "return_dict",
      "return_dict_in_generate", "torchscript", "tf_legacy_loss", "chunk_size_feed_forward",
      "is_decoder", "tie_encoder_decoder", "cross_attention_hidden_size", "initializer_range",
      // Embeddings and logits: the vocabulary, tied embeddings, the final soft-cap (Gemma's
      // final_logit_softcapping applies to the logits, not to attention scores).
      "vocab_size", "tie_word_embeddings", "final_logit_softcapping",
      // The MLP: width, activation, biases. pretraining_tp: Llama-2's tensor-parallel slicing of
      // the projections, which transformers 4.57 no longer reads (any value computes the same).
      "intermediate_size", "hidden_act", "hidden_activation", "mlp_bias", "pretraining_tp",
      // The block's input/post-attention norms and the final norm (rms_norm_eps; read where it is
      // also the q/k norms' eps: Qwen3, Gemma 3). MLA's q_a/kv_a norms use a fixed 1e-6.
      "rms_norm_eps",
      // Dropout: zero at inference.
      "attention_dropout", "embd_pdrop", "resid_pdrop",
      // The longest context the model was trained for; read only as YaRN's fallback for
      // original_max_position_embeddings. attnserve's own limits are the serving configuration's.
      "max_position_embeddings",
      // Mixture of experts: routing, expert counts and sizes, auxiliary losses, which layers are
      // dense, multi-token-prediction layers, gpt-oss's clamp of the expert activations.
      "num_experts", "num_local_experts", "num_experts_per_tok", "experts_per_token",
      "moe_intermediate_size", "shared_expert_intermediate_size", "n_routed_experts",
      "n_shared_experts", "routed_scaling_factor", "topk_method", "n_group", "topk_group",
      "norm_topk_prob", "first_k_dense_replace", "moe_layer_freq", "scoring_func", "aux_loss_alpha",
      "seq_aux", "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
      "decoder_sparse_step", "mlp_only_layers", "ep_size", "num_nextn_predict_layers",
      "swiglu_limit",
      // gpt-oss: the context length of pretraining (documentation; the YaRN parameters are in
      // rope_scaling).
      "initial_context_length"};
  return *keys;
}

// Whether config.json may carry `key` at its top level without the mapping reading it.
bool IsAcceptedKey(absl::string_view key) {
  return absl::StartsWith(key, "_") || KeysOutsideAttention().contains(std::string(key));
}

// The defaults of each family's config class (transformers' models/<family>/configuration_<family>.py
// at the pinned version) for the keys the mapping reads: a key absent from config.json takes this
// value, exactly as from_pretrained does. JSON null in the file is not absent: it is Python's None,
// which the mapping reads as each class does (num_key_value_heads: null means num_attention_heads,
// sliding_window: null means no window, ...). tests/engine/hf_config_defaults_test.cc checks every
// entry against transformers by deleting each key in turn.
Json ClassDefaults(const std::string& model_type) {
  if (model_type == "llama") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": null, "head_dim": null,
        "max_position_embeddings": 2048, "rope_theta": 10000.0, "rope_scaling": null,
        "attention_bias": false})");
  }
  if (model_type == "mistral") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": null,
        "max_position_embeddings": 131072, "rope_theta": 10000.0, "sliding_window": 4096})");
  }
  if (model_type == "mixtral") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "head_dim": null,
        "max_position_embeddings": 131072, "rope_theta": 1000000.0, "sliding_window": null})");
  }
  if (model_type == "qwen2") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "max_position_embeddings": 32768,
        "rope_theta": 10000.0, "rope_scaling": null, "use_sliding_window": false,
        "sliding_window": 4096, "max_window_layers": 28, "layer_types": null})");
  }
  if (model_type == "qwen3") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "head_dim": 128,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "rope_scaling": null, "attention_bias": false, "use_sliding_window": false,
        "sliding_window": 4096, "max_window_layers": 28, "layer_types": null})");
  }
  if (model_type == "qwen3_moe") {
    return Json::parse(R"({"hidden_size": 2048, "num_attention_heads": 32,
        "num_hidden_layers": 24, "num_key_value_heads": 4, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": null,
        "attention_bias": false, "use_sliding_window": false, "sliding_window": 4096})");
  }
  if (model_type == "phi3") {
    return Json::parse(R"({"hidden_size": 3072, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": null, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4096, "rope_theta": 10000.0, "rope_scaling": null,
        "partial_rotary_factor": 1.0, "sliding_window": null})");
  }
  if (model_type == "gemma2") {
    return Json::parse(R"({"hidden_size": 2304, "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "head_dim": 256,
        "max_position_embeddings": 8192, "rope_theta": 10000.0, "attention_bias": false,
        "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": null,
        "attn_logit_softcapping": 50.0})");
  }
  if (model_type == "gemma3_text") {
    return Json::parse(R"({"hidden_size": 2304, "num_attention_heads": 8,
        "num_hidden_layers": 26, "num_key_value_heads": 4, "head_dim": 256,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "attention_bias": false, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "layer_types": null, "attn_logit_softcapping": null, "rope_scaling": null,
        "rope_local_base_freq": 10000.0, "use_bidirectional_attention": false,
        "sliding_window_pattern": 6})");
  }
  if (model_type == "gpt_oss") {
    return Json::parse(R"({"num_hidden_layers": 36, "hidden_size": 2880, "head_dim": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "sliding_window": 128,
        "rope_theta": 150000.0, "max_position_embeddings": 131072,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": false,
                         "original_max_position_embeddings": 4096},
        "layer_types": null})");
  }
  if (model_type == "deepseek_v2") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": null, "max_position_embeddings": 2048,
        "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128})");
  }
  if (model_type == "deepseek_v3") {
    return Json::parse(R"({"hidden_size": 7168, "num_attention_heads": 128,
        "num_hidden_layers": 61, "num_key_value_heads": 128, "kv_lora_rank": 512,
        "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "rope_scaling": null, "rope_interleave": true, "attention_bias": false})");
  }
  if (model_type == "olmo2") {
    return Json::parse(R"({"hidden_size": 4096, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": null, "max_position_embeddings": 2048,
        "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
        "rms_norm_eps": 1e-5})");
  }
  if (model_type == "cohere") {
    return Json::parse(R"({"hidden_size": 8192, "num_attention_heads": 64,
        "num_hidden_layers": 40, "num_key_value_heads": null, "max_position_embeddings": 8192,
        "layer_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null,
        "attention_bias": false, "use_qk_norm": false})");
  }
  if (model_type == "stablelm") {
    return Json::parse(R"({"hidden_size": 2560, "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 32, "max_position_embeddings": 4096,
        "layer_norm_eps": 1e-5, "rope_theta": 10000, "rope_scaling": null,
        "use_qkv_bias": false, "qk_layernorm": false, "partial_rotary_factor": 0.25})");
  }
  if (model_type == "bloom") {
    return Json::parse(R"({"hidden_size": 64, "n_head": 8, "n_layer": 2,
        "pretraining_tp": 1, "slow_but_exact": false})");
  }
  if (model_type == "mpt") {
    return Json::parse(R"({"d_model": 2048, "n_heads": 16, "n_layers": 24, "max_seq_len": 2048,
        "no_bias": true, "attn_config": {}})");
  }
  return Json::object();
}

// The config classes' attribute_map: BLOOM and MPT store the standard names under their own
// (BloomConfig: n_head, n_layer, and n_embed, which __init__ pops into hidden_size; MptConfig:
// d_model, n_heads, n_layers). Renamed in place before anything is read.
void RenameFamilyKeys(const std::string& model_type, Json& config) {
  std::vector<std::pair<const char*, const char*>> names;
  if (model_type == "bloom") {
    names = {{"n_embed", "hidden_size"},
             {"n_head", "num_attention_heads"},
             {"n_layer", "num_hidden_layers"}};
  } else if (model_type == "mpt") {
    names = {{"d_model", "hidden_size"},
             {"n_heads", "num_attention_heads"},
             {"n_layers", "num_hidden_layers"}};
  }
  for (const auto& [own, standard] : names) {
    if (!config.contains(own)) continue;
    if (!config.contains(standard) || config.at(standard).is_null()) config[standard] = config[own];
    config.erase(own);
  }
}

absl::Status KeyError(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: ", key, ": ", why));
}

// Reads keys of one config object, remembering which it read so that the rest can be checked.
// A key that is absent or JSON null counts as unset (transformers' None).
class ConfigReader {
 public:
  // `top_level`: config.json itself, where the accepted keys (IsAcceptedKey) may appear; in a
  // nested object (rope_scaling) every key must be read.
  explicit ConfigReader(const Json& object, bool top_level = false)
      : object_(object), top_level_(top_level) {}

  bool Has(const std::string& key) {
    used_.insert(key);
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  // Present in the file, even as null (Has() is false for null).
  bool Contains(const std::string& key) const { return object_.contains(key); }

  const Json& Raw(const std::string& key) {
    used_.insert(key);
    return object_.at(key);
  }

  absl::StatusOr<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) {
    if (!Has(key)) {
      if (fallback.has_value()) return *fallback;
      return Missing(key);
    }
    const Json& value = object_.at(key);
    if (value.is_number_integer()) return value.get<int64_t>();
    if (value.is_number_float()) {
      const double d = value.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15) {
        return static_cast<int64_t>(d);
      }
    }
    return KeyError(key, absl::StrCat("expected an integer, got ", value.dump()));
  }

  absl::StatusOr<int> SmallInt(const std::string& key, std::optional<int64_t> fallback) {
    absl::StatusOr<int64_t> value = Int(key, fallback);
    if (!value.ok()) return value.status();
    if (*value < 0 || *value > std::numeric_limits<int>::max()) {
      return KeyError(key, absl::StrCat(*value, " is out of range"));
    }
    return static_cast<int>(*value);
  }

  absl::StatusOr<double> Number(const std::string& key, std::optional<double> fallback) {
    if (!Has(key)) {
      if (fallback.has_value()) return *fallback;
      return Missing(key);
    }
    const Json& value = object_.at(key);
    if (!value.is_number()) {
      return KeyError(key, absl::StrCat("expected a number, got ", value.dump()));
    }
    return value.get<double>();
  }

  absl::StatusOr<bool> Bool(const std::string& key, bool fallback) {
    if (!Has(key)) return fallback;
    const Json& value = object_.at(key);
    if (!value.is_boolean()) {
      return KeyError(key, absl::StrCat("expected true or false, got ", value.dump()));
    }
    return value.get<bool>();
  }

  // A key the mapping needs is null (absent keys took the class default before reading).
  absl::Status Missing(const std::string& key) const {
    return KeyError(key, Contains(key) ? "null, which transformers cannot use here" : "required");
  }

  // Every key not read by the mapping and not known to lie outside attention is refused.
  absl::Status CheckAllKeysKnown(absl::string_view model_type) const {
    for (const auto& [key, value] : object_.items()) {
      if (used_.contains(key) || (top_level_ && IsAcceptedKey(key))) continue;
      return KeyError(key, absl::StrCat(
                               "not known to attnserve's ", model_type,
                               " mapping (kernels/model/hf_config.cc); refused rather than ignored, as "
                               "it may change what attention computes"));
    }
    return absl::OkStatus();
  }

 private:
  const Json& object_;
  const bool top_level_;
  absl::flat_hash_set<std::string> used_;
};

// Keys that, when set, describe something attnserve does not compute; refused whatever the family.
// Whether a quantization_config leaves the attention layers unquantized (gpt-oss quantizes only
// its experts to mxfp4 and lists "model.layers.*.self_attn" in modules_to_not_convert).
bool AttentionLeftUnquantized(const Json& quantization) {
  if (!quantization.is_object() || !quantization.contains("modules_to_not_convert")) return false;
  const Json& modules = quantization.at("modules_to_not_convert");
  if (!modules.is_array()) return false;
  for (const Json& module : modules) {
    if (module == "model.layers.*.self_attn" || module == "self_attn") return true;
  }
  return false;
}

absl::Status RefuseUnimplemented(ConfigReader& config) {
  if (config.Has("quantization_config") &&
      !AttentionLeftUnquantized(config.Raw("quantization_config"))) {
    return KeyError("quantization_config",
                    "the attention weights are quantized (fp8, gptq, ...), which is not "
                    "supported; the loader reads F32, F16 and BF16 tensors");
  }
  for (const char* key : {"is_encoder_decoder", "add_cross_attention"}) {
    absl::StatusOr<bool> set = config.Bool(key, false);
    if (!set.ok()) return set.status();
    if (*set) return KeyError(key, "encoder-decoder and cross attention are not supported");
  }
  if (config.Has("pruned_heads") && !config.Raw("pruned_heads").empty()) {
    return KeyError("pruned_heads", "pruned attention heads are not supported");
  }
  // rope_interleaved (nanotron's exports, e.g. SmolLM2): whether the checkpoint rotates (2i, 2i + 1)
  // pairs. transformers' Llama ignores it and rotates halves, which is right only for false.
  absl::StatusOr<bool> interleaved = config.Bool("rope_interleaved", false);
  if (!interleaved.ok()) return interleaved.status();
  if (*interleaved) {
    return KeyError("rope_interleaved",
                    "true (interleaved RoPE pairs in a half-rotation family) is not supported");
  }
  absl::StatusOr<bool> mrope = config.Bool("use_mrope", false);
  if (!mrope.ok()) return mrope.status();
  if (*mrope) return KeyError("use_mrope", "multimodal RoPE (M-RoPE) is not supported");
  return absl::OkStatus();
}

// config.rope_scaling as the spec's RopeScaling (modeling_rope_utils.py's reading of it).
absl::StatusOr<RopeScaling> ParseRopeScaling(ConfigReader& config) {
  RopeScaling scaling;
  if (!config.Has("rope_scaling")) return scaling;
  const Json& object = config.Raw("rope_scaling");
  if (!object.is_object()) {
    return KeyError("rope_scaling", absl::StrCat("expected an object, got ", object.dump()));
  }
  ConfigReader rs(object);
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    if (!rs.Has(key)) continue;
    const Json& value = rs.Raw(key);
    if (!value.is_string()) {
      return KeyError(absl::StrCat("rope_scaling.", key), "expected a string");
    }
    if (type.empty()) type = value.get<std::string>();
  }
  auto sub = [](absl::string_view key) { return absl::StrCat("rope_scaling.", key); };
  auto number = [&](const char* key, std::optional<double> fallback) -> absl::StatusOr<double> {
    absl::StatusOr<double> value = rs.Number(key, fallback);
    if (!value.ok()) return KeyError(sub(key), value.status().message());
    return value;
  };
  if (type.empty()) return KeyError("rope_scaling.rope_type", "required");
  if (type == "default") {
    // Nothing to read.
  } else if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    absl::StatusOr<double> factor = number("factor", std::nullopt);
    if (!factor.ok()) return factor.status();
    scaling.factor = *factor;
  } else if (type == "llama3") {
    scaling.type = RopeScalingType::kLlama3;
    absl::StatusOr<double> factor = number("factor", std::nullopt);
    absl::StatusOr<double> low = number("low_freq_factor", std::nullopt);
    absl::StatusOr<double> high = number("high_freq_factor", std::nullopt);
    absl::StatusOr<double> original = number("original_max_position_embeddings", std::nullopt);
    for (const auto* s : {&factor, &low, &high, &original}) {
      if (!s->ok()) return s->status();
    }
    scaling.factor = *factor;
    scaling.low_freq_factor = *low;
    scaling.high_freq_factor = *high;
    scaling.original_max_position_embeddings = static_cast<int>(*original);
  } else if (type == "yarn") {
    scaling.type = RopeScalingType::kYarn;
    if (rs.Has("attention_factor")) {
      return KeyError("rope_scaling.attention_factor",
                      "an explicit YaRN attention factor is not supported (only the one derived "
                      "from factor, mscale and mscale_all_dim)");
    }
    absl::StatusOr<bool> truncate = rs.Bool("truncate", true);
    if (!truncate.ok()) return KeyError(sub("truncate"), truncate.status().message());
    scaling.truncate = *truncate;
    absl::StatusOr<double> factor = number("factor", std::nullopt);
    if (!factor.ok()) return factor.status();
    scaling.factor = *factor;
    // The `or` fallbacks of _compute_yarn_parameters: absent, null or 0 take the default.
    absl::StatusOr<double> original = number("original_max_position_embeddings", 0.0);
    if (!original.ok()) return original.status();
    if (*original == 0) {
      absl::StatusOr<int64_t> max_positions = config.Int("max_position_embeddings", std::nullopt);
      if (!max_positions.ok()) return max_positions.status();
      *original = static_cast<double>(*max_positions);
    }
    scaling.original_max_position_embeddings = static_cast<int>(*original);
    absl::StatusOr<double> beta_fast = number("beta_fast", 0.0);
    absl::StatusOr<double> beta_slow = number("beta_slow", 0.0);
    absl::StatusOr<double> mscale = number("mscale", 0.0);
    absl::StatusOr<double> mscale_all_dim = number("mscale_all_dim", 0.0);
    for (const auto* s : {&beta_fast, &beta_slow, &mscale, &mscale_all_dim}) {
      if (!s->ok()) return s->status();
    }
    scaling.beta_fast = *beta_fast != 0 ? *beta_fast : 32.0;
    scaling.beta_slow = *beta_slow != 0 ? *beta_slow : 1.0;
    scaling.mscale = *mscale;
    scaling.mscale_all_dim = *mscale_all_dim;
  } else if (type == "dynamic" || type == "longrope") {
    return KeyError("rope_scaling.rope_type",
                    absl::StrCat("'", type,
                                 "' is not supported: transformers recomputes its frequencies from "
                                 "the length of each call, so outputs would depend on how a "
                                 "sequence is split into calls"));
  } else {
    return KeyError("rope_scaling.rope_type", absl::StrCat("'", type, "' is not supported"));
  }
  // Keys the chosen type does not read would be ignored: refuse them.
  if (absl::Status s = rs.CheckAllKeysKnown("rope_scaling"); !s.ok()) {
    return KeyError("rope_scaling", s.message());
  }
  return scaling;
}

// Whether layer `layer_index` is a sliding-window layer according to config.layer_types, or, when
// that is unset, `default_slides(layer_index)` (each family's own rule).
template <typename DefaultRule>
absl::StatusOr<bool> LayerSlides(ConfigReader& config, int layer_index, int num_layers,
                                 DefaultRule default_slides) {
  if (!config.Has("layer_types")) return default_slides(layer_index);
  const Json& types = config.Raw("layer_types");
  if (!types.is_array() || static_cast<int64_t>(types.size()) != num_layers) {
    return KeyError("layer_types",
                    absl::StrCat("expected a list of num_hidden_layers = ", num_layers, " strings"));
  }
  const Json& entry = types[layer_index];
  const std::string key = absl::StrCat("layer_types[", layer_index, "]");
  if (!entry.is_string()) return KeyError(key, "expected a string");
  const std::string type = entry.get<std::string>();
  if (type == "sliding_attention") return true;
  if (type == "full_attention") return false;
  return KeyError(key, absl::StrCat("'", type,
                                    "' is not supported (only sliding_attention and "
                                    "full_attention)"));
}

// A refusal when some layer slides by config.layer_types (or by `default_slides` without it)
// while the window is unset.
template <typename DefaultRule>
absl::Status RefuseSlidingWithoutWindow(ConfigReader& config, int num_layers,
                                        DefaultRule default_slides, absl::string_view why) {
  for (int i = 0; i < num_layers; ++i) {
    absl::StatusOr<bool> slides = LayerSlides(config, i, num_layers, default_slides);
    if (!slides.ok()) return slides.status();
    if (*slides) {
      return KeyError(absl::StrCat("layer_types[", i, "]"),
                      absl::StrCat("sliding_attention, but ", why,
                                   ": transformers has no window for it (its sliding mask "
                                   "raises)"));
    }
  }
  return absl::OkStatus();
}

// transformers' `scale == head_dim**-0.5` test, as the spec's 0 stands for that default.
float ScaleOrDefault(double scale, int qk_head_dim) {
  const double fallback = 1.0 / std::sqrt(static_cast<double>(qk_head_dim));
  return std::abs(scale - fallback) <= 1e-12 * fallback ? 0.0f : static_cast<float>(scale);
}

// Cohere's use_qk_norm and StableLM's qk_layernorm: when `flag` is set, q and k are normed per
// head by a LayerNorm of their own scales (no bias), eps layer_norm_eps, before RoPE. Without it,
// layer_norm_eps is only the block's norms' (accepted either way).
absl::Status ReadPerHeadLayerNorm(ConfigReader& config, const char* flag, LayerSpec& spec) {
  absl::StatusOr<bool> qk_norm = config.Bool(flag, false);
  if (!qk_norm.ok()) return qk_norm.status();
  if (*qk_norm) {
    absl::StatusOr<double> eps = config.Number("layer_norm_eps", std::nullopt);
    if (!eps.ok()) return eps.status();
    spec.qk_norm = QkNorm::kLayerNorm;
    spec.qk_norm_eps = static_cast<float>(*eps);
  }
  config.Has("layer_norm_eps");
  return absl::OkStatus();
}

absl::StatusOr<LayerSpec> GqaSpec(const std::string& model_type, ConfigReader& config,
                                  int layer_index, int num_layers) {
  LayerSpec spec;
  absl::StatusOr<int> d_model = config.SmallInt("hidden_size", std::nullopt);
  absl::StatusOr<int> heads = config.SmallInt("num_attention_heads", std::nullopt);
  if (!d_model.ok()) return d_model.status();
  if (!heads.ok()) return heads.status();
  if (*heads == 0) return KeyError("num_attention_heads", "must be > 0");
  // num_key_value_heads: null means num_attention_heads ("for backward compatibility" in most
  // config classes); Qwen3-MoE and Gemma keep None, which their attention cannot use.
  const bool gemma = model_type == "gemma2" || model_type == "gemma3_text";
  // StableLmConfig keeps None too.
  const bool kv_null_is_mha = !gemma && model_type != "qwen3_moe" && model_type != "stablelm";
  absl::StatusOr<int> kv_heads = config.SmallInt(
      "num_key_value_heads", kv_null_is_mha ? std::optional<int64_t>(*heads) : std::nullopt);
  if (!kv_heads.ok()) return kv_heads.status();
  spec.d_model = *d_model;
  spec.num_heads = *heads;
  spec.num_kv_heads = *kv_heads;
  const int derived_head_dim = *d_model / *heads;
  // head_dim: absent, the class default (ClassDefaults: Qwen3 128, Gemma 256, gpt-oss 64) or,
  // where the class has none, hidden_size / num_attention_heads (the attention modules'
  // getattr(config, "head_dim", ...)). null: the derived width where the class or module maps
  // None to it (Llama, Mistral, Mixtral, gpt-oss); elsewhere None reaches the module, refused.
  const bool head_dim_null_derived = model_type == "llama" || model_type == "mistral" ||
                                     model_type == "mixtral" || model_type == "gpt_oss" ||
                                     model_type == "stablelm";
  absl::StatusOr<int> head_dim = config.SmallInt(
      "head_dim", head_dim_null_derived || !config.Contains("head_dim")
                      ? std::optional<int64_t>(derived_head_dim)
                      : std::nullopt);
  if (!head_dim.ok()) return head_dim.status();
  if ((model_type == "phi3" || model_type == "stablelm") && *head_dim != derived_head_dim) {
    return KeyError("head_dim", absl::StrCat(model_type == "phi3" ? "Phi-3" : "StableLM",
                                             " attention uses hidden_size / "
                                             "num_attention_heads = ",
                                             derived_head_dim, "; ", *head_dim, " contradicts it"));
  }
  if (model_type == "stablelm" && *d_model % *heads != 0) {
    return KeyError("num_attention_heads", absl::StrCat(*heads, " does not divide hidden_size ",
                                                        *d_model, " (StableLmAttention raises)"));
  }
  spec.head_dim = *head_dim;
  spec.variant = spec.num_kv_heads == spec.num_heads ? AttentionVariant::kMHA
                 : spec.num_kv_heads == 1            ? AttentionVariant::kMQA
                                                     : AttentionVariant::kGQA;

  // Biases: which projections carry one is each family's own choice.
  if (model_type == "qwen2") {
    spec.qkv_bias = true;
  } else if (model_type == "phi3") {
    // Some Phi-3 configs carry attention_bias: false; Phi3Attention has no biases at all.
    absl::StatusOr<bool> bias = config.Bool("attention_bias", false);
    if (!bias.ok()) return bias.status();
    if (*bias) return KeyError("attention_bias", "true, but Phi-3 attention has no biases");
  } else if (model_type == "stablelm") {
    absl::StatusOr<bool> bias = config.Bool("use_qkv_bias", false);
    if (!bias.ok()) return bias.status();
    spec.qkv_bias = *bias;  // o_proj has none.
  } else if (model_type == "gpt_oss") {
    spec.qkv_bias = spec.o_bias = true;
    config.Has("attention_bias");  // Forced to True by GptOssConfig whatever the file says.
  } else if (model_type == "llama" || model_type == "qwen3" || model_type == "qwen3_moe" ||
             model_type == "gemma2" || model_type == "gemma3_text" || model_type == "olmo2" ||
             model_type == "cohere") {
    absl::StatusOr<bool> bias = config.Bool("attention_bias", false);
    if (!bias.ok()) return bias.status();
    spec.qkv_bias = spec.o_bias = *bias;
  }

  // Cohere rotates (x[2i], x[2i + 1]) pairs (its rotate_half takes x[..., ::2], x[..., 1::2]).
  spec.rope = model_type == "cohere" ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  absl::StatusOr<double> theta = config.Number("rope_theta", std::nullopt);
  if (!theta.ok()) return theta.status();
  spec.rope_theta = *theta;
  absl::StatusOr<RopeScaling> scaling = ParseRopeScaling(config);
  if (!scaling.ok()) return scaling.status();
  spec.rope_scaling = *scaling;
  if (model_type == "olmo2" && spec.rope_scaling.type != RopeScalingType::kNone &&
      spec.rope_scaling.type != RopeScalingType::kLinear) {
    // Olmo2Config._rope_scaling_validation: {"type", "factor"} with linear or dynamic only
    // (dynamic is refused above).
    return KeyError("rope_scaling", absl::StrCat("type ", RopeScalingTypeName(
                                                              spec.rope_scaling.type),
                                                 ": Olmo2Config accepts only linear or dynamic"));
  }
  if (model_type == "phi3" || model_type == "stablelm") {
    absl::StatusOr<double> partial = config.Number("partial_rotary_factor", 1.0);
    if (!partial.ok()) return partial.status();
    const int rotary = static_cast<int>(spec.head_dim * *partial);
    spec.rotary_dim = rotary == spec.head_dim ? 0 : rotary;
    // Phi-3 keeps original_max_position_embeddings at the top level for LongRoPE, refused above.
    if (model_type == "phi3") config.Has("original_max_position_embeddings");
  }
  spec.causal = true;

  // Sliding windows, per layer.
  int window = 0;
  if (model_type == "mistral" || model_type == "mixtral" || model_type == "phi3") {
    // The model masks every layer with config.sliding_window; null is none.
    absl::StatusOr<int> w = config.SmallInt("sliding_window", 0);
    if (!w.ok()) return w.status();
    window = *w;  // Every layer.
  } else if (model_type == "qwen2" || model_type == "qwen3" || model_type == "qwen3_moe") {
    absl::StatusOr<bool> use = config.Bool("use_sliding_window", false);
    if (!use.ok()) return use.status();
    absl::StatusOr<int> w = config.SmallInt("sliding_window", 0);
    if (!w.ok()) return w.status();
    const int configured = *use ? *w : 0;  // The config class sets None without use_sliding_window.
    if (model_type == "qwen3_moe") {
      // Qwen3-MoE masks every layer with the window; max_window_layers is a leftover there.
      if (*use && config.Has("max_window_layers")) {
        return KeyError("max_window_layers",
                        "with use_sliding_window, transformers' qwen3_moe slides every layer and "
                        "ignores max_window_layers; refused as ambiguous");
      }
      config.Has("max_window_layers");
      window = configured;
    } else {
      absl::StatusOr<int> max_window_layers = config.SmallInt("max_window_layers", 28);
      if (!max_window_layers.ok()) return max_window_layers.status();
      auto rule = [&](int i) { return configured != 0 && i >= *max_window_layers; };
      absl::StatusOr<bool> slides = LayerSlides(config, layer_index, num_layers, rule);
      if (!slides.ok()) return slides.status();
      if (configured == 0) {
        // transformers builds the sliding mask of the whole model from config.sliding_window
        // and raises when it is None: any sliding layer makes every layer unusable.
        if (absl::Status s = RefuseSlidingWithoutWindow(config, num_layers, rule,
                                                        "use_sliding_window is false or "
                                                        "sliding_window null");
            !s.ok()) {
          return s;
        }
      }
      window = *slides ? configured : 0;
    }
  } else if (model_type == "gemma2" || model_type == "gemma3_text" || model_type == "gpt_oss") {
    absl::StatusOr<int> w = config.SmallInt("sliding_window", 0);  // Absent: the class default.
    if (!w.ok()) return w.status();
    int pattern = 2;  // Gemma 2 and gpt-oss alternate sliding (even layers) and full.
    if (model_type == "gemma3_text") {
      // Gemma3TextConfig takes the pattern from sliding_window_pattern (default 6) and overwrites
      // any _sliding_window_pattern of the file with it.
      absl::StatusOr<int> legacy = config.SmallInt("sliding_window_pattern", std::nullopt);
      if (!legacy.ok()) return legacy.status();
      pattern = *legacy;
      if (pattern <= 0) return KeyError("sliding_window_pattern", "must be > 0");
    }
    auto rule = [&](int i) { return ((i + 1) % pattern) != 0; };
    absl::StatusOr<bool> slides = LayerSlides(config, layer_index, num_layers, rule);
    if (!slides.ok()) return slides.status();
    if (*w == 0) {
      if (absl::Status s = RefuseSlidingWithoutWindow(config, num_layers, rule,
                                                      "sliding_window is null");
          !s.ok()) {
        return s;
      }
    }
    window = *slides ? *w : 0;
    if (model_type == "gemma2" && config.Has("sliding_window_size")) {
      // An early Gemma 2 alias that transformers no longer reads; harmless only when it agrees.
      absl::StatusOr<int> alias = config.SmallInt("sliding_window_size", 0);
      if (!alias.ok()) return alias.status();
      if (*alias != *w) {
        return KeyError("sliding_window_size",
                        absl::StrCat(*alias, " disagrees with sliding_window = ", *w));
      }
    }
    if (model_type == "gemma3_text" && *slides) {
      // Gemma 3's sliding layers use their own RoPE: base rope_local_base_freq, no scaling.
      absl::StatusOr<double> local = config.Number("rope_local_base_freq", std::nullopt);
      if (!local.ok()) return local.status();
      spec.rope_theta = *local;
      spec.rope_scaling = RopeScaling();
    } else if (model_type == "gemma3_text") {
      config.Has("rope_local_base_freq");
    }
  }
  spec.sliding_window = window;

  // Softmax scale, soft-capping, norms, sinks.
  if (model_type == "gemma2" || model_type == "gemma3_text") {
    absl::StatusOr<double> scalar = config.Number("query_pre_attn_scalar", std::nullopt);
    if (!scalar.ok()) return scalar.status();
    if (*scalar <= 0) return KeyError("query_pre_attn_scalar", "must be > 0");
    spec.softmax_scale = ScaleOrDefault(std::pow(*scalar, -0.5), spec.head_dim);
    // Absent: the class default (Gemma 2: 50, Gemma 3: none); null: none.
    absl::StatusOr<double> softcap = config.Number("attn_logit_softcapping", 0.0);
    if (!softcap.ok()) return softcap.status();
    spec.attn_logit_softcapping = static_cast<float>(*softcap);
  }
  if (model_type == "gemma3_text") {
    absl::StatusOr<bool> bidirectional = config.Bool("use_bidirectional_attention", false);
    if (!bidirectional.ok()) return bidirectional.status();
    if (*bidirectional) {
      return KeyError("use_bidirectional_attention",
                      "true (Gemma 3 as a bidirectional encoder) is not supported");
    }
  }
  if (model_type == "qwen3" || model_type == "qwen3_moe" || model_type == "gemma3_text") {
    spec.qk_norm = model_type == "gemma3_text" ? QkNorm::kRmsUnitOffset : QkNorm::kRms;
    absl::StatusOr<double> eps = config.Number("rms_norm_eps", 1e-6);
    if (!eps.ok()) return eps.status();
    spec.qk_norm_eps = static_cast<float>(*eps);
  }
  if (model_type == "olmo2") {
    // Olmo2Attention: Olmo2RMSNorm over q_proj's and k_proj's whole output (all heads), eps
    // rms_norm_eps, before the split into heads and RoPE.
    spec.qk_norm = QkNorm::kRmsAcrossHeads;
    absl::StatusOr<double> eps = config.Number("rms_norm_eps", std::nullopt);
    if (!eps.ok()) return eps.status();
    spec.qk_norm_eps = static_cast<float>(*eps);
  }
  if (model_type == "cohere") {
    // CohereAttention with use_qk_norm: CohereLayerNorm over [num_heads, head_dim] and
    // [num_kv_heads, head_dim] (per head, each head its own scale, no bias), eps layer_norm_eps,
    // before RoPE. Without it, layer_norm_eps is only the block's input norm's.
    absl::Status norm = ReadPerHeadLayerNorm(config, "use_qk_norm", spec);
    if (!norm.ok()) return norm;
    config.Has("logit_scale");  // CohereForCausalLM's scale of the output logits.
  }
  if (model_type == "stablelm") {
    // StableLmAttention with qk_layernorm: StableLmLayerNormPerHead, one nn.LayerNorm without bias
    // per head (each its own scale), eps layer_norm_eps, before RoPE. Without it, layer_norm_eps
    // is only the block's norms'; use_parallel_residual and hidden_dropout are the block's too.
    absl::Status norm = ReadPerHeadLayerNorm(config, "qk_layernorm", spec);
    if (!norm.ok()) return norm;
    for (const char* key : {"use_parallel_residual", "hidden_dropout"}) {
      config.Has(key);
    }
  }
  if (model_type == "gpt_oss") spec.attention_sinks = true;
  return spec;
}

absl::StatusOr<LayerSpec> MlaSpec(const std::string& model_type, ConfigReader& config) {
  LayerSpec spec;
  spec.variant = AttentionVariant::kMLA;
  absl::StatusOr<int> d_model = config.SmallInt("hidden_size", std::nullopt);
  absl::StatusOr<int> heads = config.SmallInt("num_attention_heads", std::nullopt);
  absl::StatusOr<int> q_lora = config.SmallInt("q_lora_rank", 0);
  absl::StatusOr<int> kv_lora = config.SmallInt("kv_lora_rank", std::nullopt);
  absl::StatusOr<int> nope = config.SmallInt("qk_nope_head_dim", std::nullopt);
  absl::StatusOr<int> rope = config.SmallInt("qk_rope_head_dim", std::nullopt);
  absl::StatusOr<int> v = config.SmallInt("v_head_dim", std::nullopt);
  for (const auto* s : {&d_model, &heads, &q_lora, &kv_lora, &nope, &rope, &v}) {
    if (!s->ok()) return s->status();
  }
  spec.d_model = *d_model;
  spec.num_heads = *heads;
  spec.mla.q_lora_rank = *q_lora;
  spec.mla.kv_lora_rank = *kv_lora;
  spec.mla.qk_nope_head_dim = *nope;
  spec.mla.qk_rope_head_dim = *rope;
  spec.mla.v_head_dim = *v;
  // DeepseekV2/V3Attention build q_a_layernorm and kv_a_layernorm with RMSNorm's default eps, not
  // config.rms_norm_eps (that one is for the decoder layer's norms).
  spec.mla.rms_norm_eps = 1e-6f;
  absl::StatusOr<bool> bias = config.Bool("attention_bias", false);
  if (!bias.ok()) return bias.status();
  if (*bias) {
    return KeyError("attention_bias", "true (biases on q_a_proj, kv_a_proj_with_mqa and o_proj) "
                                      "is not supported for MLA");
  }
  // Derived or unused by MLA attention: the per-head widths above say it all.
  for (const char* key : {"num_key_value_heads", "head_dim"}) config.Has(key);
  // DeepseekV3Config derives qk_head_dim, but a saved value overrides the derived one and sets
  // the module's projection width and softmax scale: it must be the sum. (DeepseekV2Attention
  // computes the sum itself.)
  if (model_type == "deepseek_v2") {
    config.Has("qk_head_dim");
  } else if (config.Has("qk_head_dim")) {
    absl::StatusOr<int> qk_head_dim = config.SmallInt("qk_head_dim", std::nullopt);
    if (!qk_head_dim.ok()) return qk_head_dim.status();
    if (*qk_head_dim != *nope + *rope) {
      return KeyError("qk_head_dim",
                      absl::StrCat(*qk_head_dim, " is not qk_nope_head_dim + qk_rope_head_dim = ",
                                   *nope + *rope));
    }
  }
  bool interleaved = true;  // DeepSeek-V2 rotates (2i, 2i + 1) pairs (view_as_complex).
  if (model_type == "deepseek_v3") {
    absl::StatusOr<bool> interleave = config.Bool("rope_interleave", true);
    if (!interleave.ok()) return interleave.status();
    interleaved = *interleave;
  }
  spec.rope = interleaved ? RopeLayout::kInterleaved : RopeLayout::kHalf;
  absl::StatusOr<double> theta = config.Number("rope_theta", std::nullopt);
  if (!theta.ok()) return theta.status();
  spec.rope_theta = *theta;
  absl::StatusOr<RopeScaling> scaling = ParseRopeScaling(config);
  if (!scaling.ok()) return scaling.status();
  spec.rope_scaling = *scaling;
  spec.causal = true;
  return spec;
}

// BLOOM and MPT: MHA with ALiBi and no RoPE, head_dim = hidden_size / num_attention_heads.
absl::StatusOr<LayerSpec> AlibiSpec(const std::string& model_type, ConfigReader& config) {
  LayerSpec spec;
  absl::StatusOr<int> d_model = config.SmallInt("hidden_size", std::nullopt);
  absl::StatusOr<int> heads = config.SmallInt("num_attention_heads", std::nullopt);
  if (!d_model.ok()) return d_model.status();
  if (!heads.ok()) return heads.status();
  if (*heads == 0 || *d_model % *heads != 0) {
    return KeyError("num_attention_heads",
                    absl::StrCat(*heads, " does not divide hidden_size ", *d_model,
                                 " (the module's head_dim is their quotient)"));
  }
  spec.variant = AttentionVariant::kMHA;
  spec.d_model = *d_model;
  spec.num_heads = spec.num_kv_heads = *heads;
  spec.head_dim = *d_model / *heads;
  spec.rope = RopeLayout::kNone;
  spec.causal = true;
  if (model_type == "bloom") {
    // BloomAttention: biased query_key_value and dense, 1/sqrt(head_dim), build_alibi_tensor.
    spec.qkv_bias = spec.o_bias = true;
    spec.alibi = Alibi::kBloom;
    // pretraining_tp / slow_but_exact slice the dense projection into pretraining_tp sums: the
    // same product, rounded differently. The rest are the block's (norms, residual, dropout).
    for (const char* key : {"pretraining_tp", "slow_but_exact", "layer_norm_epsilon",
                            "apply_residual_connection_post_layernorm", "hidden_dropout"}) {
      config.Has(key);
    }
    // Megatron-DeepSpeed's training switches in the released configs, which BloomConfig stores and
    // transformers never reads (fusions of the same math; offset_alibi shifts every logit of a
    // row alike, which softmax ignores).
    for (const char* key : {"attention_softmax_in_fp32", "bias_dropout_fusion",
                            "masked_softmax_fusion", "offset_alibi", "skip_bias_add",
                            "skip_bias_add_qkv", "n_inner", "seq_length"}) {
      config.Has(key);
    }
    return spec;
  }
  // MPT: MptAttention has no biases whatever no_bias says, so a checkpoint with them would be
  // loaded without; refused.
  absl::StatusOr<bool> no_bias = config.Bool("no_bias", true);
  if (!no_bias.ok()) return no_bias.status();
  if (!*no_bias) return KeyError("no_bias", "false, but transformers' MptAttention has no biases");
  spec.alibi = Alibi::kMpt;
  // Outside attention: the MLP, norms, dropout, embeddings, the output logits and MosaicML's
  // training-time initialisation and tokenizer name. max_seq_len bounds MptModel's bias table,
  // not the layer's math.
  for (const char* key : {"expansion_ratio", "max_seq_len", "resid_pdrop", "emb_pdrop",
                          "learned_pos_emb", "init_device", "logit_scale", "verbose",
                          "embedding_fraction", "norm_type", "layer_norm_epsilon", "init_config",
                          "tokenizer_name"}) {
    config.Has(key);
  }
  // attn_config: MptAttentionConfig's keys; absent ones take its defaults.
  const Json attn = config.Has("attn_config") ? config.Raw("attn_config") : Json::object();
  if (!attn.is_object()) return KeyError("attn_config", "expected an object");
  ConfigReader a(attn, /*top_level=*/true);
  const auto text = [&](const char* key, const char* fallback) -> std::string {
    return a.Has(key) && a.Raw(key).is_string() ? a.Raw(key).get<std::string>() : fallback;
  };
  if (text("attn_type", "multihead_attention") != "multihead_attention") {
    return KeyError("attn_config.attn_type",
                    "only multihead_attention: transformers' MptAttention builds MHA weights");
  }
  a.Has("attn_impl");   // torch, flash or triton: the same math.
  a.Has("attn_pdrop");  // Dropout: zero at inference.
  a.Has("model_type");
  if (a.Has("clip_qkv")) {
    return KeyError("attn_config.clip_qkv", "clamping q/k/v is not supported");
  }
  // Switches transformers' MptAttention ignores but MosaicML's own model honours: either reading
  // would be a guess, so only their defaults are accepted.
  for (const char* key : {"prefix_lm", "qk_ln", "attn_uses_sequence_id"}) {
    absl::StatusOr<bool> set = a.Bool(key, false);
    if (!set.ok()) return set.status();
    if (*set) return KeyError(absl::StrCat("attn_config.", key), "true is not supported");
  }
  absl::StatusOr<bool> alibi = a.Bool("alibi", true);
  if (!alibi.ok()) return alibi.status();
  if (!*alibi) {
    return KeyError("attn_config.alibi",
                    "false, but transformers' MptModel applies ALiBi whatever it says");
  }
  // MptModel builds its biases with the default alibi_bias_max = 8 whatever the config says.
  absl::StatusOr<double> bias_max = a.Number("alibi_bias_max", 8.0);
  if (!bias_max.ok()) return bias_max.status();
  if (*bias_max != 8.0) {
    return KeyError("attn_config.alibi_bias_max",
                    absl::StrCat(*bias_max, ", but transformers' MptModel uses 8 whatever the "
                                            "config says (MosaicML's code uses the value)"));
  }
  spec.alibi_bias_max = 8.0f;
  absl::StatusOr<double> scale =
      a.Number("softmax_scale", 1.0 / std::sqrt(static_cast<double>(spec.head_dim)));
  if (!scale.ok()) return scale.status();
  spec.softmax_scale = ScaleOrDefault(*scale, spec.head_dim);
  if (absl::Status s = a.CheckAllKeysKnown("mpt attn_config"); !s.ok()) return s;
  return spec;
}

// One difference between two JSON values, as "path: a vs b"; empty when equal.
std::string JsonDifference(const Json& a, const Json& b, const std::string& path) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : a.items()) {
      const std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
      if (!b.contains(key)) return absl::StrCat(child, ": ", value.dump(), " vs absent");
      std::string difference = JsonDifference(value, b.at(key), child);
      if (!difference.empty()) return difference;
    }
    for (const auto& [key, value] : b.items()) {
      if (!a.contains(key)) {
        return absl::StrCat(path.empty() ? key : absl::StrCat(path, ".", key), ": absent vs ",
                            value.dump());
      }
    }
    return "";
  }
  if (a == b) return "";
  return absl::StrCat(path, ": ", a.dump(), " vs ", b.dump());
}

}  // namespace

absl::StatusOr<LayerSpec> LayerSpecFromHfConfig(absl::string_view config_json, int layer_index) {
  const Json root = Json::parse(config_json.begin(), config_json.end(), /*cb=*/nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: expected an object");
  if (!root.contains("model_type") || !root.at("model_type").is_string()) {
    return KeyError("model_type", "required (a string)");
  }
  const std::string model_type = root.at("model_type").get<std::string>();
  // Absent keys take the config class's defaults; present ones (null included) stay as written.
  Json with_defaults = root;
  RenameFamilyKeys(model_type, with_defaults);
  Json defaults = ClassDefaults(model_type);
  RenameFamilyKeys(model_type, defaults);
  for (const auto& [key, value] : defaults.items()) {
    if (!with_defaults.contains(key)) with_defaults[key] = value;
  }
  ConfigReader config(with_defaults, /*top_level=*/true);
  config.Has("model_type");
  bool supported = false;
  for (absl::string_view known : kSupportedModelTypes) supported = supported || known == model_type;
  if (!supported) {
    std::string hint;
    if (model_type == "gemma3") {
      hint = " (the multimodal Gemma 3; its text model's config is text_config, model_type "
             "gemma3_text)";
    }
    return KeyError("model_type",
                    absl::StrCat("'", model_type, "' is not supported", hint,
                                 "; supported: ", absl::StrJoin(kSupportedModelTypes, ", ")));
  }
  if (absl::Status s = RefuseUnimplemented(config); !s.ok()) return s;
  absl::StatusOr<int> num_layers = config.SmallInt("num_hidden_layers", std::nullopt);
  if (!num_layers.ok()) return num_layers.status();
  if (layer_index < 0 || layer_index >= *num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer index ", layer_index, " is outside the model's num_hidden_layers = ",
                     *num_layers));
  }
  const bool mla = model_type == "deepseek_v2" || model_type == "deepseek_v3";
  const bool alibi = model_type == "bloom" || model_type == "mpt";
  absl::StatusOr<LayerSpec> spec = mla     ? MlaSpec(model_type, config)
                                   : alibi ? AlibiSpec(model_type, config)
                                           : GqaSpec(model_type, config, layer_index, *num_layers);
  if (!spec.ok()) return spec.status();
  if (absl::Status s = config.CheckAllKeysKnown(model_type); !s.ok()) return s;
  if (absl::Status s = ValidateLayerSpec(*spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "config.json (", model_type, ", layer ", layer_index, ") maps to a spec that is not "
        "valid: ", s.message()));
  }
  return spec;
}

absl::StatusOr<int> NumHiddenLayersFromHfConfig(absl::string_view config_json) {
  const Json root = Json::parse(config_json.begin(), config_json.end(), /*cb=*/nullptr,
                                /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("config.json: expected an object");
  const std::string model_type = root.contains("model_type") && root.at("model_type").is_string()
                                     ? root.at("model_type").get<std::string>()
                                     : "";
  Json renamed = root;
  RenameFamilyKeys(model_type, renamed);
  Json value = renamed.contains("num_hidden_layers") ? renamed.at("num_hidden_layers") : Json();
  if (value.is_null() && !model_type.empty()) {
    Json defaults = ClassDefaults(model_type);
    RenameFamilyKeys(model_type, defaults);
    if (defaults.contains("num_hidden_layers")) value = defaults.at("num_hidden_layers");
  }
  if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
      value.get<int64_t>() > (int64_t{1} << 20)) {
    return KeyError("num_hidden_layers", "required (a positive integer)");
  }
  return static_cast<int>(value.get<int64_t>());
}

std::string LayerSpecDifference(const LayerSpec& a, const LayerSpec& b) {
  const Json ja = Json::parse(LayerSpecToJson(a), nullptr, false);
  const Json jb = Json::parse(LayerSpecToJson(b), nullptr, false);
  return JsonDifference(ja, jb, "");
}

}  // namespace attnserve
