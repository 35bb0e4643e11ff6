#!/usr/bin/env python3
"""Builds peer-test cases: tiny random attention layers run by code nobody here wrote.

Each case is a randomly initialised model built by Hugging Face `transformers` (eager attention,
float32) or a bare `torch.nn.MultiheadAttention`, saved as a safetensors checkpoint, together with
one forward pass through one layer's attention module captured with forward hooks. The C++ peer
test (tests/engine/peer_test.cc) loads the checkpoint with our loader, runs our engine on the same input
and compares.

Output, one directory per case under --out:
  model.safetensors  the checkpoint (save_pretrained, or safetensors.torch.save_file for torch MHA)
  spec.json          our LayerSpec JSON (kernels/spec/layer_spec_json.h)
  io.safetensors     "hidden"   [L, d_model] f32  input of self_attn (after input_layernorm)
                     "positions" [L] f32          RoPE positions: integers from 5, increasing in
                                                  steps of 1..3 (contiguous for Mistral); F32
                                                  because the C++ reader has no integer dtypes
                     "expected" [L, d_model] f32  self_attn output for a one-shot prefill
                     "expected_split" [L, d_model] f32  output when the first `prefill_split`
                                                  tokens are prefilled and the rest decoded one by
                                                  one; differs from "expected" only without a
                                                  causal mask (a decoded token cannot see later
                                                  tokens)
  case.json          {"layer_index", "prefill_split", "seq_len", "source", "seed", "versions"}

Nothing is downloaded (HF_HUB_OFFLINE=1). Weights are re-drawn after construction so attention is
peaked rather than near-uniform (transformers' default init, std 0.02, makes every softmax almost
flat, which would hide masking and RoPE mistakes), and RMSNorm scales inside the attention module
are drawn away from 1 so a loader that drops them fails.

Before a case is written, a float64 numpy re-implementation of our spec semantics recomputes it
from model.safetensors + spec.json (self_check); a mismatch stops the script, so a case that fails
in C++ points at the engine, not at this script's mapping of the model config to spec.json.
"""

import argparse
import json
import math
import os
import secrets
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import numpy as np
    import safetensors
    import safetensors.torch
    import torch
    import transformers
    from transformers import (
        BloomConfig,
        BloomForCausalLM,
        CohereConfig,
        CohereForCausalLM,
        DeepseekV2Config,
        DeepseekV2ForCausalLM,
        DeepseekV3Config,
        DeepseekV3ForCausalLM,
        Gemma2Config,
        Gemma2ForCausalLM,
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GptOssConfig,
        GptOssForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        MptConfig,
        MptForCausalLM,
        Olmo2Config,
        Olmo2ForCausalLM,
        Phi3Config,
        Phi3ForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
        StableLmConfig,
        StableLmForCausalLM,
    )
except ImportError as error:
    sys.exit(f"make_peer_cases.py: {error} (python {sys.executable}). Run deploy/setup.sh, or "
             f"pip install -r tests/peer/requirements.txt into this interpreter's environment.")

POSITION_OFFSET = 5  # First RoPE position; non-zero so a position-ignoring engine fails.
VOCAB = 64           # Tiny vocabulary: the embedding table is never used (inputs_embeds).


def versions():
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
        "numpy": np.__version__,
    }


# ---- weight re-initialisation -------------------------------------------------------------------

def reinit_attention(attn: torch.nn.Module, qk_gain: float):
    """Re-draws the attention module's parameters.

    Projections ~ U(-1/sqrt(in), 1/sqrt(in)) as nn.Linear's own default, with q/k-side projections
    scaled by `qk_gain` so logits spread over several units; biases ~ U(-0.5, 0.5); RMSNorm scales
    ~ U(0.5, 1.5), or U(-0.5, 0.5) for Gemma's (1 + w) q/k norms; gpt-oss sinks ~ U(-1, 3), of the
    size of the scores so that they take a visible share of each softmax.
    """
    with torch.no_grad():
        for name, p in attn.named_parameters():
            leaf = name.split(".")[0]
            if name in ("q_norm.weight", "k_norm.weight") and "Gemma" in type(attn).__name__:
                p.uniform_(-0.5, 0.5)
            elif "layernorm" in name or name in ("q_norm.weight", "k_norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name == "sinks":
                p.uniform_(-1.0, 3.0)
            elif name.endswith(".bias"):
                p.uniform_(-0.5, 0.5)
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.uniform_(-bound, bound)
                if leaf in ("q_proj", "k_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa",
                            "kv_b_proj"):
                    p.mul_(qk_gain)
                if leaf == "qkv_proj":  # Phi-3: the q and k rows of the fused projection.
                    p[: p.shape[0] - attn.num_key_value_heads * attn.head_dim].mul_(qk_gain)


# ---- capture ------------------------------------------------------------------------------------

class Capture:
    """Forward hooks on one self_attn module: its hidden_states input and its output."""

    def __init__(self, module: torch.nn.Module):
        self.hidden = None
        self.output = None
        self._handles = [
            module.register_forward_pre_hook(self._pre, with_kwargs=True),
            module.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, module, args, kwargs):
        hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        self.hidden = hidden.detach().clone()

    def _post(self, module, args, kwargs, output):
        out = output[0] if isinstance(output, tuple) else output
        self.output = out.detach().clone()

    def remove(self):
        for h in self._handles:
            h.remove()


def make_positions(seq_len: int, gapped: bool) -> torch.Tensor:
    """Increasing positions from POSITION_OFFSET; with gaps of 1..3 when `gapped`.

    RoPE is relative, so a constant offset alone cancels in q.k; gaps make the result depend on
    each token's own position, which catches an engine that rotates by sequence index.
    """
    steps = torch.randint(1, 4, (seq_len,)) if gapped else torch.ones(seq_len, dtype=torch.long)
    steps[0] = 0
    return POSITION_OFFSET + torch.cumsum(steps, 0)


def run_hf_case(model, layer_index: int, seq_len: int, d_model: int, gapped: bool):
    model.eval()
    attn = model.model.layers[layer_index].self_attn
    cap = Capture(attn)
    embeds = torch.randn(1, seq_len, d_model, dtype=torch.float32)
    positions = make_positions(seq_len, gapped)[None]
    # An explicit all-ones attention_mask: without it transformers reads gaps in position_ids as
    # boundaries of packed sequences and masks across them. The causal (and sliding-window) mask
    # is built from token indices (cache_position), never from position_ids.
    mask = torch.ones(1, seq_len, dtype=torch.long)
    with torch.no_grad():
        model(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, use_cache=False)
    cap.remove()
    assert cap.hidden is not None and cap.output is not None, "hooks did not fire"
    return cap.hidden[0], positions[0], cap.output[0]


# ---- spec mapping -------------------------------------------------------------------------------

def scale_or_default(scaling: float, qk_head_dim: int) -> float:
    """0 (our 'use 1/sqrt(qk head dim)') when the module's scale is that default, else the value."""
    default = qk_head_dim ** -0.5
    return 0.0 if math.isclose(scaling, default, rel_tol=1e-12) else float(scaling)


def rope_scaling_spec(config):
    """config.rope_scaling as our spec's "rope_scaling" object, or None for plain RoPE.

    Only the keys the engine reads; any other key transformers would honour fails here, so a case
    cannot silently test less than its config says."""
    rs = getattr(config, "rope_scaling", None)
    if not rs:
        return None
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(rs["factor"])}
    if kind == "llama3":
        return {"type": "llama3", "factor": float(rs["factor"]),
                "original_max_position_embeddings": int(rs["original_max_position_embeddings"]),
                "low_freq_factor": float(rs["low_freq_factor"]),
                "high_freq_factor": float(rs["high_freq_factor"])}
    if kind in ("longrope", "su"):
        raise AssertionError("rope_scaling longrope has no spec: switches factors by length")
    if kind == "yarn":
        # truncate=False (gpt-oss's real config) keeps the correction range unrounded.
        assert rs.get("attention_factor") is None, rs
        # The `or` defaults are _compute_yarn_parameters' own.
        return {"type": "yarn", "factor": float(rs["factor"]),
                "original_max_position_embeddings": int(
                    rs.get("original_max_position_embeddings") or config.max_position_embeddings),
                "beta_fast": float(rs.get("beta_fast") or 32),
                "beta_slow": float(rs.get("beta_slow") or 1),
                "mscale": float(rs.get("mscale") or 0),
                "mscale_all_dim": float(rs.get("mscale_all_dim") or 0),
                "truncate": bool(rs.get("truncate", True))}
    raise AssertionError(f"rope_scaling type {kind!r} has no spec mapping here")


