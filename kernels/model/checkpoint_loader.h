// Loading one attention layer's weights from a Hugging Face safetensors checkpoint.
//
// Tensors are looked up as "model.layers.{layer_index}.self_attn." + each name of
// ExpectedWeightShapes(spec) (see layer_weights.h), which is how transformers names Llama, Mistral,
// Qwen2 and DeepSeek-V2/V3 attention. A spec with ALiBi (hf_config.h sets it from model_type
// "bloom" / "mpt") reads its family's names first, with or without the leading "transformer."
// (BloomForCausalLM / MptForCausalLM write it; checkpoints saved from the base model do not):
//   BLOOM (alibi bloom): transformer.h.N.self_attention.query_key_value.{weight,bias}, rows per
//     head as view(num_heads, 3, head_dim) -> q, k, v (num_kv_heads must equal num_heads), and
//     self_attention.dense.{weight,bias} as o_proj;
//   MPT (alibi mpt): transformer.blocks.N.attn.Wqkv.weight (and .bias with qkv_bias), rows q, k, v
//     stacked (chunk(3)), and attn.out_proj.weight (.bias with o_bias) as o_proj. MosaicML's
//     attn_config.qk_ln tensors (attn.q_ln, attn.k_ln) are INVALID_ARGUMENT, named as such.
// When the checkpoint has no tensors under those, the Llama names are read (an ALiBi layer written
// by attnctl convert). A q/k LayerNorm (qk_norm layer_norm) reads q_norm.weight [H, D] (Cohere) or,
// where the checkpoint has them, StableLM's per-head q_layernorm.norms.H.weight [D] (and k's),
// stacked into it. Messages name the tensors as the checkpoint stores them; the weights come
// back under the generic names. `path` is either a single .safetensors file, or a directory
// as written by save_pretrained():
//   - with model.safetensors.index.json: its "weight_map" says which shard file (relative to the
//     directory) holds each tensor; only the shards holding this layer are opened;
//   - otherwise model.safetensors.
//
// The checkpoint must describe the same layer as the spec, checked before any data is read:
//   NOT_FOUND         the path, a shard, or a tensor the spec requires is missing (the message
//   names
//                     the tensor, the file, and the spec field behind it, e.g. qkv_bias);
//   INVALID_ARGUMENT  a tensor has another shape than the spec requires (both shapes and the spec's
//                     sizes are named), or the checkpoint has a weight or bias under the layer's
//                     prefix that the spec does not use (e.g. Qwen2's q/k/v biases with
//                     qkv_bias=false, or Qwen3's q_norm) - running without it would silently
//                     compute something else. Non-parameter buffers (rotary_emb.inv_freq) and FP8
//                     scale tensors (*.weight_scale_inv) are ignored.
// Phi-3's fused projection: a checkpoint with "qkv_proj.weight" [(H + 2*KV) * head_dim, d_model]
// (and "qkv_proj.bias" when qkv_bias) instead of q_proj/k_proj/v_proj has it split, rows in that
// order, into the three (a shape that does not match the spec is INVALID_ARGUMENT naming it; fused
// and separate projections together are refused). gpt-oss "sinks" counts as a parameter.
// Tensors keep their stored dtype (F32, F16 or BF16); other dtypes are UNIMPLEMENTED.
#ifndef ATTNSERVE_KERNELS_MODEL_CHECKPOINT_LOADER_H_
#define ATTNSERVE_KERNELS_MODEL_CHECKPOINT_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "kernels/spec/layer_spec.h"
#include "kernels/model/layer_weights.h"

namespace attnserve {

// "model.layers.{layer_index}.self_attn."
std::string HfAttentionPrefix(int layer_index);

// `checkpoint_root` empty: `path` and the files it leads to are opened wherever they are. Set:
// every file the loader opens (the path, model.safetensors, the index, each shard) must resolve
// (realpath, symlinks followed) to a place inside it, else NOT_FOUND "'<file>' is not a readable
// file under the checkpoint root", the same whether it is missing, unreadable or outside
// (kernels/base/path_confinement.h). Files are opened without blocking and only when regular
// (kernels/base/regular_file.h): a FIFO or a device is NOT_FOUND, never a hang.
absl::StatusOr<LayerWeights> LoadLayerWeightsFromSafetensors(
    const std::string& path, const LayerSpec& spec, int layer_index,
    const std::string& checkpoint_root = "");

}  // namespace attnserve

#endif  // ATTNSERVE_KERNELS_MODEL_CHECKPOINT_LOADER_H_
