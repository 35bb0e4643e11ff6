#!/usr/bin/env python3
"""The one verdict table of a GPU run (tests/gpu/run.sh): per implementation whether every
CUDA-vs-CPU case passed, each benchmark target of the GPU issue against what this run measured,
and the line `flashinfer default: yes|no (reason)`.

Reads run.sh's logs: gpu_test.txt (cuda_backend_test's summary), flashinfer_test.txt and
flashinfer_prefill_test.txt (FlashInfer's adapters against float64), kernel_bench.csv
(attention_kernel_bench, ours and FlashInfer's rows with their same-run ceilings), torch_peer.csv
(PyTorch SDPA at the same shapes), bench.txt (attnserve_cuda_bench: layer calls against their
kernels) and server_*.status/_demo.json/_bench.json (the real server under attnctl demo and
attnbench; `--servers-only LOG_DIR` prints just those rows, for run.sh --cpu-check). A target with no measurement in this run says so; nothing is carried over from another
run. Standard library only (the GPU machine's python3).

    python3 tests/gpu/verdict.py LOG_DIR
"""
import csv
import json
import os
import re
import sys


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_text(path):
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def rate(row):
    return float(row["work"]) / float(row["ms"])


def ceiling(rows, name):
    for r in rows:
        if r["kind"] == "ceiling" and r["case"] == name:
            return rate(r)
    return None


def matches(r, kind, heads, kv_heads, head_dim, dtype, min_batch, min_tokens, max_tokens=None):
    if r["kind"] != kind or r["dtype"] != dtype or int(r["window"]) != 0:
        return False
    if (int(r["heads"]), int(r["kv_heads"]), int(r["head_dim"])) != (heads, kv_heads, head_dim):
        return False
    tokens = int(r["tokens"])
    return (int(r["batch"]) >= min_batch and tokens >= min_tokens and
            (max_tokens is None or tokens <= max_tokens))


def torch_ms(torch_rows, r, kind):
    for t in torch_rows:
        if (t["kind"] == kind and t["dtype"] == r["dtype"] and t["batch"] == r["batch"] and
                t["tokens"] == r["tokens"] and t["window"] == r["window"] and
                t["heads"] == r["heads"] and t["kv_heads"] == r["kv_heads"] and
                t["head_dim"] == r["head_dim"]):
            return float(t["ms"])
    return None


def read_json(path):
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except ValueError:
        return None


