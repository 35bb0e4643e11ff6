#!/usr/bin/env python3
"""Runs cpu_attention_benchmark and prints docs/benchmarks.md's table: every kernel's rate next to
the ceiling measured in the same run (sgemm GFLOP/s for prefill; read-only and memcpy bandwidth for
decode), as ratios.

Usage: tests/benchmarks/run_cpu_benchmarks.py [--binary build/release/tests/benchmarks/cpu_attention_benchmark]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="build/release/tests/benchmarks/cpu_attention_benchmark")
    parser.add_argument("--repetitions", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.json")
        subprocess.run([args.binary, f"--benchmark_out={out}", "--benchmark_out_format=json",
                        f"--benchmark_repetitions={args.repetitions}",
                        "--benchmark_report_aggregates_only=true" if args.repetitions > 1 else
                        "--benchmark_report_aggregates_only=false"],
                       check=True, stdout=sys.stderr)
        with open(out) as f:
            report = json.load(f)

    runs = [b for b in report["benchmarks"]
            if args.repetitions == 1 or b.get("aggregate_name") == "median"]
    def find(prefix):
        return [b for b in runs if b["name"].startswith(prefix)]

    sgemm = find("BM_SgemmCeiling")[0]["GFLOPs"]
    copy = find("BM_CopyCeiling")[0]["GBps"]
    read = find("BM_ReadCeiling")[0]["GBps"]
    ctx = report["context"]
    print(f"Machine: {ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, "
          f"caches {[c['size'] // 1024 for c in ctx.get('caches', [])]} KiB")
    print()
    print(f"Ceilings (same run): sgemm {sgemm:.1f} GFLOP/s; read-only {read:.1f} GB/s; "
          f"memcpy {copy:.1f} GB/s (read + write bytes)")
    print()
    print("| prefill | tokens | KV | ms | GFLOP/s | of sgemm |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for b in find("BM_Prefill"):
        _, _, length, _ = b["name"].split("/")[:4]
        label, kv = b["label"].split(" kv=")
        print(f"| {label} | {length} | {kv} | {b['real_time']:.1f} | {b['GFLOPs']:.1f} | "
              f"{b['GFLOPs'] / sgemm:.0%} |")
    print()
    print("| decode step | context x batch | KV | ms | KV GB/s | of read | of memcpy |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for b in find("BM_Decode"):
        parts = b["name"].split("/")
        context, batch = parts[2], parts[4]
        label, kv = b["label"].split(" kv=")
        print(f"| {label} | {context} x {batch} | {kv} | {b['real_time']:.2f} | "
              f"{b['KV_GBps']:.1f} | {b['KV_GBps'] / read:.0%} | {b['KV_GBps'] / copy:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