def with_rope_scaling(spec: dict, config) -> dict:
    scaling = rope_scaling_spec(config)
    if scaling is not None:
        spec["rope_scaling"] = scaling
    return spec


def llama_like_spec(config, attn, expected_window: int = 0, variant: str = None) -> dict:
    """Spec for Llama/Mistral/Qwen2 attention (rotate_half RoPE over the full head_dim)."""
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    head_dim = attn.head_dim
    assert getattr(config, "partial_rotary_factor", 1.0) == 1.0
    # The window the mask actually uses: Qwen2 decides per layer (attn.sliding_window); Mistral
    # masks every layer with config.sliding_window when it is set (its module has no attribute).
    window = (attn.sliding_window if hasattr(attn, "sliding_window")
              else getattr(config, "sliding_window", None)) or 0
    assert window == expected_window, (window, expected_window)
    if variant is None:
        variant = "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa")
    return with_rope_scaling({
        "variant": variant,
        "d_model": config.hidden_size,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "qkv_bias": attn.q_proj.bias is not None,
        "o_bias": attn.o_proj.bias is not None,
        "rope": "half",
        "rope_theta": float(config.rope_theta),
        "causal": bool(attn.is_causal),
        "sliding_window": int(window),
        "softmax_scale": scale_or_default(attn.scaling, head_dim),
    }, config)


def variation_spec(config, attn, *, window, rope_theta, rope_scaling_config=None,
                   qk_norm="none", softcap=0.0, sinks=False, rotary_dim=0, rope="half",
                   qk_norm_eps=None) -> dict:
    """Spec for one layer of the families with attention variations (Qwen3, Gemma 2/3, gpt-oss,
    Phi-3, OLMo 2, Cohere): the caller states what the layer should have (its window, RoPE base,
    ...) and this asserts the module agrees, so a spec cannot silently describe less than the
    module does. qk_norm_eps: the norms' epsilon, config.rms_norm_eps unless given."""
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    head_dim = attn.head_dim
    assert (getattr(attn, "sliding_window", None) or 0) == window, (attn.sliding_window, window)
    assert (getattr(attn, "attn_logit_softcapping", None) or 0.0) == softcap
    assert hasattr(attn, "sinks") == sinks
    assert hasattr(attn, "q_norm") == (qk_norm != "none")
    if qk_norm_eps is None:
        qk_norm_eps = config.rms_norm_eps if qk_norm != "none" else 1e-6
    if qk_norm != "none":
        def eps(norm):  # Qwen3RMSNorm.variance_epsilon, Gemma3RMSNorm.eps
            return getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        assert eps(attn.q_norm) == eps(attn.k_norm) == qk_norm_eps
    fused = hasattr(attn, "qkv_proj")
    bias = (attn.qkv_proj if fused else attn.q_proj).bias is not None
    spec = {
        "variant": "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa"),
        "d_model": config.hidden_size,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "qkv_bias": bias,
        "o_bias": attn.o_proj.bias is not None,
        "rope": rope,
        "rope_theta": float(rope_theta),
        "causal": bool(attn.is_causal),
        "sliding_window": int(window),
        "softmax_scale": scale_or_default(attn.scaling, head_dim),
        "rotary_dim": int(rotary_dim),
        "qk_norm": qk_norm,
        "qk_norm_eps": float(qk_norm_eps),
        "attn_logit_softcapping": float(softcap),
        "attention_sinks": bool(sinks),
    }
    if rope_scaling_config is not None:
        with_rope_scaling(spec, rope_scaling_config)
    return spec


def deepseek_spec(config, attn) -> dict:
    eps = attn.kv_a_layernorm.variance_epsilon
    if config.q_lora_rank is not None:
        assert attn.q_a_layernorm.variance_epsilon == eps
    scaling = rope_scaling_spec(config)
    # Our default scale for MLA + YaRN includes DeepSeek's mscale(factor, mscale_all_dim)^2; the
    # module's own scale must equal it for softmax_scale 0 to stand for it.
    qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim  # V2's config lacks the sum
    default_scale = qk_head_dim ** -0.5
    if scaling and scaling["type"] == "yarn" and scaling["mscale_all_dim"]:
        default_scale *= _yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
    softmax_scale = (0.0 if math.isclose(attn.scaling, default_scale, rel_tol=1e-12)
                     else float(attn.scaling))
    return with_rope_scaling({
        "variant": "mla",
        "d_model": config.hidden_size,
        "num_heads": config.num_attention_heads,
        "num_kv_heads": 0,
        "head_dim": 0,
        "qkv_bias": False,
        "o_bias": False,
        # DeepSeek-V2 always rotates (2i, 2i + 1) pairs (complex multiplication); V3 may choose.
        "rope": "interleaved" if getattr(config, "rope_interleave", True) else "half",
        "rope_theta": float(config.rope_theta),
        "causal": bool(attn.is_causal),
        "sliding_window": 0,
        "softmax_scale": softmax_scale,
        "mla": {
            "q_lora_rank": config.q_lora_rank or 0,
            "kv_lora_rank": config.kv_lora_rank,
            "qk_nope_head_dim": config.qk_nope_head_dim,
            "qk_rope_head_dim": config.qk_rope_head_dim,
            "v_head_dim": config.v_head_dim,
            # The module's own eps: DeepseekV3Attention builds its RMSNorms with the default 1e-6,
            # not config.rms_norm_eps.
            "rms_norm_eps": float(eps),
        },
    }, config)