def servers(logs):
    """The real server's rows (run.sh's run_server_checks): for each server_NAME.status, whether
    `attnctl demo` ran every variant (both backends serve all four demo variants, MLA included,
    so a refusal fails too) and attnbench's decode rate per stream count. True when all passed."""
    names = sorted(f[len("server_"):-len(".status")] for f in os.listdir(logs)
                   if f.startswith("server_") and f.endswith(".status"))
    print("verdict: the real server (attnserve_server, attnctl demo, attnbench)")
    if not names:
        print("  not run")
        return True
    ok = True
    for name in names:
        state = dict(kv.split("=", 1) for kv in read_text(
            os.path.join(logs, f"server_{name}.status")).split())
        if state.get("server") != "ok":
            print(f"  {name:<16} server did not start: FAIL (server_{name}.log)")
            ok = False
            continue
        probe = name.startswith("probe_")  # run.sh --probe: attnbench alone, no demo.
        demo = None if probe else read_json(os.path.join(logs, f"server_{name}_demo.json"))
        if probe:
            pass
        elif demo is None:
            print(f"  {name:<16} demo: no JSON (exit {state.get('demo')}): FAIL")
            ok = False
        else:
            ran = [v["variant"] for v in demo.get("variants", [])]
            refused = [f["variant"] for f in demo.get("failed", [])
                       if "UNIMPLEMENTED" in f.get("error", "")]
            broken = [f"{f['variant']} ({f.get('error', '')})" for f in demo.get("failed", [])
                      if "UNIMPLEMENTED" not in f.get("error", "")]
            good = bool(ran) and not broken and not refused
            ok = ok and good
            text = f"ran {', '.join(ran) or 'none'}"
            if refused:
                text += f"; refused as unserved: {', '.join(refused)}"
            if broken:
                text += f"; FAILED: {'; '.join(broken)}"
            backend = demo.get("server", {}).get("backend", "?")
            print(f"  {name:<16} demo on {backend}: {text}: {'pass' if good else 'FAIL'}")
        bench = read_json(os.path.join(logs, f"server_{name}_bench.json"))
        if bench is None:
            print(f"  {name:<16} attnbench: no JSON (exit {state.get('bench')}): FAIL")
            ok = False
        else:
            rows = bench.get("results", [])
            errors = bench.get("errors", 0)
            errors = len(errors) if isinstance(errors, list) else errors
            cells = ", ".join(f"c={r['concurrency']} {r['tokens_per_s']:.0f} tok/s "
                              f"(p50 {r['step_latency_ms']['p50']:.2f} ms)" for r in rows)
            if probe:
                # Where a step's time goes: the mean batch, and the server's queue and compute
                # per step against the client's step latency.
                cells = "; ".join(
                    f"c={r['concurrency']} {r['tokens_per_s']:.0f} tok/s, batch "
                    f"{(r.get('batch_size') or {}).get('mean') or 0:.1f}, step mean "
                    f"{r['step_latency_ms']['mean']:.2f} ms = server queue "
                    f"{(r.get('server_ms_per_step') or {}).get('queue', 0):.2f} + compute "
                    f"{(r.get('server_ms_per_step') or {}).get('compute', 0):.2f} + rest"
                    for r in rows)
            label = rows[0]["spec"] if rows else "-"
            good = (state.get("bench") == "0" and bool(rows) and not errors and
                    all(r["tokens_per_s"] > 0 for r in rows))
            ok = ok and good
            print(f"  {name:<16} attnbench {label}, ctx {rows[0]['context'] if rows else '-'}: "
                  f"{cells or 'no rows'}; errors {errors}: {'pass' if good else 'FAIL'}")
        if state.get("stop") != "0":
            print(f"  {name:<16} the server did not stop cleanly (exit {state.get('stop')}): FAIL")
            ok = False
    return ok


