// The JSON form of a LayerSpec: the spec files of the peer test and of the command-line tools.
// One key per row of LayerSpecFields() (layer_spec.h), named and typed as the LayerSpec member
// (an enum by name, "qk_norm": "rms"), in the rows' order:
//
//   {
//     "variant": "gqa",          // "mha" | "mqa" | "gqa" | "mla"                       (required)
//     "d_model": 4096,           //                                                      (required)
//     "num_heads": 32,           //                                                      (required)
//     "num_kv_heads": 8,         // mha: default num_heads; mqa: default 1; gqa: required;
//                                // ignored by mla
//     "head_dim": 128,           // default d_model / num_heads; ignored by mla
//     "qkv_bias": false,
//     "o_bias": false,
//     "rope": "half",            // default "half", not LayerSpec{}'s "none"
//     "rope_theta": 10000.0,
//     "rope_scaling": {          // optional; absent = "none" (written only when not "none")
//       "type": "llama3",        // "none" | "linear" | "dynamic" (refused) | "llama3" | "yarn"
//       "factor": 8.0,           // default 1
//       "original_max_position_embeddings": 8192,  // llama3 and yarn; default 0 (invalid there)
//       "low_freq_factor": 1.0, "high_freq_factor": 4.0,  // llama3; defaults 1 and 4
//       "beta_fast": 32.0, "beta_slow": 1.0,              // yarn; defaults 32 and 1
//       "mscale": 0.0, "mscale_all_dim": 0.0,             // yarn; 0 = absent (default)
//       "truncate": true                                  // yarn; default true (gpt-oss: false)
//     },
//     "causal": true,
//     "sliding_window": 0,
//     ...                        // every other row: "qk_norm": "none", "alibi_bias_max": 8.0, ...
//     "mla": {                   // required for mla, not allowed otherwise
//       "q_lora_rank": 1536,     // 0 = plain q_proj; default 0
//       "kv_lora_rank": 512,     // (required)
//       "qk_nope_head_dim": 128, // (required)
//       "qk_rope_head_dim": 64,  // (required)
//       "v_head_dim": 128,       // (required)
//       "rms_norm_eps": 1e-6     // default 1e-6
//     }
//   }
//
// Field meanings are those of LayerSpec (layer_spec.h), and so are the defaults of the keys not
// marked above. The defaults are those of attnctl's spec flags and of the Python client's LayerSpec
// (docs/api.md, "Layer spec JSON files"), so the same settings configure the same layer, with the
// same fingerprint, from all three; RoPE is on by default (Llama-style "half", theta 10000), unlike
// LayerSpec's C++ default. Parsing never throws: malformed JSON, unknown keys, missing required
// keys, values of the wrong JSON type (a string for a number, 2.5 for an integer, an integer
// outside int range) and specs that fail ValidateLayerSpec are all INVALID_ARGUMENT, and the
// message names the key ("mla.kv_lora_rank", not just "kv_lora_rank").
#ifndef ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_JSON_H_
#define ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/spec/layer_spec.h"

namespace attnserve {

// Parses and validates a spec.
absl::StatusOr<LayerSpec> LayerSpecFromJson(absl::string_view json_text);

// Pretty-printed JSON (2-space indent, keys in the rows' order, trailing newline) that
// LayerSpecFromJson reads back to an equal spec. Every key is written; "mla" only for variant mla.
// Floats are written in their shortest round-tripping form (1e-06, not 9.99999997e-07).
std::string LayerSpecToJson(const LayerSpec& spec);

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_SPEC_LAYER_SPEC_JSON_H_