# ---- cases --------------------------------------------------------------------------------------

def llama_case(heads, kv_heads, head_dim, bias, layers, layer_index, seq_len):
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        attention_bias=bias, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = LlamaForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=2.0)
    return model, llama_like_spec(config, attn), layer_index, seq_len, "transformers LlamaForCausalLM"


def llama31_scaling_case():
    """Llama 3.1-style rope_scaling (llama3, factor 8, low 1, high 4) with an original context of
    64 so that positions up to ~200 rotate pairs of all three bands (kept, smoothed, divided)."""
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rms_norm_eps=1e-5, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = LlamaForCausalLM(config).to(torch.float32)
    attn = model.model.layers[0].self_attn
    reinit_attention(attn, qk_gain=2.0)
    return model, llama_like_spec(config, attn), 0, 97, "transformers LlamaForCausalLM"


def qwen2_yarn_case():
    """Qwen2.5-style YaRN without mscale: cos and sin are multiplied by 0.1 ln(4) + 1."""
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=4, rope_theta=1000000.0,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        max_position_embeddings=512, use_sliding_window=False,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[0].self_attn
    reinit_attention(attn, qk_gain=2.0)
    return model, llama_like_spec(config, attn), 0, 97, "transformers Qwen2ForCausalLM"


def qwen2_case():
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=4, rope_theta=1000000.0,
        max_position_embeddings=512, use_sliding_window=False,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None
    reinit_attention(attn, qk_gain=2.0)
    return model, llama_like_spec(config, attn), 0, 31, "transformers Qwen2ForCausalLM"


def mistral_case():
    window = 8
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, sliding_window=window,
        rope_theta=10000.0, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = MistralForCausalLM(config).to(torch.float32)
    attn = model.model.layers[0].self_attn
    reinit_attention(attn, qk_gain=2.0)
    spec = llama_like_spec(config, attn, expected_window=window)
    return model, spec, 0, 29, "transformers MistralForCausalLM"


def deepseek_case(q_lora_rank, layers, layer_index, seq_len, rope_scaling=None,
                  qk_rope_head_dim=8):
    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=q_lora_rank, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=qk_rope_head_dim, v_head_dim=16, rope_theta=10000.0,
        rope_scaling=rope_scaling,
        rope_interleave=True, rms_norm_eps=1e-5, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = DeepseekV3ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=1.5)
    return model, deepseek_spec(config, attn), layer_index, seq_len, "transformers DeepseekV3ForCausalLM"


class _RopeOf:
    """The config fields rope_scaling_spec reads, for a layer whose RoPE differs from config's."""

    def __init__(self, rope_scaling, max_position_embeddings):
        self.rope_scaling = rope_scaling
        self.max_position_embeddings = max_position_embeddings


def qwen3_case(layer_index, seq_len):
    """Qwen3: per-head RMSNorm of q and k (scale w); with use_sliding_window and
    max_window_layers=1, layer 1 of 2 has a window of 8 (crossed: seq_len > 8)."""
    window = 8
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=48, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=512, use_sliding_window=True,
        sliding_window=window, max_window_layers=1,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=2.0)
    spec = variation_spec(config, attn, window=window if layer_index >= 1 else 0,
                          rope_theta=config.rope_theta, qk_norm="rms")
    return model, spec, layer_index, seq_len, "transformers Qwen3ForCausalLM"


def gemma2_case(layer_index, seq_len, head_dim=32, heads=8, kv_heads=4):
    """Gemma 2: soft-capping 50 and query_pre_attn_scalar 24 (not head_dim); layers alternate
    sliding (even, window 8, crossed) and global (odd)."""
    window = 8
    config = Gemma2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        query_pre_attn_scalar=24, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        sliding_window=window, rope_theta=10000.0, rms_norm_eps=1e-6,
        max_position_embeddings=512, attn_implementation="eager", torch_dtype=torch.float32)
    assert config.layer_types == ["sliding_attention", "full_attention"], config.layer_types
    model = Gemma2ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    # A larger q/k gain than elsewhere: scores past +-50 so that the cap bends them.
    reinit_attention(attn, qk_gain=6.0)
    spec = variation_spec(config, attn, window=window if layer_index % 2 == 0 else 0,
                          rope_theta=config.rope_theta, softcap=50.0)
    assert math.isclose(spec["softmax_scale"], 24 ** -0.5, rel_tol=1e-7), spec
    return model, spec, layer_index, seq_len, "transformers Gemma2ForCausalLM"


def gemma3_case(layer_index, seq_len):
    """Gemma 3: q/k norm with (1 + w) scales; sliding layers (window 8) rotate with
    rope_local_base_freq 10000 and no scaling, global layers with rope_theta 1e6 and linear
    scaling 8 (Gemma 3's real rope_scaling); layer_types sliding, full."""
    window = 8
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=window, layer_types=["sliding_attention", "full_attention"],
        rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6,
        max_position_embeddings=512, attn_implementation="eager", torch_dtype=torch.float32)
    model = Gemma3ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=2.0)
    sliding = config.layer_types[layer_index] == "sliding_attention"
    assert attn.is_sliding == sliding
    spec = variation_spec(
        config, attn, window=window if sliding else 0,
        rope_theta=config.rope_local_base_freq if sliding else config.rope_theta,
        rope_scaling_config=None if sliding else config, qk_norm="rms_unit_offset")
    return model, spec, layer_index, seq_len, "transformers Gemma3ForCausalLM"


def olmo2_case(layer_index, seq_len, kv_heads, rope_scaling=None):
    """OLMo 2: RMSNorm of q_proj's and k_proj's whole output (all heads at once, scales of
    [heads * head_dim] and [kv_heads * head_dim]) before the split into heads and RoPE, eps
    rms_norm_eps; rope_theta 5e5 as OLMo-2-1124-7B; Olmo2Config's rope_scaling form
    ({"type", "factor"}, linear)."""
    config = Olmo2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, rope_theta=500000.0,
        rope_scaling=rope_scaling, rms_norm_eps=1e-6, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = Olmo2ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    assert attn.q_norm.weight.shape == (config.num_attention_heads * attn.head_dim,)
    assert attn.k_norm.weight.shape == (config.num_key_value_heads * attn.head_dim,)
    reinit_attention(attn, qk_gain=2.0)
    spec = variation_spec(config, attn, window=0, rope_theta=config.rope_theta,
                          rope_scaling_config=config, qk_norm="rms_across_heads")
    return model, spec, layer_index, seq_len, "transformers Olmo2ForCausalLM"