def main(argv):
    if len(argv) > 1 and argv[1] == "--servers-only":
        logs = argv[2] if len(argv) > 2 else os.environ.get("OUT", "/tmp/attnserve-gpu")
        return 0 if servers(logs) else 1
    logs = argv[1] if len(argv) > 1 else os.environ.get("OUT", "/tmp/attnserve-gpu")
    ours = read_rows(os.path.join(logs, "kernel_bench.csv"))
    torch = read_rows(os.path.join(logs, "torch_peer.csv"))
    tests = read_text(os.path.join(logs, "gpu_test.txt"))
    bench = read_text(os.path.join(logs, "bench.txt"))
    lines = []

    # Correctness: cuda_backend_test's summary rows, per implementation.
    print("verdict: correctness (cuda_backend_test, CUDA vs CPU engine)")
    for impl in ("native", "flashinfer"):
        rows = re.findall(r"^\S+\s+\S+\s+%s\s+\S+\s+\d+\s+\S+\s+\S+\s+(PASS|FAIL)$" % impl, tests,
                          re.M)
        if rows:
            failed = rows.count("FAIL")
            print(f"  {impl:<10} {len(rows) - failed}/{len(rows)} rows pass")
        else:
            print(f"  {impl:<10} no rows")
    adapters = {}
    for name, path, marker in (("decode", "flashinfer_test.txt", "FlashInfer decode"),
                               ("prefill", "flashinfer_prefill_test.txt", "FlashInfer prefill")):
        text = read_text(os.path.join(logs, path))
        if not text:
            adapters[name] = "not run"
        elif "SKIPPED" in text and marker in text:
            adapters[name] = "skipped"
        elif "[  FAILED  ]" in text or "FAILED TEST" in text:
            adapters[name] = "failed"
        elif "[  PASSED  ]" in text:
            adapters[name] = "passed"
        else:
            adapters[name] = "unknown"
        print(f"  FlashInfer {name} adapter vs float64: {adapters[name]}")

    # Benchmark targets.
    copy = ceiling(ours, "copy_d2d")
    print("verdict: targets (this run, this device)")
    print(f"  {'target':<66} {'impl':<10} {'measured':>9}  goal    result")

    def report(target, impl, value, goal, unit, at_most=False):
        sign = "<=" if at_most else ">="
        if value is None:
            print(f"  {target:<66} {impl:<10} {'-':>9}  {sign}{goal}{unit}  not measured")
            return
        ok = value <= goal if at_most else value >= goal
        print(f"  {target:<66} {impl:<10} {value:>8.2f}{unit}  {sign}{goal}{unit}  "
              f"{'met' if ok else 'missed'}")

    for impl, kind in (("native", "decode"), ("flashinfer", "flashinfer_decode")):
        cand = [r for r in ours if matches(r, kind, 32, 8, 128, "bf16", 32, 8192)]
        best_copy = max((rate(r) / copy for r in cand), default=None) if copy else None
        report("decode GQA 32/8 hd128 bf16 b>=32 ctx>=8k, of copy bandwidth", impl, best_copy,
               0.85, "")
        vs = [torch_ms(torch, r, "decode") / float(r["ms"]) for r in cand
              if torch_ms(torch, r, "decode")]
        report("decode GQA 32/8 hd128 bf16 b>=32 ctx>=8k, vs SDPA dense", impl,
               min(vs) if vs else None, 1.0, "x")
    for impl, kind in (("native", "mla_decode"), ("flashinfer", "flashinfer_mla_decode")):
        cand = [r for r in ours if matches(r, kind, 128, 1, 576, "bf16", 64, 8192)]
        best_copy = max((rate(r) / copy for r in cand), default=None) if copy else None
        report("MLA absorbed decode 128 heads 512+64 bf16 b64 ctx>=8k, of copy", impl, best_copy,
               0.80, "")
    for impl, kind in (("native", "prefill"), ("flashinfer", "flashinfer_prefill")):
        cand = [r for r in ours if matches(r, kind, 32, 8, 128, "bf16", 1, 4096, 8192)]
        vs = [torch_ms(torch, r, "prefill") / float(r["ms"]) for r in cand
              if torch_ms(torch, r, "prefill")]
        report("prefill hd128 causal bf16 4k-8k tokens, vs SDPA flash", impl,
               min(vs) if vs else None, 1.0, "x")
    # attnserve_cuda_bench rows: case impl phase batch tokens wall ... kernels x
    for m in re.finditer(r"^(\S+_bf16)\s+(native|flashinfer)\s+(prefill|decode)\s+.*\s(\d+\.\d+)$",
                         bench, re.M):
        x = float(m.group(4))
        report(f"layer call / its kernels alone, {m.group(1)} {m.group(3)}", m.group(2),
               x if x > 0 else None, 1.3, "x", at_most=True)
    report("service decode tok/s at 64 streams / kernel-only rate", "-", None, 0.7, "")
    print("  (service rate: the server's tok/s is below, with no kernel-only rate at its shape to "
          "divide by)")
    servers_ok = servers(logs)

    correct = re.search(r"^flashinfer correct: (yes|no)(.*)$", tests, re.M)
    if correct is None:
        verdict = "no (cuda_backend_test printed no FlashInfer verdict)"
    elif correct.group(1) != "yes":
        verdict = "no (" + correct.group(2).strip(" ()") + ")"
    elif any(v != "passed" for v in adapters.values()):
        verdict = "no (FlashInfer adapter tests: " + ", ".join(
            f"{k} {v}" for k, v in adapters.items()) + ")"
    else:
        verdict = "yes (every CUDA-vs-CPU case and both adapter tests passed on this device)"
    print(f"flashinfer default: {verdict}")
    return 0 if servers_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
