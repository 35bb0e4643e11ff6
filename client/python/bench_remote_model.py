#!/usr/bin/env python3
"""Tokens/s of SmolLM2-135M-Instruct generating with its attention on attnserve
(attnserve_client.remote_model) against transformers' generate() on the same machine, by batch
size (docs/benchmarks.md, "A real model").

    build/release/server/attnserve_server --listen=127.0.0.1:50051 \\
        --checkpoint_root=build/release/models --threads=1 --compute_threads=1 \\
        --max_queue_delay=0 &
    OMP_NUM_THREADS=1 .venv/bin/python client/python/bench_remote_model.py \\
        --server=127.0.0.1:50051 --model_dir=build/release/models/SmolLM2-135M-Instruct

Every run generates exactly --tokens new tokens per prompt (no EOS stop), greedy, float32; the
prompts are distinct chat-templated questions (ragged lengths; transformers left-pads them).
Remote, one row per --modes entry: one prefill step (a Forward per layer), then per decode step
one call per layer for the whole batch: `unary` a Decode call, `stream` a DecodeStream message
(one stream per generation), `overlap` the stream with the batch split into two micro-batches
(one's MLPs in the client while the other's attention is on the server). The tokens of every
mode must equal those of the first (checked). Local: generate() with PyTorch on --local_threads
threads (a list: each is one column).

Also the round trips: the per-layer decode call as the client sees it (mean over every decode
call of the batch; its server part is Timing.total_ns, arrival to answer) against a
GetServerInfo round trip (median of --info_calls), the floor of one gRPC call.
Prints Markdown tables.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnserve_client import AttnServeClient  # noqa: E402
from attnserve_client.remote_model import GenerateStats, serve_attention  # noqa: E402
from attnserve.v1 import attention_service_pb2 as pb  # noqa: E402

TOPICS = ["the sea", "gravity", "Paris", "bees", "winter", "the moon", "coffee", "rivers",
          "music", "mountains", "trains", "clouds"]
MODES = {"unary": dict(decode_stream=False, overlap=False),
         "stream": dict(decode_stream=True, overlap=False),
         "overlap": dict(decode_stream=True, overlap=True)}


def prompts_for(tokenizer, n):
    return [tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Tell me something about {TOPICS[i % len(TOPICS)]}"
                                     f"{'!' * (i // len(TOPICS))}"}],
        add_generation_prompt=True) for i in range(n)]


@torch.no_grad()
def local_tokens_per_s(model, tokenizer, prompts, tokens, threads):
    torch.set_num_threads(threads)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    batch = tokenizer.pad({"input_ids": prompts}, return_tensors="pt")
    start = time.perf_counter()
    out = model.generate(**batch, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    seconds = time.perf_counter() - start
    assert out.shape[1] - batch["input_ids"].shape[1] == tokens
    return len(prompts) * tokens / seconds


def info_round_trip_ms(client, calls):
    """Median GetServerInfo round trip (the raw stub call: no result conversion)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        client.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=client.timeout_s)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_remote(remote, prompts, tokens, mode):
    for key, value in MODES[mode].items():
        setattr(remote, key, value)
    before = (remote.decode_calls, remote.decode_rpc_seconds, remote.decode_server_seconds)
    stats = GenerateStats()
    out = remote.generate(prompts, tokens, eos_token_id=[], stats=stats)
    calls = remote.decode_calls - before[0]
    per_call_ms = (remote.decode_rpc_seconds - before[1]) / max(calls, 1) * 1e3
    server_ms = (remote.decode_server_seconds - before[2]) / max(calls, 1) * 1e3
    return out, stats, per_call_ms, server_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--checkpoint", default="SmolLM2-135M-Instruct")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--local_threads", default="1,2")
    parser.add_argument("--modes", default="unary,stream,overlap")
    parser.add_argument("--info_calls", type=int, default=200)
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                              dtype=torch.float32).eval()
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.local_threads.split(",") if t]
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: '{mode}' is not one of {', '.join(MODES)}")
    remote_rows = {}  # (batch, mode) -> (stats, per-call ms, server ms)
    mismatches = []
    with AttnServeClient(args.server, timeout_s=300) as client:
        info_ms = info_round_trip_ms(client, args.info_calls)
        print(f"GetServerInfo round trip: {info_ms:.3f} ms (median of {args.info_calls})",
              file=sys.stderr, flush=True)
        with serve_attention(model, client, args.checkpoint, label="bench") as remote:
            for mode in modes:  # Warm up each path (and the micro-batch thread).
                run_remote(remote, prompts_for(tokenizer, 2), 4, mode)
            for batch in batches:
                prompts = prompts_for(tokenizer, batch)
                first = None
                for mode in modes:
                    out, stats, per_call_ms, server_ms = run_remote(remote, prompts, args.tokens,
                                                                    mode)
                    if first is None:
                        first = out
                    elif out != first:
                        mismatches.append(f"batch {batch}: {mode} differs from {modes[0]}")
                    remote_rows[(batch, mode)] = (stats, per_call_ms, server_ms)
                    print(f"remote batch {batch} {mode}: {stats.tokens_per_s:.1f} tokens/s "
                          f"({stats.rpc_seconds / stats.seconds:.0%} of the time in attnserve "
                          f"calls; decode call {per_call_ms:.2f} ms, server {server_ms:.2f} ms)",
                          file=sys.stderr, flush=True)
    local = {}
    for batch in batches:
        prompts = prompts_for(tokenizer, batch)
        for t in threads:
            local_tokens_per_s(model, tokenizer, prompts[:1], 4, t)  # warm up
            local[(batch, t)] = local_tokens_per_s(model, tokenizer, prompts, args.tokens, t)
            print(f"local batch {batch}, {t} threads: {local[(batch, t)]:.1f} tokens/s",
                  file=sys.stderr, flush=True)

    print("| " + " | ".join(["batch"] + [f"remote {m}, tokens/s (in calls)" for m in modes] +
                            [f"transformers, {t} thread{'s' if t > 1 else ''}, tokens/s"
                             for t in threads]) + " |")
    print("|" + "---|" * (1 + len(modes) + len(threads)))
    for batch in batches:
        cells = []
        for mode in modes:
            stats = remote_rows[(batch, mode)][0]
            cells.append(f"{stats.tokens_per_s:.1f} ({stats.rpc_seconds / stats.seconds:.0%})")
        cells += [f"{local[(batch, t)]:.1f}" for t in threads]
        print(f"| {batch} | " + " | ".join(cells) + " |")
    print()
    print(f"GetServerInfo round trip (median of {args.info_calls}): {info_ms:.3f} ms")
    print()
    print("| batch | " + " | ".join(f"{m}: per-layer decode call, ms (server part)"
                                     for m in modes) + " |")
    print("|" + "---|" * (1 + len(modes)))
    for batch in batches:
        print(f"| {batch} | " + " | ".join(
            f"{remote_rows[(batch, m)][1]:.2f} ({remote_rows[(batch, m)][2]:.2f})"
            for m in modes) + " |")
    if mismatches:
        print(f"\nTOKENS DIFFER: {'; '.join(mismatches)}")
        return 1
    print(f"\nEvery mode generated the same tokens as {modes[0]} at every batch.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