def cohere_case(layer_index, seq_len, kv_heads, rope_scaling=None):
    """Cohere (Command R, use_qk_norm): CohereLayerNorm of q and k per head before RoPE, mean-
    centred, no bias, each head its own scale ([heads, head_dim], [kv_heads, head_dim]), eps
    layer_norm_eps; RoPE on interleaved pairs (x[2i], x[2i + 1]); biases on q/k/v/o
    (attention_bias)."""
    config = CohereConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, use_qk_norm=True,
        layer_norm_eps=1e-4, rope_theta=75000.0, rope_scaling=rope_scaling, attention_bias=True,
        max_position_embeddings=512, attn_implementation="eager", torch_dtype=torch.float32)
    model = CohereForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    assert attn.q_norm.weight.shape == (config.num_attention_heads, attn.head_dim)
    assert attn.k_norm.weight.shape == (config.num_key_value_heads, attn.head_dim)
    reinit_attention(attn, qk_gain=2.0)  # Every head's scale drawn apart.
    spec = variation_spec(config, attn, window=0, rope_theta=config.rope_theta,
                          rope_scaling_config=config, qk_norm="layer_norm", rope="interleaved",
                          qk_norm_eps=config.layer_norm_eps)
    return model, spec, layer_index, seq_len, "transformers CohereForCausalLM"


def stablelm_for_causal_lm(config):
    """StableLmForCausalLM(config). transformers 4.57's StableLmPreTrainedModel._init_weights zeroes
    every nn.LayerNorm's bias, and the per-head q/k norms of qk_layernorm have none, so a fresh
    model raises (from_pretrained does not: its loaded norms are skipped). Built here with that
    one case mended: a LayerNorm without bias gets its scale set to ones, as the others."""
    cls = transformers.models.stablelm.modeling_stablelm.StableLmPreTrainedModel
    original = cls._init_weights

    def init_weights(self, module):
        if isinstance(module, torch.nn.LayerNorm) and module.bias is None:
            module.weight.data.fill_(1.0)
        else:
            original(self, module)

    cls._init_weights = init_weights
    try:
        return StableLmForCausalLM(config)
    finally:
        cls._init_weights = original


def stablelm_case(layer_index, seq_len, kv_heads, bias):
    """StableLM 2 (qk_layernorm, as stablelm-2-12b): StableLmLayerNormPerHead, one nn.LayerNorm
    without bias per head (its own scale, eps layer_norm_eps), before partial RoPE (a quarter of
    each head: partial_rotary_factor 0.25); q/k/v biases (use_qkv_bias), none on o_proj. The
    checkpoint holds the scales per head (q_layernorm.norms.H.weight)."""
    config = StableLmConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=kv_heads, qk_layernorm=True,
        layer_norm_eps=1e-4, rope_theta=10000.0, partial_rotary_factor=0.25, use_qkv_bias=bias,
        max_position_embeddings=512, attn_implementation="eager", torch_dtype=torch.float32)
    model = stablelm_for_causal_lm(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    assert len(attn.q_layernorm.norms) == 8 and len(attn.k_layernorm.norms) == kv_heads
    assert all(norm.bias is None for norm in attn.q_layernorm.norms)
    reinit_attention(attn, qk_gain=2.0)  # "layernorm" scales: every head its own, U(0.5, 1.5).
    head_dim = attn.head_dim
    assert attn.rotary_ndims == head_dim // 4
    heads = config.num_attention_heads
    spec = {
        "variant": "mha" if kv_heads == heads else ("mqa" if kv_heads == 1 else "gqa"),
        "d_model": config.hidden_size,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "qkv_bias": attn.q_proj.bias is not None,
        "o_bias": attn.o_proj.bias is not None,
        "rope": "half",
        "rope_theta": float(config.rope_theta),
        "causal": bool(attn.is_causal),
        "sliding_window": 0,
        "softmax_scale": 0.0,  # StableLmAttention divides by sqrt(head_dim).
        "rotary_dim": int(attn.rotary_ndims),
        "qk_norm": "layer_norm",
        "qk_norm_eps": float(attn.q_layernorm.norms[0].eps),
    }
    assert spec["qk_norm_eps"] == config.layer_norm_eps
    return model, spec, layer_index, seq_len, "transformers StableLmForCausalLM"


def gpt_oss_case(layer_index, seq_len, truncate=True):
    """gpt-oss: learned sinks, biases on q/k/v/o, layers alternating sliding (window 8) and full,
    YaRN factor 32 over an original context of 64 (beta_fast 32, beta_slow 1), with transformers'
    default truncation of the ramp bounds or, as the real config, truncate=False."""
    window = 8
    config = GptOssConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=window, rope_theta=150000.0,
        rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                      "truncate": truncate, "original_max_position_embeddings": 64},
        rms_norm_eps=1e-5, max_position_embeddings=4096,
        attn_implementation="eager", torch_dtype=torch.float32)
    assert config.layer_types == ["sliding_attention", "full_attention"], config.layer_types
    model = GptOssForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=2.0)
    sliding = config.layer_types[layer_index] == "sliding_attention"
    spec = variation_spec(config, attn, window=window if sliding else 0,
                          rope_theta=config.rope_theta, rope_scaling_config=config, sinks=True)
    assert spec["qkv_bias"] and spec["o_bias"], spec
    return model, spec, layer_index, seq_len, "transformers GptOssForCausalLM"


def phi3_case(layer_index, seq_len, partial_rotary_factor=1.0, window=None):
    """Phi-3: the fused qkv_proj checkpoint; optionally Phi-4-mini's partial_rotary_factor 0.75
    and Phi-3-mini's sliding window (on every layer, as Mistral)."""
    config = Phi3Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, rope_theta=10000.0,
        partial_rotary_factor=partial_rotary_factor, sliding_window=window,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = Phi3ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=2.0)
    rotary_dim = int(attn.head_dim * partial_rotary_factor)
    assert model.model.rotary_emb.inv_freq.shape[0] * 2 == rotary_dim
    # Phi3Attention has no sliding_window attribute; the mask uses config.sliding_window.
    attn.sliding_window = config.sliding_window
    spec = variation_spec(config, attn, window=window or 0, rope_theta=config.rope_theta,
                          rotary_dim=0 if rotary_dim == attn.head_dim else rotary_dim)
    del attn.sliding_window
    return model, spec, layer_index, seq_len, "transformers Phi3ForCausalLM"


def deepseek_v2_case(q_lora_rank, layers, layer_index, seq_len, rope_scaling=None):
    """DeepSeek-V2: MLA as V3, rotating (2i, 2i + 1) pairs by complex multiplication. Its YaRN
    here has mscale but no mscale_all_dim: with both, DeepSeek's own code (and attnserve) multiply
    the softmax scale by mscale(factor, mscale_all_dim)^2, which transformers' DeepseekV2Attention
    omits (kernels/model/hf_config.h), so that case would compare against a different model."""
    assert not (rope_scaling or {}).get("mscale_all_dim"), rope_scaling
    config = DeepseekV2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=64,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=q_lora_rank, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=16, v_head_dim=16, rope_theta=10000.0, rope_scaling=rope_scaling,
        rms_norm_eps=1e-5, max_position_embeddings=512,
        attn_implementation="eager", torch_dtype=torch.float32)
    model = DeepseekV2ForCausalLM(config).to(torch.float32)
    attn = model.model.layers[layer_index].self_attn
    reinit_attention(attn, qk_gain=1.5)
    return model, deepseek_spec(config, attn), layer_index, seq_len, "transformers DeepseekV2ForCausalLM"


