#!/usr/bin/env python3
"""Runs cpu_attention_benchmark and its PyTorch CPU peer (torch_cpu_peer.py) back to back and
prints docs/benchmarks.md's table: every kernel's rate next to the ceiling measured in the same
run (sgemm GFLOP/s for prefill; read-only and memcpy bandwidth for decode) and PyTorch's time for
the same work, as ratios (PyTorch time / attnserve time: > 1 means attnserve is faster).

Each decode row is judged against the read-only ceiling at its own footprint (BM_ReadCeiling/<its
kv_bytes>: the same bytes read again and again, from whichever cache level holds them), the
ceiling it can approach; the 512 MiB ceiling (from memory) and memcpy stay beside it.

Usage: tests/benchmarks/run_cpu_benchmarks.py
           [--binary build/release/tests/benchmarks/cpu_attention_benchmark]
           [--python .venv/bin/python] [--rounds 3] [--filter REGEX] [--no_peer] [--peer_spin]
           [--save_json RAW.json] [--threads_table]

--threads_table runs SmolLM2-135M's attention shapes (prefill 512; decode batch 1, 8, 64 at
context 512; with --filter, the rows it names, e.g. 'BM_Prefill/./2048/|BM_Decode/./4096/./8'
for the main table's) on 1 thread and on all CPUs, attnserve (ATTNSERVE_BENCH_THREADS) and its
peer (torch.set_num_threads: transformers' LlamaAttention with its DynamicCache for SmolLM2, the
peer's own rows otherwise), and prints the speed-up of all threads over one, per thread, and each
side against the other.

The peer runs with OMP_WAIT_POLICY=PASSIVE unless --peer_spin (see run_peer).

With --rounds N, each round runs the engine's rows and then the peer's rows; every cell is the
median over rounds and the ratio column the median of the per-round ratios, so a burst of load
from other processes moves one round rather than one side of every ratio.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FILTER = (r"BM_(Sgemm|Copy|Read)Ceiling|BM_Prefill/./2048/|BM_Decode/./4096/"
                  r"|BM_DecodeAttention/./4096/")
MEMORY_READ_BYTES = 512 << 20  # BM_ReadCeiling's memory ceiling: far above any L3.


def run_engine(binary, benchmark_filter, tmp, threads=None):
    out = os.path.join(tmp, "bench.json")
    env = dict(os.environ)
    if threads is not None:
        env["ATTNSERVE_BENCH_THREADS"] = str(threads)
    subprocess.run([binary, f"--benchmark_out={out}", "--benchmark_out_format=json",
                    f"--benchmark_filter={benchmark_filter}"], check=True, stdout=sys.stderr,
                   env=env)
    with open(out) as f:
        return json.load(f)


def run_peer(python, peer_filter, threads, tmp, spin):
    out = os.path.join(tmp, "peer.json")
    env = dict(os.environ)
    if not spin:
        # PyTorch's OpenMP threads spin at every barrier by default; on cores shared with other
        # processes that spinning costs it up to 7x (measured: decode 288 ms a step spinning,
        # 42 ms passive, 39 ms on one thread). Passive waiting is PyTorch's best setting there.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    subprocess.run([python, os.path.join(HERE, "torch_cpu_peer.py"), f"--threads={threads}",
                    f"--filter={peer_filter}", f"--json={out}"], check=True, stdout=sys.stderr,
                   env=env)
    with open(out) as f:
        return json.load(f)


def load_average():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


SMOL_FILTER = r"BM_Smol(Prefill|Decode)/"


def row_shape(name, label):
    """A row's name in the threads table: SmolLM2's rows by their shape, the others by their
    variant and KV dtype (the benchmark's label) and their shape."""
    parts = name.split("/")
    if parts[0] == "BM_SmolPrefill":
        return f"SmolLM2 prefill {parts[1]}"
    if parts[0] == "BM_SmolDecode":
        return f"SmolLM2 decode ctx {parts[1]} x batch {parts[2]}"
    if parts[0] == "BM_Prefill":
        return f"{label}, prefill {parts[2]}"
    if parts[0] == "BM_Decode":
        return f"{label}, decode ctx {parts[2]} x batch {parts[4]}"
    return f"{label}, {name}"


def peer_key(name):
    """The peer's row name for an engine row (the peer names rows by the engine's first fields)."""
    parts = name.split("/")
    fields = {"BM_SmolPrefill": 2, "BM_SmolDecode": 3, "BM_Prefill": 4, "BM_Decode": 5}
    return "/".join(parts[:fields.get(parts[0], len(parts))])


def threads_table(args):
    """Engine and peer on 1 thread and on every CPU, back to back per round: the speed-up of all
    threads over one, and per thread (speed-up / threads: 1.0 = perfect scaling)."""
    all_threads = os.cpu_count()
    counts = [1, all_threads]
    engine = {t: [] for t in counts}
    peer = {t: [] for t in counts}
    loads = []
    labels = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for t in counts:
                loads.append(load_average())
                report = run_engine(args.binary, args.filter, tmp, threads=t)
                engine[t].append({b["name"]: b["real_time"] for b in report["benchmarks"]})
                labels.update({b["name"]: b.get("label", "") for b in report["benchmarks"]})
                if not args.no_peer:
                    peer[t].append(run_peer(args.python, args.filter, t, tmp,
                                            args.peer_spin)["rows"])
            loads.append(load_average())
    print(f"{all_threads} CPUs; {args.rounds} round(s), 1-minute load average "
          f"{min(loads):.1f}-{max(loads):.1f}; engine times in ms (Google Benchmark real time), "
          f"PyTorch = the peer's row (SmolLM2: transformers' LlamaAttention with a DynamicCache), "
          f"medians over rounds")
    print()
    n = all_threads
    print(f"| row | attnserve 1 thr ms | {n} thr ms | speed-up | per thread "
          f"| PyTorch 1 thr ms | {n} thr ms | speed-up | per thread | vs PyTorch 1 thr "
          f"| vs PyTorch {n} thr |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def med(rounds, name, scale=1.0):
        values = [r[name] * scale for r in rounds if name in r]
        return statistics.median(values) if values else None

    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    for name in engine[1][0]:
        key = peer_key(name)
        e1, en = med(engine[1], name), med(engine[n], name)
        p1, pn = med(peer[1], key, 1e3), med(peer[n], key, 1e3)
        e_up = e1 / en
        p_up = p1 / pn if p1 and pn else None
        print(f"| {row_shape(name, labels.get(name, ''))} | {e1:.2f} | {en:.2f} | {e_up:.2f}x | {e_up / n:.2f} | "
              f"{fmt(p1, '.2f')} | {fmt(pn, '.2f')} | {fmt(p_up, '.2f')}x | "
              f"{fmt(p_up / n if p_up else None, '.2f')} | "
              f"{fmt(p1 / e1 if p1 else None, '.2f')}x | {fmt(pn / en if pn else None, '.2f')}x |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary",
                        default="build/release/tests/benchmarks/cpu_attention_benchmark")
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--filter", default=DEFAULT_FILTER, help="Google Benchmark filter")
    parser.add_argument("--no_peer", action="store_true", help="skip the PyTorch peer")
    parser.add_argument("--peer_spin", action="store_true",
                        help="leave OMP_WAIT_POLICY to OpenMP's default (spinning) for the peer")
    parser.add_argument("--save_json", help="write every round's raw results here")
    parser.add_argument("--threads_table", action="store_true",
                        help="SmolLM2-135M rows (unless --filter) on 1 thread and on all, engine "
                             "and peer, with the speed-up per thread")
    args = parser.parse_args()
    if args.threads_table:
        if args.filter == DEFAULT_FILTER:
            args.filter = SMOL_FILTER
        return threads_table(args)

    engine_rounds, peer_rounds, loads = [], [], []
    peer_info = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            loads.append(load_average())
            report = run_engine(args.binary, args.filter, tmp)
            engine_rounds.append({b["name"]: b for b in report["benchmarks"]})
            if not args.no_peer:
                peer = run_peer(args.python, args.filter, report["context"]["num_cpus"], tmp,
                                args.peer_spin)
                peer_info = {"torch": peer["torch"], "threads": peer["threads"]}
                peer_rounds.append(peer["rows"])
            loads.append(load_average())

    if args.save_json:
        with open(args.save_json, "w") as f:
            json.dump({"engine": engine_rounds, "peer": peer_rounds, "load": loads}, f, indent=1)

    def median(name, field):
        values = [r[name][field] for r in engine_rounds if name in r]
        return statistics.median(values)

    def peer_ratio(name, key):
        # PyTorch seconds / attnserve seconds, per round, then the median.
        ratios = [p[key] / (e[name]["real_time"] / 1e3)
                  for e, p in zip(engine_rounds, peer_rounds) if key in p and name in e]
        return statistics.median(ratios) if ratios else None

    def peer_ms(name):
        values = [p[name] * 1e3 for p in peer_rounds if name in p]
        return statistics.median(values) if values else None

    names = list(engine_rounds[0])

    def ceiling(prefix, field):
        # None when --filter left the ceiling out (its tables are then skipped too).
        matches = [n for n in names if n.startswith(prefix)]
        return median(matches[0], field) if matches else None

    sgemm = ceiling("BM_SgemmCeiling", "GFLOPs")
    copy = ceiling("BM_CopyCeiling", "GBps")
    # Read-only ceilings by footprint in bytes (a binary from before the footprints has one,
    # unnamed: the memory's).
    reads = {}
    for n in names:
        if n == "BM_ReadCeiling" or n.startswith("BM_ReadCeiling/"):
            size = int(n.split("/")[1]) if "/" in n else MEMORY_READ_BYTES
            reads[size] = median(n, "GBps")
    read = reads.get(MEMORY_READ_BYTES)

    def read_at(name):
        """The read-only ceiling at the row's footprint (its kv_bytes), or None."""
        if "kv_bytes" not in engine_rounds[0][name]:
            return None
        return reads.get(int(engine_rounds[0][name]["kv_bytes"]))
    ctx = report["context"]
    print(f"Machine: {ctx.get('num_cpus')} CPUs @ {ctx.get('mhz_per_cpu')} MHz, "
          f"caches {[c['size'] // 1024 for c in ctx.get('caches', [])]} KiB; "
          f"{args.rounds} round(s), 1-minute load average {min(loads):.1f}-{max(loads):.1f}")
    if peer_info:
        policy = "OpenMP default wait policy" if args.peer_spin else (
            "OMP_WAIT_POLICY=" + os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
        print(f"Peer: PyTorch {peer_info['torch']} on {peer_info['threads']} threads, {policy}")
    print()
    def fmt(value, spec):
        return "n/a" if value is None else format(value, spec)

    print(f"Ceilings (same run): sgemm {fmt(sgemm, '.1f')} GFLOP/s; read-only {fmt(read, '.1f')} "
          f"GB/s (512 MiB, from memory); memcpy {fmt(copy, '.1f')} GB/s (read + write bytes)")
    footprints = sorted(b for b in reads if b != MEMORY_READ_BYTES)
    if footprints:
        print("Read-only at each decode footprint: " + "; ".join(
            f"{b / 2**20:.2f} MiB {reads[b]:.1f} GB/s" for b in footprints))
    print()

    print("| prefill | tokens | KV | ms | GFLOP/s | of sgemm | PyTorch ms | vs PyTorch |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in [n for n in names if n.startswith("BM_Prefill") and sgemm]:
        b = engine_rounds[0][name]
        _, _, length, _ = name.split("/")[:4]
        label, kv = b["label"].split(" kv=")
        key = "/".join(name.split("/")[:4])
        gflops = median(name, "GFLOPs")
        print(f"| {label} | {length} | {kv} | {median(name, 'real_time'):.1f} | {gflops:.1f} | "
              f"{gflops / sgemm:.0%} | {fmt(peer_ms(key), '.1f')} | "
              f"{fmt(peer_ratio(name, key), '.2f')}× |")
    print()
    def footprint(name):
        b = engine_rounds[0][name]
        return f"{b['kv_bytes'] / 2**20:.1f}" if "kv_bytes" in b else "n/a"

    def of(gbps, ceiling_gbps):
        return "n/a" if not ceiling_gbps else f"{gbps / ceiling_gbps:.0%}"

    # "of read": against the read ceiling at the row's footprint; "of memory read": against the
    # 512 MiB one, which a cache-resident footprint can pass.
    print("| decode step | context x batch | KV | KV MiB | ms | KV GB/s | read there GB/s | of read "
          "| of memory read | of memcpy | PyTorch ms | vs PyTorch |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in [n for n in names if n.startswith("BM_Decode/") and read and copy]:
        b = engine_rounds[0][name]
        parts = name.split("/")
        context, batch = parts[2], parts[4]
        key = "/".join(parts[:5])
        label, kv = b["label"].split(" kv=")
        gbps = median(name, "KV_GBps")
        there = read_at(name)
        print(f"| {label} | {context} x {batch} | {kv} | {footprint(name)} | "
              f"{median(name, 'real_time'):.2f} | {gbps:.1f} | {fmt(there, '.1f')} | "
              f"{of(gbps, there)} | {gbps / read:.0%} | {gbps / copy:.0%} | "
              f"{fmt(peer_ms(key), '.2f')} | {fmt(peer_ratio(name, key), '.2f')}× |")
    kernel_rows = [n for n in names
                   if n.startswith(("BM_DecodeAttention/", "BM_SmolDecodeAttention/"))]
    if kernel_rows:
        # The decode attention kernel alone (no projections, no KV append): against the read
        # ceiling at its footprint, which is what it can approach.
        print()
        print("| decode attention kernel | context x batch | KV | KV MiB | ms | KV GB/s "
              "| read there GB/s | of read | of memory read |")
        print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in kernel_rows:
            b = engine_rounds[0][name]
            parts = name.split("/")
            # BM_DecodeAttention/variant/context/kv/batch; BM_SmolDecodeAttention/context/batch.
            context, batch = (parts[1], parts[2]) if "Smol" in parts[0] else (parts[2], parts[4])
            label, kv = b["label"].split(" kv=")
            gbps = median(name, "KV_GBps")
            there = read_at(name)
            print(f"| {label} | {context} x {batch} | {kv} | {footprint(name)} | "
                  f"{median(name, 'real_time'):.2f} | {gbps:.1f} | {fmt(there, '.1f')} | "
                  f"{of(gbps, there)} | {of(gbps, read)} |")
    smol = [n for n in names if n.startswith("BM_SmolStep")]
    if smol and read:
        # The floor: the step's weights and KV read once at the read-only ceiling of this run.
        print()
        # layers=30: every layer in turn, weights from memory (see BM_SmolStep); times per layer.
        print("| SmolLM2-135M layer step | weights | batch | layers | µs per layer | "
              "fastest µs per layer | MB read per layer | read floor µs | × floor | "
              "fastest × floor |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in smol:
            label = engine_rounds[0][name]["label"]
            weights = label.split("weights=")[1].split()[0]
            batch = label.split("batch=")[1].split()[0]
            layers = int(label.split("layers=")[1].split()[0]) if "layers=" in label else 1
            step_bytes = median(name, "step_bytes") / layers
            floor_us = step_bytes / (read * 1e9) * 1e6
            us, best = median(name, "real_time") / layers, median(name, "best_us") / layers
            print(f"| ctx 128 | {weights} | {batch} | {layers} | {us:.0f} | {best:.0f} | "
                  f"{step_bytes / 1e6:.2f} | {floor_us:.0f} | {us / floor_us:.2f} | "
                  f"{best / floor_us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
