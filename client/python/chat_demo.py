#!/usr/bin/env python3
"""Chats with SmolLM2-135M-Instruct whose 30 attention layers run on attnserve
(attnserve_client.remote_model), prints the answer, and checks it token for token against
transformers' own generate() on the same float32 model. Exit status 1 on any difference.

    .venv/bin/python client/python/chat_demo.py --server=127.0.0.1:50051 \\
        --model_dir=build/release/models/SmolLM2-135M-Instruct \\
        --checkpoint=SmolLM2-135M-Instruct --prompt="What is the capital of France?"

--model_dir is the checkpoint on this machine (client/python/convert_gguf.py makes it);
--checkpoint names the same directory as the server sees it (relative to its --checkpoint_root).
deploy/run_demo.sh runs this after the variant table.
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
from attnserve_client import AttnServeClient, AttnServeError  # noqa: E402
from attnserve_client.remote_model import GenerateStats, serve_attention  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--checkpoint", default="SmolLM2-135M-Instruct")
    parser.add_argument("--prompt", default="Why is the sky blue? Answer in one sentence.")
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir,
                                                              dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                           add_generation_prompt=True)
    print(f"chat: user: {args.prompt}")
    try:
        with AttnServeClient(args.server, timeout_s=120) as client, \
                serve_attention(model, client, args.checkpoint, label="chat_demo") as remote:
            stats = GenerateStats()
            answer = remote.generate([prompt], args.tokens, stats=stats)[0]
    except AttnServeError as error:
        print(f"chat: {error}", file=sys.stderr)
        return 1
    print(f"chat: assistant ({model.config.num_hidden_layers} attention layers on attnserve): "
          f"{tokenizer.decode(answer, skip_special_tokens=True).strip()}")
    print(f"chat: {stats.new_tokens} tokens in {stats.seconds:.2f} s "
          f"({stats.tokens_per_s:.1f} tokens/s; {stats.rpc_seconds:.2f} s in attnserve calls)")

    start = time.perf_counter()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        expected = model.generate(ids, attention_mask=torch.ones_like(ids),
                                  max_new_tokens=args.tokens, do_sample=False)[0, len(prompt):]
    expected = expected.tolist()
    print(f"chat: transformers generate() alone: {len(expected)} tokens in "
          f"{time.perf_counter() - start:.2f} s")
    if answer != expected:
        first = next((i for i, (a, b) in enumerate(zip(answer, expected)) if a != b),
                     min(len(answer), len(expected)))
        print(f"chat: DIFFERENT from transformers generate() at token {first}:\n"
              f"  attnserve:    {answer}\n  transformers: {expected}\n"
              f"  transformers says: {tokenizer.decode(expected, skip_special_tokens=True)}",
              file=sys.stderr)
        return 1
    print(f"chat: token-identical to transformers generate() ({len(answer)}/{len(expected)} "
          "tokens)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