class ResidualCapture(Capture):
    """Capture for BloomAttention, whose output already holds the block's residual (its second
    argument, dropout_add(dense(context), residual)): the attention's own output is the
    difference."""

    def _pre(self, module, args, kwargs):
        super()._pre(module, args, kwargs)
        residual = kwargs["residual"] if "residual" in kwargs else args[1]
        self.residual = residual.detach().clone()

    def _post(self, module, args, kwargs, output):
        super()._post(module, args, kwargs, output)
        self.output = self.output - self.residual


def alibi_case(out_dir, family: str, layers: int, layer_index: int, seq_len: int, heads: int,
               d_model: int, softmax_scale=None, max_seq_len=2048):
    """BLOOM (BloomAttention: per-head interleaved query_key_value, biases) or MPT (MptAttention:
    concatenated Wqkv, no biases): ALiBi, no RoPE. The model is saved as save_pretrained writes it
    (transformer.h.N.self_attention.query_key_value / dense, transformer.blocks.N.attn.Wqkv /
    out_proj, and config.json), so that our loader reads the real names. Returns the case files'
    contents as torch_mha_case does."""
    head_dim = d_model // heads
    if family == "bloom":
        config = BloomConfig(vocab_size=VOCAB, hidden_size=d_model, n_head=heads, n_layer=layers,
                             attn_implementation="eager", torch_dtype=torch.float32)
        model = BloomForCausalLM(config).to(torch.float32).eval()
        attn = model.transformer.h[layer_index].self_attention
        fused, out_proj = attn.query_key_value, attn.dense
        cap = ResidualCapture(attn)
    else:
        config = MptConfig(vocab_size=VOCAB, d_model=d_model, n_heads=heads, n_layers=layers,
                           max_seq_len=max_seq_len, expansion_ratio=2,
                           attn_config={"softmax_scale": softmax_scale},
                           attn_implementation="eager", torch_dtype=torch.float32)
        model = MptForCausalLM(config).to(torch.float32).eval()
        attn = model.transformer.blocks[layer_index].attn
        fused, out_proj = attn.Wqkv, attn.out_proj
        cap = Capture(attn)
    with torch.no_grad():  # nn.Linear's own init, biases U(-0.5, 0.5), q and k rows x2.
        for p in attn.parameters():
            if p.dim() == 1:
                p.uniform_(-0.5, 0.5)
            else:
                bound = 1.0 / math.sqrt(p.shape[1])
                p.uniform_(-bound, bound)
    with torch.no_grad():  # q and k rows x2: a peakier softmax, so the bias shows against it.
        if family == "bloom":
            fused.weight.view(heads, 3, head_dim, d_model)[:, :2].mul_(2.0)
        else:
            fused.weight[: 2 * d_model].mul_(2.0)

    embeds = torch.randn(1, seq_len, d_model, dtype=torch.float32)
    mask = torch.ones(1, seq_len, dtype=torch.long)
    with torch.no_grad():
        model(inputs_embeds=embeds, attention_mask=mask, use_cache=False)
    cap.remove()
    expected = cap.output[0]

    model.save_pretrained(out_dir, safe_serialization=True)
    scale = attn.inv_norm_factor if family == "bloom" else attn.softmax_scale
    spec = {
        "variant": "mha", "d_model": d_model, "num_heads": heads, "num_kv_heads": heads,
        "head_dim": head_dim, "qkv_bias": fused.bias is not None,
        "o_bias": out_proj.bias is not None, "rope": "none", "rope_theta": 10000.0,
        "causal": True, "sliding_window": 0, "softmax_scale": scale_or_default(scale, head_dim),
        "alibi": family, "alibi_bias_max": 8.0,
    }
    positions = torch.arange(POSITION_OFFSET, POSITION_OFFSET + seq_len)
    source = "transformers BloomForCausalLM" if family == "bloom" else "transformers MptForCausalLM"
    return spec, cap.hidden[0], positions, expected, expected, seq_len // 2, layer_index, source


def torch_mha_case(out_dir, causal: bool, seq_len: int):
    """nn.MultiheadAttention, converted to q/k/v/o_proj names. Returns the case files' contents."""
    embed, heads = 256, 8
    mha = torch.nn.MultiheadAttention(embed, heads, bias=True, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-0.5, 0.5)
        mha.out_proj.bias.uniform_(-0.5, 0.5)
        mha.in_proj_weight[: 2 * embed].mul_(4.0)  # Peakier softmax (xavier init is small).
    x = torch.randn(1, seq_len, embed)

    def attend(q_rows, kv_rows, mask=None):
        with torch.no_grad():
            out, _ = mha(q_rows, kv_rows, kv_rows, need_weights=False, attn_mask=mask)
        return out[0]

    mask = None
    if causal:
        # Bool mask: True = not allowed to attend.
        mask = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
    expected = attend(x, x, mask)

    split = seq_len // 2
    if causal:
        expected_split = expected
    else:
        # Prefill of the first `split` tokens attends among themselves; each decoded token attends
        # to everything cached so far, itself included.
        rows = [attend(x[:, :split], x[:, :split])]
        for t in range(split, seq_len):
            rows.append(attend(x[:, t:t + 1], x[:, :t + 1]))
        expected_split = torch.cat(rows, dim=0)

    w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3, dim=0)
    b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3, dim=0)
    prefix = "model.layers.0.self_attn."
    tensors = {
        prefix + "q_proj.weight": w_q, prefix + "q_proj.bias": b_q,
        prefix + "k_proj.weight": w_k, prefix + "k_proj.bias": b_k,
        prefix + "v_proj.weight": w_v, prefix + "v_proj.bias": b_v,
        prefix + "o_proj.weight": mha.out_proj.weight.detach(),
        prefix + "o_proj.bias": mha.out_proj.bias.detach(),
    }
    safetensors.torch.save_file({k: v.contiguous() for k, v in tensors.items()},
                                os.path.join(out_dir, "model.safetensors"),
                                metadata={"format": "pt"})
    spec = {
        "variant": "mha", "d_model": embed, "num_heads": heads, "num_kv_heads": heads,
        "head_dim": embed // heads, "qkv_bias": True, "o_bias": True, "rope": "none",
        "rope_theta": 10000.0, "causal": causal, "sliding_window": 0, "softmax_scale": 0.0,
    }
    positions = torch.arange(POSITION_OFFSET, POSITION_OFFSET + seq_len)
    return spec, x[0], positions, expected, expected_split, split


# ---- self-check: our reading of spec.json, in float64 numpy ------------------------------------
#
# Recomputes each case from model.safetensors + spec.json with the semantics documented in
# kernels/spec/layer_spec.h. Agreement proves that spec.json describes what transformers/torch
# computed, so when the C++ engine disagrees with "expected" the engine (not this mapping) is at
# fault.

