#!/usr/bin/env python3
"""Draws `attnctl compare --json` output: KV memory and latency against prompt length per variant.

    attnctl compare --json > run.json
    .venv/bin/python client/python/plot_compare.py run.json --out comparison.png

(`attnctl compare --plot=comparison.png` runs this itself.) Three panels, log-log: the KV cache
the server holds for the batch after prefill (MiB, whole pages), the prefill time of the batch and
the decode step time of the batch (p50 of the server's compute time, with the p90 as a bar).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # No display: write files only.
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="attnctl compare --json output ('-' = stdin)")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args()
    with (sys.stdin if args.json == "-" else open(args.json, encoding="utf-8")) as f:
        run = json.load(f)

    panels = [
        ("KV cache held (MiB)", lambda at: (at["kv_bytes_server"] / 2**20, None)),
        ("prefill of the batch (ms)",
         lambda at: (at["prefill_ms"]["p50"], at["prefill_ms"]["p90"])),
        ("decode step of the batch (ms)",
         lambda at: (at["decode_ms"]["p50"], at["decode_ms"]["p90"])),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(16, 4.8))
    for axis, (title, value) in zip(axes, panels):
        for variant in run["variants"]:
            lengths = [at["length"] for at in variant["lengths"]]
            points = [value(at) for at in variant["lengths"]]
            p50 = [p[0] for p in points]
            line, = axis.plot(lengths, p50, marker="o", label=variant["label"])
            if points and points[0][1] is not None:
                upper = [max(p[1] - p[0], 0.0) for p in points]
                axis.errorbar(lengths, p50, yerr=[[0.0] * len(upper), upper], fmt="none",
                              ecolor=line.get_color(), capsize=3)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("prompt length (tokens)")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    server = run.get("server", {})
    fig.suptitle(f"attnctl compare: batch {run['batch']}, KV {run['kv_dtype']}, "
                 f"{run['repeats']} repeats; {server.get('backend', '?')} "
                 f"({server.get('device', '?')}); latency p50 with p90 bars")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
