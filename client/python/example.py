#!/usr/bin/env python3
"""Drives one attnserve session from Python: configure a GQA layer, prefill two prompts of
different lengths, decode 8 steps (unary Decode, or one DecodeStream with --stream), print the
output shapes and the server's timings, release the session.

    .venv/bin/python client/python/example.py --server=127.0.0.1:50051 [--stream]

Exits non-zero, naming the gRPC status, when a call fails or an output has the wrong shape.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attnserve_client import AttnServeClient, AttnServeError, LayerSpec  # noqa: E402

D_MODEL = 512
PROMPTS = {"alice": 48, "bob": 17}  # request id -> prompt tokens (ragged on purpose)
STEPS = 8


def check_shape(what: str, array: np.ndarray, expected: tuple) -> None:
    if array.shape != expected:
        raise SystemExit(f"example: {what} has shape {array.shape}, expected {expected}")
    if not np.isfinite(array).all():
        raise SystemExit(f"example: {what} has non-finite values")


def run(client: AttnServeClient, stream: bool, kv_dtype: str) -> None:
    health = client.health(wait_s=10)
    info = client.info()
    print(f"server {client.target}: {health}, {info.backend} backend ({info.device}), "
          f"version {info.version}, KV pool {info.kv_pool_capacity_bytes / 2**20:.1f} MiB")

    spec = LayerSpec("gqa", d_model=D_MODEL, num_heads=8, num_kv_heads=2, head_dim=64,
                     rope="half", causal=True)
    session = client.configure(spec, seed=7, kv_dtype=kv_dtype, label="python example")
    sid = session.session_id
    print(f"configured GQA session {sid}: {session.parameter_count} parameters, "
          f"{session.kv_bytes_per_token} KV bytes/token ({kv_dtype}), "
          f"max context {session.max_context_tokens} tokens")
    try:
        rng = np.random.default_rng(0)
        prompts = {rid: rng.standard_normal((n, D_MODEL), dtype=np.float32)
                   for rid, n in PROMPTS.items()}
        out = client.forward(sid, prompts)
        for rid, n in PROMPTS.items():
            check_shape(f"forward output of {rid}", out.outputs[rid], (n, D_MODEL))
            print(f"forward {rid}: output shape {out.outputs[rid].shape} {out.outputs[rid].dtype}, "
                  f"sequence_length {out.sequence_lengths[rid]}")
        print(f"forward timing: server compute {out.timing.compute_ms:.3f} ms, queue "
              f"{out.timing.queue_ms:.3f} ms, total {out.timing.total_ms:.3f} ms; "
              f"client {out.client_ms:.3f} ms")

        # Autoregressive flavour: each step's input is the previous step's output (scaled), as a
        # model would feed the next layer's input back after sampling.
        hidden = {rid: out.outputs[rid][-1] for rid in PROMPTS}

        def next_inputs(previous):
            return {rid: (x / (np.linalg.norm(x) + 1e-6) * np.sqrt(D_MODEL)).astype(np.float32)
                    for rid, x in previous.items()}

        compute_ms = []
        if stream:
            with client.open_decode_stream(sid) as decode_stream:
                for step in range(1, STEPS + 1):
                    result = decode_stream.step(next_inputs(hidden))
                    hidden = {rid: x[0] for rid, x in result.outputs.items()}
                    compute_ms.append(result.timing.compute_ms)
                    report_step(step, result)
        else:
            for step in range(1, STEPS + 1):
                # A call_id per step makes a retry after a lost answer safe (retries=2 retries on
                # DEADLINE_EXCEEDED / UNAVAILABLE / CANCELLED under the same id).
                inputs = next_inputs(hidden)
                result = client.decode(sid, inputs, call_id=f"step-{step}", retries=2)
                hidden = {rid: x[0] for rid, x in result.outputs.items()}
                compute_ms.append(result.timing.compute_ms)
                report_step(step, result)
            # What a retry sees when the first answer was lost: the same results, nothing appended.
            again = client.decode(sid, inputs, call_id=f"step-{STEPS}")
            for rid in PROMPTS:
                if (again.sequence_lengths[rid] != result.sequence_lengths[rid] or
                        not np.array_equal(again.outputs[rid], result.outputs[rid])):
                    raise SystemExit(f"example: the repeat of step {STEPS} under its call_id "
                                     f"was applied again for {rid}")
            print(f"repeat of step {STEPS} under its call_id: same outputs, nothing appended")
        for rid, n in PROMPTS.items():
            if result.sequence_lengths[rid] != n + STEPS:
                raise SystemExit(f"example: {rid} has sequence_length {result.sequence_lengths[rid]}"
                                 f", expected {n + STEPS}")
        print(f"decode ({'DecodeStream' if stream else 'unary Decode'}): {STEPS} steps, server "
              f"compute {np.mean(compute_ms):.3f} ms/step")
        used = client.get_session(sid).kv_bytes_used
        print(f"session KV in use: {used} bytes")
    finally:
        freed = client.release(sid)
        print(f"released session {sid}: freed {freed} bytes")


def report_step(step: int, result) -> None:
    for rid, x in result.outputs.items():
        check_shape(f"decode step {step} output of {rid}", x, (1, D_MODEL))
    shapes = ", ".join(f"{rid} {x.shape} len={result.sequence_lengths[rid]}"
                       for rid, x in result.outputs.items())
    print(f"decode step {step}: {shapes}; server compute {result.timing.compute_ms:.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="127.0.0.1:50051")
    parser.add_argument("--stream", action="store_true", help="decode over one DecodeStream")
    parser.add_argument("--kv_dtype", default="f32", choices=["f32", "f16", "bf16"])
    parser.add_argument("--timeout_s", type=float, default=60.0)
    # None = the client's environment fallbacks (ATTNSERVE_TLS_CA, ATTNSERVE_TOKEN, ...).
    parser.add_argument("--tls_ca", help="PEM CA of the server's certificate (TLS)")
    parser.add_argument("--tls_cert", help="client certificate (mutual TLS)")
    parser.add_argument("--tls_key", help="client key (mutual TLS)")
    parser.add_argument("--token", help="bearer token (prefer ATTNSERVE_TOKEN: argv is public)")
    args = parser.parse_args()
    try:
        with AttnServeClient(args.server, timeout_s=args.timeout_s, tls_ca=args.tls_ca,
                             tls_cert=args.tls_cert, tls_key=args.tls_key,
                             token=args.token) as client:
            run(client, args.stream, args.kv_dtype)
    except AttnServeError as error:
        print(f"example: {error}", file=sys.stderr)
        return 1
    print("example: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