def _yarn_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _inv_freq(spec, d):
    """Inverse frequencies [d/2] and the cos/sin factor, rope_scaling included (YaRN paper and
    Llama 3.1's reference formulas, written here independently of the C++ engine)."""
    theta = spec["rope_theta"]
    inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    rs = spec.get("rope_scaling")
    if not rs:
        return inv, 1.0
    factor = rs["factor"]
    if rs["type"] == "linear":
        return inv / factor, 1.0
    original = rs["original_max_position_embeddings"]
    if rs["type"] == "llama3":
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        wavelen = 2 * math.pi / inv
        smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
        return (1 - smooth) * inv / factor + smooth * inv, 1.0
    assert rs["type"] == "yarn", rs

    def dim_of(rotations):  # the pair count whose wavelength fits `rotations` times in `original`
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim_of(rs["beta_fast"]), dim_of(rs["beta_slow"])
    if rs.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    hi = hi + 0.001 if lo == hi else hi
    keep = 1 - np.clip((np.arange(d // 2) - lo) / (hi - lo), 0.0, 1.0)
    inv = inv / factor * (1 - keep) + inv * keep
    if rs["mscale"] and rs["mscale_all_dim"]:
        att = _yarn_mscale(factor, rs["mscale"]) / _yarn_mscale(factor, rs["mscale_all_dim"])
    else:
        att = _yarn_mscale(factor, 1.0)
    return inv, att


def _rope(x, positions, spec):
    """x [L, ..., d]; rotates pairs (i, i + d/2) ("half") or (2i, 2i + 1) ("interleaved")."""
    d, layout = x.shape[-1], spec["rope"]
    inv_freq, att = _inv_freq(spec, d)  # [d/2]
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [L, d/2]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (d // 2,)
    cos, sin = att * np.cos(angle).reshape(shape), att * np.sin(angle).reshape(shape)
    if layout == "half":
        a, b = x[..., : d // 2], x[..., d // 2:]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    if layout == "half":
        return np.concatenate([ra, rb], axis=-1)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = ra, rb
    return out


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _layer_norm(x, w, eps):
    """LayerNorm over the last axis without bias: StableLM 2's and Cohere's per-head q/k norm."""
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + eps) * w


def _visible(spec, seq_len, split):
    """[L, L] bool: query i may see key j. split=None: one-shot prefill."""
    i = np.arange(seq_len)[:, None]
    j = np.arange(seq_len)[None, :]
    if spec["causal"]:
        vis = j <= i
        if spec["sliding_window"]:
            vis &= j > i - spec["sliding_window"]
        return vis
    if split is None:
        return np.ones((seq_len, seq_len), dtype=bool)
    return np.where(i < split, j < split, j <= i)


def _alibi_slopes(spec):
    """The slopes kernels/spec/layer_spec.h states for Alibi kBloom and kMpt."""
    h = spec["num_heads"]
    if spec["alibi"] == "bloom":
        p = 2 ** int(math.floor(math.log2(h)))
        slopes = [2.0 ** (-8.0 * (k + 1) / p) for k in range(p)]
        slopes += [2.0 ** (-4.0 * (2 * k + 1) / p) for k in range(h - p)]
    else:
        n = 2 ** int(math.ceil(math.log2(h)))
        s = [2.0 ** (-(k + 1) * spec["alibi_bias_max"] / n) for k in range(n)]
        slopes = s if n == h else (s[1::2] + s[::2])[:h]
    return np.array(slopes, dtype=np.float64)


def reference_forward(spec, weights, hidden, positions, split=None):
    x = hidden.astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    seq_len, heads = x.shape[0], spec["num_heads"]

    def lin(name, inp):
        out = inp @ w[name + ".weight"].T
        return out + w[name + ".bias"] if name + ".bias" in w else out

    if spec["variant"] == "mla":
        m = spec["mla"]
        nope, rdim, vdim, rank = (m["qk_nope_head_dim"], m["qk_rope_head_dim"], m["v_head_dim"],
                                  m["kv_lora_rank"])
        if m["q_lora_rank"]:
            q = lin("q_b_proj", _rms(lin("q_a_proj", x), w["q_a_layernorm.weight"],
                                     m["rms_norm_eps"]))
        else:
            q = lin("q_proj", x)
        q = q.reshape(seq_len, heads, nope + rdim)
        ckv = lin("kv_a_proj_with_mqa", x)
        latent = _rms(ckv[:, :rank], w["kv_a_layernorm.weight"], m["rms_norm_eps"])
        k_rope = ckv[:, rank:]
        kv = lin("kv_b_proj", latent).reshape(seq_len, heads, nope + vdim)
        v = kv[..., nope:]
        if spec["rope"] != "none":
            q = np.concatenate([q[..., :nope], _rope(q[..., nope:], positions, spec)], axis=-1)
            k_rope = _rope(k_rope, positions, spec)
        k = np.concatenate([kv[..., :nope], np.broadcast_to(k_rope[:, None, :],
                                                            (seq_len, heads, rdim))], axis=-1)
        qk_dim = nope + rdim
    else:
        hd, kvh = spec["head_dim"], spec["num_kv_heads"]
        if "qkv_proj.weight" in w:  # Phi-3's fused projection: q, k, v rows stacked.
            qkv = lin("qkv_proj", x)
            q, k, v = np.split(qkv, [heads * hd, (heads + kvh) * hd], axis=-1)
        else:
            q, k, v = lin("q_proj", x), lin("k_proj", x), lin("v_proj", x)
        qk_norm = spec.get("qk_norm", "none")
        if qk_norm == "rms_across_heads":  # OLMo 2: the whole projection, before the split.
            q = _rms(q, w["q_norm.weight"], spec["qk_norm_eps"])
            k = _rms(k, w["k_norm.weight"], spec["qk_norm_eps"])
        q, k, v = (q.reshape(seq_len, heads, hd), k.reshape(seq_len, kvh, hd),
                   v.reshape(seq_len, kvh, hd))
        if qk_norm in ("rms", "rms_unit_offset"):
            offset = 1.0 if qk_norm == "rms_unit_offset" else 0.0
            q = _rms(q, offset + w["q_norm.weight"], spec["qk_norm_eps"])
            k = _rms(k, offset + w["k_norm.weight"], spec["qk_norm_eps"])
        if qk_norm == "layer_norm":  # A scale per head: [heads, hd] and [kv_heads, hd].
            q = _layer_norm(q, w["q_norm.weight"].reshape(heads, hd), spec["qk_norm_eps"])
            k = _layer_norm(k, w["k_norm.weight"].reshape(kvh, hd), spec["qk_norm_eps"])
        if spec["rope"] != "none":
            rd = spec.get("rotary_dim") or hd
            q = np.concatenate([_rope(q[..., :rd], positions, spec), q[..., rd:]], axis=-1)
            k = np.concatenate([_rope(k[..., :rd], positions, spec), k[..., rd:]], axis=-1)
        group = heads // kvh
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        qk_dim = hd
    scale = spec["softmax_scale"] or qk_dim ** -0.5
    rs = spec.get("rope_scaling")
    if not spec["softmax_scale"] and spec["variant"] == "mla" and rs and rs["type"] == "yarn" \
            and rs["mscale_all_dim"]:
        scale *= _yarn_mscale(rs["factor"], rs["mscale_all_dim"]) ** 2  # DeepseekV3Attention
    logits = np.einsum("ihd,jhd->hij", q, k) * scale
    cap = spec.get("attn_logit_softcapping", 0.0)
    if cap:
        logits = cap * np.tanh(logits / cap)
    if spec.get("alibi", "none") != "none":
        i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
        logits = logits + _alibi_slopes(spec)[:, None, None] * (j - i)[None]
    logits = np.where(_visible(spec, seq_len, split)[None], logits, -np.inf)
    if spec.get("attention_sinks"):
        # One more column per head, in the max and the sum, dropped from the weights.
        sink = w["sinks"][:, None, None]
        top = np.maximum(logits.max(-1, keepdims=True), sink)
        p = np.exp(logits - top)
        p /= p.sum(-1, keepdims=True) + np.exp(sink - top)
    else:
        logits -= logits.max(-1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(-1, keepdims=True)
    attn = np.einsum("hij,jhd->ihd", p, v).reshape(seq_len, -1)
    return lin("o_proj", attn)


def layer_weights(case_dir, spec, layer_index):
    """The layer's tensors from case_dir/model.safetensors under q/k/v/o_proj names (Phi-3's fused
    qkv_proj kept). BLOOM's and MPT's names are mapped independently of our loader: BLOOM's
    query_key_value rows per head as view(heads, 3, head_dim), MPT's Wqkv rows chunk(3)."""
    alibi = spec.get("alibi", "none")
    prefix, fused, out = {
        "bloom": (f"transformer.h.{layer_index}.self_attention.", "query_key_value", "dense"),
        "mpt": (f"transformer.blocks.{layer_index}.attn.", "Wqkv", "out_proj"),
    }.get(alibi, (f"model.layers.{layer_index}.self_attn.", None, None))
    weights = {}
    with safetensors.safe_open(os.path.join(case_dir, "model.safetensors"), "np") as f:
        for key in f.keys():
            if key.startswith(prefix):
                weights[key[len(prefix):]] = f.get_tensor(key)
    # StableLM's per-head q/k norm scales, stacked into [heads, head_dim] as Cohere stores them.
    for norm, module in (("q_norm", "q_layernorm"), ("k_norm", "k_layernorm")):
        heads = sorted(int(k.split(".")[2]) for k in weights if k.startswith(module + ".norms."))
        if heads:
            assert heads == list(range(len(heads))), heads
            weights[norm + ".weight"] = np.stack(
                [weights.pop(f"{module}.norms.{h}.weight") for h in heads])
    if fused is None:
        return weights
    mapped = {}
    for name, t in weights.items():
        module, leaf = name.rsplit(".", 1)
        if module == out:
            mapped["o_proj." + leaf] = t
        elif module == fused:
            if alibi == "bloom":
                heads, hd = spec["num_heads"], spec["head_dim"]
                parts = t.reshape(heads, 3, hd, *t.shape[1:])
                parts = [parts[:, i].reshape(heads * hd, *t.shape[1:]) for i in range(3)]
            else:
                parts = np.split(t, 3, axis=0)
            for proj, part in zip(("q_proj", "k_proj", "v_proj"), parts):
                mapped[f"{proj}.{leaf}"] = part
        else:
            raise AssertionError(f"{case_dir}: unexpected tensor {prefix}{name}")
    return mapped


def self_check(case_dir, spec, layer_index, split, hidden, positions, expected, expected_split):
    weights = layer_weights(case_dir, spec, layer_index)
    h, pos = hidden.double().numpy(), positions.numpy()
    errors = []
    for which, target, s in (("expected", expected, None), ("expected_split", expected_split, split)):
        ref = reference_forward(spec, weights, h, pos, s)
        t = target.double().numpy()
        rel = float(np.linalg.norm(ref - t) / np.linalg.norm(t))
        errors.append(rel)
        if not rel < 1e-5:
            raise AssertionError(f"{case_dir}: spec.json does not reproduce {which}: rel err {rel:.3e}")
    return errors


def write_case(out_root, name, spec, hidden, positions, expected, expected_split, layer_index,
               split, source, seed):
    case_dir = os.path.join(out_root, name)
    with open(os.path.join(case_dir, "spec.json"), "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    seq_len = hidden.shape[0]
    io = {
        "hidden": hidden.to(torch.float32).contiguous(),
        "positions": positions.to(torch.float32).contiguous(),
        "expected": expected.to(torch.float32).contiguous(),
        "expected_split": expected_split.to(torch.float32).clone().contiguous(),
    }
    safetensors.torch.save_file(io, os.path.join(case_dir, "io.safetensors"),
                                metadata={"layer_index": str(layer_index),
                                          "prefill_split": str(split)})
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump({"layer_index": layer_index, "prefill_split": split, "seq_len": seq_len,
                   "source": source, "seed": seed, "versions": versions()}, f, indent=2)
        f.write("\n")
    errors = self_check(case_dir, spec, layer_index, split, hidden, positions, expected,
                        expected_split)
    rms = float(expected.pow(2).mean().sqrt())
    print(f"  {name:31s} L={seq_len:3d} layer={layer_index} split={split:2d} "
          f"rms(expected)={rms:.3f} self-check rel err {errors[0]:.1e} / {errors[1]:.1e}")


HF_CASES = {
    # (a) GQA, head_dim = d_model / heads.
    "llama_gqa": lambda: llama_case(8, 2, 32, False, 1, 0, 37),
    # (a') GQA, head_dim 48 != 256 / 8, bias on q, k, v and o; layer index 1 of a 2-layer model.
    "llama_gqa_hd48_bias_layer1": lambda: llama_case(8, 2, 48, True, 2, 1, 37),
    # (b) MQA.
    "llama_mqa": lambda: llama_case(8, 1, 32, False, 1, 0, 33),
    # Bias on q, k, v only (no o_proj bias).
    "qwen2_qkv_bias": qwen2_case,
    # (c) Sliding window 8 < length 29.
    "mistral_swa": mistral_case,
    # (d) MLA with the low-rank query path, and with a plain q_proj (q_lora_rank=None); the
    # second on layer 1 of a 2-layer model whose layer 1 is MoE.
    "deepseek_v3_mla_qlora": lambda: deepseek_case(64, 1, 0, 37),
    "deepseek_v3_mla_noqlora_layer1": lambda: deepseek_case(None, 2, 1, 35),
    # (f) RoPE scaling, positions up to ~200 against an original context of 64: Llama 3.1's
    # llama3 bands; DeepSeek-V3's YaRN (its real rope_scaling but original_max_position_embeddings
    # 64; mscale = mscale_all_dim = 1 scales the softmax by mscale(40, 1)^2); Qwen2.5-style YaRN
    # without mscale (cos/sin times the attention factor).
    "llama31_rope_scaling": llama31_scaling_case,
    "deepseek_v3_yarn": lambda: deepseek_case(
        64, 1, 0, 97, qk_rope_head_dim=16,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 64,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),
    "qwen2_yarn": qwen2_yarn_case,
    # DeepSeek-V2: plain RoPE with the low-rank query; YaRN (mscale without mscale_all_dim, as
    # transformers and DeepSeek agree there) with a plain q_proj on layer 1 (an MoE layer).
    "deepseek_v2_mla_qlora": lambda: deepseek_v2_case(64, 1, 0, 37),
    "deepseek_v2_yarn_noqlora_layer1": lambda: deepseek_v2_case(
        None, 2, 1, 97,
        rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 64,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 0.707}),
    # (g) Attention variations of today's families, at layer 0 and at layer 1 where the per-layer
    # behaviour differs; windows of 8 crossed by every windowed case.
    "qwen3_qk_norm": lambda: qwen3_case(0, 37),
    "qwen3_qk_norm_window_layer1": lambda: qwen3_case(1, 29),
    "gemma2_softcap_sliding": lambda: gemma2_case(0, 29),
    "gemma2_softcap_global_layer1": lambda: gemma2_case(1, 33),
    "gemma2_hd256_sliding": lambda: gemma2_case(0, 27, head_dim=256, heads=4, kv_heads=2),
    "gemma3_qk_norm_local_rope": lambda: gemma3_case(0, 29),
    "gemma3_qk_norm_global_linear_layer1": lambda: gemma3_case(1, 97),
    "gpt_oss_sinks_sliding": lambda: gpt_oss_case(0, 29),
    "gpt_oss_sinks_yarn_layer1": lambda: gpt_oss_case(1, 97),
    # The real gpt-oss YaRN: truncate=False, fractional ramp bounds.
    "gpt_oss_untruncated_yarn_layer1": lambda: gpt_oss_case(1, 97, truncate=False),
    # 600 tokens: decode past 512 keys splits each step's keys (flash-decoding), and the sink
    # must join the combined softmax once, not once per split.
    "gpt_oss_sinks_long_layer1": lambda: gpt_oss_case(1, 600),
    # OLMo 2's q/k norm over all heads: GQA at layer 0; MHA (num_key_value_heads None) with
    # linear RoPE scaling at layer 1.
    "olmo2_qk_norm_across_heads": lambda: olmo2_case(0, 37, kv_heads=2),
    "olmo2_qk_norm_mha_linear_layer1": lambda: olmo2_case(
        1, 41, kv_heads=None, rope_scaling={"type": "linear", "factor": 2.0}),
    # Cohere's per-head q/k LayerNorm: GQA at layer 0; MHA (num_key_value_heads None) with linear
    # RoPE scaling at layer 1.
    "cohere_qk_layer_norm": lambda: cohere_case(0, 37, kv_heads=2),
    "cohere_qk_layer_norm_mha_linear_layer1": lambda: cohere_case(
        1, 41, kv_heads=None, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    # StableLM 2's per-head q/k LayerNorm with partial RoPE and q/k/v biases: GQA at layer 0; MHA
    # without biases at layer 1.
    "stablelm_qk_layer_norm": lambda: stablelm_case(0, 37, kv_heads=2, bias=True),
    "stablelm_qk_layer_norm_mha_layer1": lambda: stablelm_case(1, 41, kv_heads=8, bias=False),
    "phi3_fused_qkv": lambda: phi3_case(0, 31),
    "phi3_partial_rotary_window_layer1": lambda: phi3_case(1, 29, partial_rotary_factor=0.75,
                                                           window=8),
}
TORCH_CASES = {
    # (e) nn.MultiheadAttention: MHA without RoPE.
    "torch_mha_bidir": lambda d: torch_mha_case(d, causal=False, seq_len=23),
    "torch_mha_causal": lambda d: torch_mha_case(d, causal=True, seq_len=23),
}
# (h) ALiBi: BLOOM with 12 heads (the slopes' second series past 8) and MPT with 6 (its
# odd-then-even order), a later layer, MPT's own softmax_scale and a bias table longer than the
# sequence, and 600 tokens so decode splits the keys (each split must carry its keys' biases).
ALIBI_CASES = {
    "bloom_alibi_hd8": lambda d: alibi_case(d, "bloom", 1, 0, 37, heads=12, d_model=96),
    "bloom_alibi_long_layer1": lambda d: alibi_case(d, "bloom", 2, 1, 600, heads=6, d_model=96),
    "mpt_alibi": lambda d: alibi_case(d, "mpt", 1, 0, 33, heads=6, d_model=96, max_seq_len=64),
    "mpt_alibi_scale_layer1": lambda d: alibi_case(d, "mpt", 2, 1, 41, heads=8, d_model=128,
                                                   softmax_scale=0.2),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write case directories into")
    parser.add_argument("--seed", type=int, default=None,
                        help="torch seed (default: a fresh random seed, printed)")
    parser.add_argument("--only", default=None, help="comma-separated case names")
    args = parser.parse_args()

    seed = args.seed if args.seed is not None else secrets.randbits(31)
    print(f"make_peer_cases: seed {seed} (rerun with --seed {seed}); " +
          ", ".join(f"{k} {v}" for k, v in versions().items()))
    torch.set_num_threads(2)
    wanted = set(args.only.split(",")) if args.only else None
    all_names = list(HF_CASES) + list(TORCH_CASES) + list(ALIBI_CASES)
    if wanted:
        unknown = wanted - set(all_names)
        if unknown:
            parser.error(f"unknown case(s): {sorted(unknown)}; known: {all_names}")

    os.makedirs(args.out, exist_ok=True)
    for index, name in enumerate(all_names):
        if wanted and name not in wanted:
            continue
        # Each case draws from its own seed so that --only reproduces the same case.
        case_seed = seed + index
        torch.manual_seed(case_seed)
        case_dir = os.path.join(args.out, name)
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        if name in HF_CASES:
            model, spec, layer_index, seq_len, source = HF_CASES[name]()
            # Mistral keeps contiguous positions: its window counts tokens (indices), and with
            # contiguous positions that count cannot be confused with a position difference.
            # Windowed layers too: the mask counts token indices, and contiguous positions
            # make that count the same as a position difference.
            hidden, positions, expected = run_hf_case(
                model, layer_index, seq_len, model.config.hidden_size,
                gapped=not (name.startswith("mistral") or spec["sliding_window"]))
            # Every HF case here is causal, so prefill-then-decode must reproduce one-shot prefill.
            assert spec["causal"]
            model.save_pretrained(case_dir, safe_serialization=True)
            write_case(args.out, name, spec, hidden, positions, expected, expected, layer_index,
                       seq_len // 2, source, case_seed)
        elif name in ALIBI_CASES:
            spec, hidden, positions, expected, expected_split, split, layer_index, source = \
                ALIBI_CASES[name](case_dir)
            write_case(args.out, name, spec, hidden, positions, expected, expected_split,
                       layer_index, split, source, case_seed)
        else:
            spec, hidden, positions, expected, expected_split, split = TORCH_CASES[name](case_dir)
            write_case(args.out, name, spec, hidden, positions, expected, expected_split, 0, split,
                       "torch.nn.MultiheadAttention", case_seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
