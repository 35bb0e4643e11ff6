#!/usr/bin/env python3
"""config.json with each key deleted in turn, and what transformers makes of it.

For every model family kernels/model/hf_config.cc supports, a config is built with transformers'
own config class (tiny sizes, attention settings away from their defaults so that a deletion shows)
and written in full (to_dict, every key the class knows). Then each key is deleted in turn; the
config class is constructed from what is left, exactly as from_pretrained would, and the attention
module of each layer is instantiated (on the meta device: no weights) to read what the layer
computes: head width and counts, biases, softmax scale, window, soft-cap, q/k norm and its eps,
sinks, and the RoPE base and scaling of that layer's rotary embedding. That is written as the
spec (kernels/spec/layer_spec_json.h form) the C++ test tests/engine/hf_config_defaults_test.cc
must get from the same config.json, or as a refusal where transformers itself refuses the config
or resolves it to something attnserve does not implement.

Families with layer_types in their full config get a second round of deletions from the config
without layer_types (as many Hub configs are), which exercises the rules that derive it.

Output: one JSON file (--out), {"versions": {...}, "variants": [{"family", "deleted" (null for
the full config, else the deleted keys joined by ","), "config" (the config.json object), "layers": [{"layer_index", "spec" | null,
"refused" (why, when spec is null)}]}]}.
"""

import argparse
import copy
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_peer_cases as peer  # noqa: E402  (sets the offline environment, imports transformers)

import torch  # noqa: E402
from transformers import (  # noqa: E402
    CohereConfig, DeepseekV2Config, DeepseekV3Config, Gemma2Config, Gemma3TextConfig,
    GptOssConfig, LlamaConfig, MistralConfig, MixtralConfig, Olmo2Config, Phi3Config, Qwen2Config,
    Qwen3Config, Qwen3MoeConfig, StableLmConfig)
from transformers.models.cohere.modeling_cohere import CohereAttention  # noqa: E402
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention  # noqa: E402
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention  # noqa: E402
from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention  # noqa: E402
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaAttention  # noqa: E402
from transformers.models.mistral.modeling_mistral import MistralAttention  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralAttention  # noqa: E402
from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3Attention  # noqa: E402
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeAttention  # noqa: E402
from transformers.models.stablelm.modeling_stablelm import StableLmAttention  # noqa: E402

COMMON = dict(vocab_size=64, intermediate_size=96)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
        "beta_fast": 16.0, "beta_slow": 2.0}

