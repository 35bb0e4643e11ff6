#!/usr/bin/env python3
"""Draws an attnbench sweep: inter-token latency (p50 and p99) against throughput per layer.

    attnbench --sweep=1,4,16,64 --out_dir=out --json > /dev/null
    .venv/bin/python client/attnbench/plot_sweep.py out/sweep.json --out out/sweep.png

(`attnbench --sweep=... --out_dir=DIR --plot` runs this itself.) One line per layer (label),
one point per swept value (concurrency C in closed_loop, arrival rate R in open_loop), marked
with it: x = decode tokens/s, y = step (inter-token) latency, p50 solid and p99 dashed, log y.
Open loop adds a second panel: time to first token p50/p99 against the achieved request rate.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")  # No display: write files only.
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="attnbench --json output or --out_dir's sweep.json ('-' = stdin)")
    parser.add_argument("--out", required=True, help="PNG to write")
    args = parser.parse_args()
    with (sys.stdin if args.json == "-" else open(args.json, encoding="utf-8")) as f:
        run = json.load(f)
    rows = [r for r in run["results"] if r.get("itl_ms") and r.get("tokens_per_s")]
    if not rows:
        print("plot_sweep.py: no rows with throughput and latency to draw", file=sys.stderr)
        return 1
    open_loop = run["workload"]["mode"] == "open_loop"
    fig, axes = plt.subplots(1, 2 if open_loop else 1, figsize=(13 if open_loop else 7.5, 5),
                             squeeze=False)
    labels = list(dict.fromkeys(r["label"] for r in rows))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def swept(r):
        return f"R={r['rate']:g}" if open_loop else f"C={r['concurrency']}"

    def lines(axis, x_of, key, xlabel, title):
        for i, label in enumerate(labels):
            mine = sorted((r for r in rows if r["label"] == label), key=x_of)
            xs = [x_of(r) for r in mine]
            color = colors[i % len(colors)]
            axis.plot(xs, [r[key]["p50"] for r in mine], "o-", color=color, label=f"{label} p50")
            axis.plot(xs, [r[key]["p99"] for r in mine], "s--", color=color, alpha=0.7,
                      label=f"{label} p99")
            for r, x in zip(mine, xs):
                axis.annotate(swept(r), (x, r[key]["p50"]), textcoords="offset points",
                              xytext=(4, -10), fontsize=7, color=color)
        axis.set_yscale("log")
        axis.set_xlabel(xlabel)
        axis.set_ylabel("ms")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)

    lines(axes[0][0], lambda r: r["tokens_per_s"], "itl_ms", "decode tokens/s (all streams)",
          "inter-token latency vs throughput")
    if open_loop:
        lines(axes[0][1], lambda r: r["request_throughput"], "ttft_ms", "completed requests/s",
              "time to first token vs request throughput")
    server = run.get("server", {})
    fig.suptitle(f"attnbench {run['workload']['mode']}, {server.get('backend', '?')} backend "
                 f"({server.get('target', '?')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
