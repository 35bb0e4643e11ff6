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
threads (a list: each is one column). The remote rows' client runs PyTorch on --client_threads
threads (1 by default; on an otherwise idle machine, give both processes every core: the client
and the server take turns at batch 1 and 8, so `--client_threads=2` with the server's
`--threads=2` is transformers on 2 threads' like for like; the server's `--threads` are the
engine's threads, one layer call's loops, while `--compute_threads` are how many sessions' calls
run at once, which for the one model session here changes nothing).

Also the round trips: the per-layer decode call as the client sees it (mean over every decode
call of the batch; its server part is Timing.total_ns, arrival to answer, and of that the
layer's compute, Timing.compute_ns, printed per run; the client's CPU time in it, thread_time)
against a GetServerInfo round trip (median of --info_calls), the floor of one gRPC call, back to
back and each right after one decoder layer's MLP (where a generation's calls come). With --repeats, each batch's remote and local rows run back to back, the whole
set that many times, and the tables give medians (and the 1-minute load averages seen).
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


def info_round_trip_ms(client, calls, between=None):
    """Median GetServerInfo round trip (the raw stub call: no result conversion). With `between`,
    each call comes right after it (a decoder layer's MLP, as a generation's layer calls do: the
    cores and caches are the client's then, not the RPC's)."""
    times = []
    for i in range(calls):
        if between is not None:
            between(i)
        start = time.perf_counter()
        client.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=client.timeout_s)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_remote(remote, prompts, tokens, mode):
    for key, value in MODES[mode].items():
        setattr(remote, key, value)
    before = (remote.decode_calls, remote.decode_rpc_seconds, remote.decode_server_seconds,
              remote.decode_client_cpu_seconds, remote.decode_compute_seconds)
    stats = GenerateStats()
    out = remote.generate(prompts, tokens, eos_token_id=[], stats=stats)
    calls = remote.decode_calls - before[0]
    per_call_ms = (remote.decode_rpc_seconds - before[1]) / max(calls, 1) * 1e3
    server_ms = (remote.decode_server_seconds - before[2]) / max(calls, 1) * 1e3
    client_cpu_ms = (remote.decode_client_cpu_seconds - before[3]) / max(calls, 1) * 1e3
    compute_ms = (remote.decode_compute_seconds - before[4]) / max(calls, 1) * 1e3
    return out, stats, per_call_ms, server_ms, client_cpu_ms, compute_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--checkpoint", default="SmolLM2-135M-Instruct")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--local_threads", default="1,2")
    parser.add_argument("--client_threads", type=int, default=1,
                        help="PyTorch threads of the remote rows' client (its MLPs and head)")
    parser.add_argument("--modes", default="unary,stream,overlap")
    parser.add_argument("--info_calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of every row; the tables give each cell's median")
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                              dtype=torch.float32).eval()
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.local_threads.split(",") if t]
    # The local rows' own copy: `model`'s attention is remote while it is served.
    local_model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.float32).eval() if threads else None
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: '{mode}' is not one of {', '.join(MODES)}")
    # (batch, mode) -> per repeat: (tokens/s, share in calls, per-call ms, server ms, client
    # CPU ms); (batch, threads) -> per repeat: tokens/s.
    remote_rows = {}
    local = {}
    loads = []  # 1-minute load averages, sampled before every row
    info_ms = []
    info_in_place_ms = []
    mismatches = []
    with AttnServeClient(args.server, timeout_s=300) as client:
        with serve_attention(model, client, args.checkpoint, label="bench") as remote:
            torch.set_num_threads(args.client_threads)
            for mode in modes:  # Warm up each path (and the micro-batch thread).
                run_remote(remote, prompts_for(tokenizer, 2), 4, mode)
            for t in threads:
                local_tokens_per_s(local_model, tokenizer, prompts_for(tokenizer, 1), 4, t)
            mlps = [layer.mlp for layer in model.model.layers]
            row = torch.randn(1, 1, model.config.hidden_size)

            def one_mlp(i):
                with torch.no_grad():
                    mlps[i % len(mlps)](row)

            for repeat in range(args.repeats):
                info_ms.append(info_round_trip_ms(client, args.info_calls))
                info_in_place_ms.append(info_round_trip_ms(client, args.info_calls, one_mlp))
                print(f"run {repeat + 1}: GetServerInfo round trip {info_ms[-1]:.3f} ms back to "
                      f"back, {info_in_place_ms[-1]:.3f} ms each after one layer's MLP (medians "
                      f"of {args.info_calls})", file=sys.stderr, flush=True)
                for batch in batches:
                    # Remote and local back to back, so that both see about the same load.
                    prompts = prompts_for(tokenizer, batch)
                    first = None
                    for mode in modes:
                        loads.append(os.getloadavg()[0])
                        out, stats, per_call_ms, server_ms, cpu_ms, compute_ms = run_remote(
                            remote, prompts, args.tokens, mode)
                        if first is None:
                            first = out
                        elif out != first:
                            mismatches.append(f"batch {batch}: {mode} differs from {modes[0]}")
                        share = stats.rpc_seconds / stats.seconds
                        remote_rows.setdefault((batch, mode), []).append(
                            (stats.tokens_per_s, share, per_call_ms, server_ms, cpu_ms))
                        print(f"remote batch {batch} {mode}: {stats.tokens_per_s:.1f} tokens/s "
                              f"({share:.0%} of the time in attnserve calls; decode call "
                              f"{per_call_ms:.2f} ms, server {server_ms:.2f} ms of which compute "
                              f"{compute_ms:.2f} ms, client CPU "
                              f"{cpu_ms:.2f} ms)", file=sys.stderr, flush=True)
                    for t in threads:
                        loads.append(os.getloadavg()[0])
                        rate = local_tokens_per_s(local_model, tokenizer, prompts, args.tokens, t)
                        torch.set_num_threads(args.client_threads)  # The remote rows' client.
                        local.setdefault((batch, t), []).append(rate)
                        print(f"local batch {batch}, {t} threads: {rate:.1f} tokens/s",
                              file=sys.stderr, flush=True)

    med = statistics.median
    print(f"{args.repeats} run(s), the remote client on {args.client_threads} PyTorch "
          f"thread(s); 1-minute load average {min(loads):.1f} to {max(loads):.1f} "
          f"(median {med(loads):.1f}); GetServerInfo round trip (median of {args.info_calls}) "
          f"{', '.join(f'{m:.3f}' for m in info_ms)} ms back to back, "
          f"{', '.join(f'{m:.3f}' for m in info_in_place_ms)} ms after one layer's MLP each")
    print()
    print("| " + " | ".join(["batch"] + [f"remote {m}, tokens/s (in calls)" for m in modes] +
                            [f"transformers, {t} thread{'s' if t > 1 else ''}, tokens/s"
                             for t in threads] +
                            ([f"best remote / transformers {threads[0]}",
                              "best remote / best transformers"] if threads else [])) +
          " |")
    print("|" + "---|" * (1 + len(modes) + len(threads) + (2 if threads else 0)))
    for batch in batches:
        cells, best = [], 0.0
        for mode in modes:
            rows = remote_rows[(batch, mode)]
            rate = med(r[0] for r in rows)
            best = max(best, rate)
            cells.append(f"{rate:.1f} ({med(r[1] for r in rows):.0%})")
        cells += [f"{med(local[(batch, t)]):.1f}" for t in threads]
        if threads:
            cells.append(f"{best / med(local[(batch, threads[0])]):.2f}x")
            cells.append(f"{best / max(med(local[(batch, t)]) for t in threads):.2f}x")
        print(f"| {batch} | " + " | ".join(cells) + " |")
    print()
    print("| batch | " + " | ".join(f"{m}: per-layer decode call, ms (server part; client CPU)"
                                     for m in modes) + " |")
    print("|" + "---|" * (1 + len(modes)))
    for batch in batches:
        print(f"| {batch} | " + " | ".join(
            "{:.2f} ({:.2f}; {:.2f})".format(*(med(r[k] for r in remote_rows[(batch, m)])
                                              for k in (2, 3, 4)))
            for m in modes) + " |")
    if mismatches:
        print(f"\nTOKENS DIFFER: {'; '.join(mismatches)}")
        return 1
    print(f"\nEvery mode generated the same tokens as {modes[0]} at every batch.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