# family -> (config class, attention class, settings of the full config). The settings move every
# attention-relevant key away from the class default where the tiny model allows it.
FAMILIES = {
    "llama": (LlamaConfig, LlamaAttention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        num_hidden_layers=2, rope_theta=500000.0, attention_bias=True,
        max_position_embeddings=1024,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256})),
    "mistral": (MistralConfig, MistralAttention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        num_hidden_layers=2, rope_theta=20000.0, sliding_window=16)),
    "mixtral": (MixtralConfig, MixtralAttention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        rope_theta=30000.0, sliding_window=8, num_local_experts=2)),
    "qwen2": (Qwen2Config, Qwen2Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=3,
        rope_theta=40000.0, use_sliding_window=True, sliding_window=8, max_window_layers=1,
        max_position_embeddings=512, rope_scaling=dict(YARN))),
    "qwen3": (Qwen3Config, Qwen3Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=2, rope_theta=50000.0, rms_norm_eps=1e-5, attention_bias=True,
        use_sliding_window=True, sliding_window=8, max_window_layers=1,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeAttention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=2, rope_theta=60000.0, rms_norm_eps=1e-5, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=32)),
    "phi3": (Phi3Config, Phi3Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        rope_theta=70000.0, partial_rotary_factor=0.5, sliding_window=8,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "gemma2": (Gemma2Config, Gemma2Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_hidden_layers=2, rope_theta=80000.0, query_pre_attn_scalar=16,
        sliding_window=8, attn_logit_softcapping=20.0, attention_bias=True)),
    "gemma3_text": (Gemma3TextConfig, Gemma3Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_hidden_layers=3, rope_theta=90000.0, rope_local_base_freq=5000.0,
        query_pre_attn_scalar=16, sliding_window=8, attn_logit_softcapping=30.0,
        rms_norm_eps=1e-5, sliding_window_pattern=3,
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "gpt_oss": (GptOssConfig, GptOssAttention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=2, rope_theta=100000.0, sliding_window=8, num_local_experts=2,
        num_experts_per_tok=1, max_position_embeddings=2048,
        rope_scaling={"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                      "truncate": False, "original_max_position_embeddings": 128})),
    "olmo2": (Olmo2Config, Olmo2Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        rope_theta=500000.0, rms_norm_eps=1e-6, attention_bias=True,
        max_position_embeddings=1024, rope_scaling={"type": "linear", "factor": 2.0})),
    # hidden_size 128: without num_attention_heads (64), a head of 2 keeps RoPE's pairs whole.
    "cohere": (CohereConfig, CohereAttention, dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        rope_theta=75000.0, use_qk_norm=True, layer_norm_eps=1e-4, attention_bias=True,
        max_position_embeddings=1024, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    # hidden_size 128: without num_attention_heads (32), a head of 4 keeps an even rotary width.
    "stablelm": (StableLmConfig, StableLmAttention, dict(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        rope_theta=20000.0, qk_layernorm=True, layer_norm_eps=1e-4, use_qkv_bias=True,
        partial_rotary_factor=0.5, max_position_embeddings=1024,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "deepseek_v2": (DeepseekV2Config, DeepseekV2Attention, dict(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=2, q_lora_rank=24,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12,
        rope_theta=11000.0, n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=1,
        moe_intermediate_size=32, n_group=1, topk_group=1)),
    "deepseek_v3": (DeepseekV3Config, DeepseekV3Attention, dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=2,
        q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=12,
        rope_theta=12000.0, rope_interleave=False, n_routed_experts=2, n_shared_experts=1,
        num_experts_per_tok=1, moe_intermediate_size=32, n_group=1, topk_group=1,
        max_position_embeddings=1024,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256,
                      "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32.0,
                      "beta_slow": 1.0})),
}


class Refused(Exception):
    """transformers resolves the config to something attnserve does not implement."""


def layer_rope(family, config, attn, layer_index):
    """(rope_theta, the config-like object whose rope_scaling the layer's rotary embedding uses)."""
    if family == "gemma3_text" and config.layer_types[layer_index] == "sliding_attention":
        # Gemma3TextModel.rotary_emb_local: rope_local_base_freq, rope_scaling {"rope_type":
        # "default"} (no scaling).
        return config.rope_local_base_freq, None
    return config.rope_theta, config


def gqa_spec(family, config, attn, layer_index):
    head_dim = attn.head_dim
    fused = hasattr(attn, "qkv_proj")
    if fused:  # Phi-3: one projection for q, k and v.
        heads = config.num_attention_heads
        kv_heads = config.num_key_value_heads
        assert attn.qkv_proj.out_features == (heads + 2 * kv_heads) * head_dim
        d_model = attn.qkv_proj.in_features
        qkv_bias = attn.qkv_proj.bias is not None
    else:
        heads = attn.q_proj.out_features // head_dim
        kv_heads = attn.k_proj.out_features // head_dim
        d_model = attn.q_proj.in_features
        qkv_bias = attn.q_proj.bias is not None
        assert (attn.k_proj.bias is not None) == (attn.v_proj.bias is not None) == qkv_bias
    if hasattr(attn, "sliding_window"):
        window = attn.sliding_window  # Decided per layer (layer_types).
    else:
        # Mistral, Mixtral, Phi-3: the model masks every layer with config.sliding_window.
        window = getattr(config, "sliding_window", None)
    qk_norm, qk_norm_eps = "none", 1e-6
    if getattr(attn, "qk_layernorm", False):  # StableLM: one nn.LayerNorm per head.
        norms = attn.q_layernorm.norms, attn.k_layernorm.norms
        assert all(n.bias is None and n.weight.shape == (head_dim,) for n in (*norms[0], *norms[1]))
        assert (len(norms[0]), len(norms[1])) == (heads, kv_heads), (family, norms)
        eps = {n.eps for n in (*norms[0], *norms[1])}
        assert len(eps) == 1, eps
        qk_norm, qk_norm_eps = "layer_norm", float(eps.pop())
    if hasattr(attn, "q_norm"):
        qk_norm = {"gemma3_text": "rms_unit_offset", "olmo2": "rms_across_heads",
                   "cohere": "layer_norm"}.get(family, "rms")
        # The scales' shapes say shared by the heads, across heads or one per head.
        shapes = (tuple(attn.q_norm.weight.shape), tuple(attn.k_norm.weight.shape))
        assert shapes == {"rms_across_heads": ((heads * head_dim,), (kv_heads * head_dim,)),
                          "layer_norm": ((heads, head_dim), (kv_heads, head_dim))}.get(
                              qk_norm, ((head_dim,), (head_dim,))), (family, shapes)
        eps = [getattr(n, "variance_epsilon", getattr(n, "eps", None))
               for n in (attn.q_norm, attn.k_norm)]
        assert eps[0] == eps[1], eps
        qk_norm_eps = float(eps[0])
    rotary_dim = int(head_dim * getattr(config, "partial_rotary_factor", 1.0))
    theta, scaling_config = layer_rope(family, config, attn, layer_index)
    if family == "gemma3_text" and getattr(config, "use_bidirectional_attention", False):
        raise Refused("use_bidirectional_attention")
    spec = {
        "variant": "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa"),
        "d_model": d_model,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "qkv_bias": qkv_bias,
        "o_bias": attn.o_proj.bias is not None,
        # Cohere's rotate_half rotates (x[2i], x[2i + 1]) pairs.
        "rope": "interleaved" if family == "cohere" else "half",
        "rope_theta": float(theta),
        "causal": bool(attn.is_causal),
        "sliding_window": int(window or 0),
        # StableLmAttention has no attribute: it divides by sqrt(head_dim).
        "softmax_scale": peer.scale_or_default(getattr(attn, "scaling", head_dim ** -0.5),
                                               head_dim),
        "rotary_dim": 0 if rotary_dim == head_dim else rotary_dim,
        "qk_norm": qk_norm,
        "qk_norm_eps": qk_norm_eps,
        "attn_logit_softcapping": float(getattr(attn, "attn_logit_softcapping", None) or 0.0),
        "attention_sinks": hasattr(attn, "sinks"),
    }
    if scaling_config is not None:
        peer.with_rope_scaling(spec, scaling_config)
    return spec


def resolve(family, config_dict, layer_index):
    config_class, attention_class, _ = FAMILIES[family]
    if "model_type" not in config_dict:
        raise Refused("model_type is required (AutoConfig cannot pick a class without it)")
    config = config_class.from_dict(copy.deepcopy(config_dict), attn_implementation="eager")
    if layer_index >= config.num_hidden_layers:
        raise Refused("layer index past num_hidden_layers")
    rs = getattr(config, "rope_scaling", None) or {}
    if rs.get("rope_type", rs.get("type")) in ("dynamic", "longrope", "su"):
        raise Refused("rope_scaling type")
    layer_types = getattr(config, "layer_types", None) or []
    if "sliding_attention" in layer_types and config.sliding_window is None:
        # create_sliding_window_causal_mask raises: "Could not find a `sliding_window` ...".
        raise Refused("a sliding_attention layer without sliding_window")
    with torch.device("meta"):
        attn = attention_class(config, layer_index)
    if family.startswith("deepseek"):
        if attn.qk_head_dim != config.qk_nope_head_dim + config.qk_rope_head_dim:
            # A saved qk_head_dim overrides DeepseekV3Config's sum: the projections and the
            # split of q disagree, and the forward pass fails.
            raise Refused("qk_head_dim is not qk_nope_head_dim + qk_rope_head_dim")
        return peer.deepseek_spec(config, attn)
    spec = gqa_spec(family, config, attn, layer_index)
    if spec["num_heads"] % spec["num_kv_heads"] != 0:
        raise Refused("num_attention_heads is not a multiple of num_key_value_heads (repeat_kv)")
    if spec["rotary_dim"] % 2 != 0:
        raise Refused("an odd rotary width")
    return spec


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    variants = []
    for family, (config_class, _, settings) in FAMILIES.items():
        full = config_class(**COMMON, **settings).to_dict()
        assert full["model_type"] == family, (family, full["model_type"])
        full_layers = full["num_hidden_layers"]
        deletions = [()] + [(key,) for key in sorted(full)]
        if "layer_types" in full:
            # Hub configs often lack layer_types (derived from the window settings, or from
            # sliding_window_pattern): delete each key again from a config without it.
            deletions += [("layer_types",)] + [("layer_types", key) for key in sorted(full)
                                               if key != "layer_types"]
        for deleted_keys in deletions:
            deleted = ",".join(deleted_keys) if deleted_keys else None
            config_dict = {k: v for k, v in full.items() if k not in deleted_keys}
            layers = []
            for layer_index in range(full_layers):
                try:
                    spec = resolve(family, config_dict, layer_index)
                    layers.append({"layer_index": layer_index, "spec": spec})
                except (Refused, ValueError, TypeError, KeyError, AttributeError,
                        AssertionError) as error:
                    if deleted is None:
                        raise  # The full config must resolve.
                    layers.append({"layer_index": layer_index, "spec": None,
                                   "refused": f"{type(error).__name__}: {error}"})
            variants.append({"family": family, "deleted": deleted, "config": config_dict,
                             "layers": layers})
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as out:
        json.dump({"versions": peer.versions(), "variants": variants}, out, indent=1)
    print(f"make_config_variants: {len(variants)} configs of {len(FAMILIES)} families -> "
          f"{args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
