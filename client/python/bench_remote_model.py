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
Remote: one prefill step, then one Decode per layer per step for the whole batch. Local:
generate() with PyTorch on --local_threads threads (a list: each is one row). Prints a Markdown
table.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnserve_client import AttnServeClient  # noqa: E402
from attnserve_client.remote_model import GenerateStats, serve_attention  # noqa: E402

TOPICS = ["the sea", "gravity", "Paris", "bees", "winter", "the moon", "coffee", "rivers",
          "music", "mountains", "trains", "clouds"]


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--checkpoint", default="SmolLM2-135M-Instruct")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--local_threads", default="1,2")
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                              dtype=torch.float32).eval()
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.local_threads.split(",")]
    rows = []
    with AttnServeClient(args.server, timeout_s=300) as client:
        with serve_attention(model, client, args.checkpoint, label="bench") as remote:
            remote.generate(prompts_for(tokenizer, 1), 4, eos_token_id=[])  # warm up
            for batch in batches:
                prompts = prompts_for(tokenizer, batch)
                stats = GenerateStats()
                remote.generate(prompts, args.tokens, eos_token_id=[], stats=stats)
                rows.append((batch, stats))
                print(f"remote batch {batch}: {stats.tokens_per_s:.1f} tokens/s "
                      f"({stats.rpc_seconds / stats.seconds:.0%} of the time in attnserve "
                      "calls)", file=sys.stderr, flush=True)
    local = {}
    for batch in batches:
        prompts = prompts_for(tokenizer, batch)
        local_tokens_per_s(model, tokenizer, prompts[:1], 4, threads[0])  # warm up
        for t in threads:
            local[(batch, t)] = local_tokens_per_s(model, tokenizer, prompts, args.tokens, t)
            print(f"local batch {batch}, {t} threads: {local[(batch, t)]:.1f} tokens/s",
                  file=sys.stderr, flush=True)

    header = "| batch | remote attention, tokens/s | in attnserve calls | " + " | ".join(
        f"transformers, {t} thread{'s' if t > 1 else ''}, tokens/s" for t in threads) + " |"
    print(header)
    print("|" + "---|" * (3 + len(threads)))
    for batch, stats in rows:
        print(f"| {batch} | {stats.tokens_per_s:.1f} | "
              f"{stats.rpc_seconds / stats.seconds:.0%} | " +
              " | ".join(f"{local[(batch, t)]:.1f}" for t in threads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
