#!/usr/bin/env python3
"""PyTorch peer of attention_kernel_bench: the same attention shapes on the same GPU.

    python3 tests/gpu/torch_peer_bench.py [--quick] [--ours KERNEL_BENCH.csv] [--csv OUT.csv]

Measures, with torch.cuda.Event around each call (median of the samples after a warm-up; the L2
is flushed before every sample by an untimed write of 4x its size, as attention_kernel_bench
does):

  ceilings   copy: dst.copy_(src) of 1 GiB (bytes read + written); read: torch.sum over 1 GiB of
             float32 (bytes read); GEMM: torch.matmul n^3 in bf16 and f16 (cuBLAS, fp32
             accumulation) and f32 (TF32 off), 2 n^3 FLOPs.
  decode     scaled_dot_product_attention of one query per sequence over a dense [batch, kv_heads,
             context, head_dim] K and V (a sliding window: the last `window` keys, a view);
             rated in KV bytes read (visible keys x kv_heads x (K + V) x head_dim x element size),
             the same count as attention_kernel_bench.
  prefill    scaled_dot_product_attention(is_causal=True) of [batch, heads, tokens, head_dim];
             a sliding window needs a boolean band mask, which the flash backend does not take, so
             that case runs on whichever backend accepts the mask (named in the table). Rated in
             useful FLOPs: 4 x head_dim x heads x visible (query, key) pairs, masked pairs not
             counted, as attention_kernel_bench.

GQA and MQA use enable_gqa=True (PyTorch >= 2.5); on an older PyTorch K and V are expanded to
all query heads before timing (marked "expanded": such a peer reads group-times more bytes).
The backend is chosen per case: flash first, then cuDNN, memory-efficient, math; the table names
the one that ran.

--ours takes the shapes from attention_kernel_bench's --csv output (so both run exactly the same
cases) and ends with a table of attnserve's time against PyTorch's for each case.

Exits 0 with a "skipped" line when PyTorch or a CUDA device is missing; 1 when a measurement
failed. Python 3.11; needs only torch.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import warnings

GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str  # "decode" or "prefill"
    name: str
    dtype: str  # "bf16", "f16", "f32"
    heads: int
    kv_heads: int
    head_dim: int
    batch: int
    tokens: int  # decode: cached tokens incl. the new one; prefill: new tokens from position 0
    window: int  # 0 = no sliding window


# The built-in list mirrors DecodeCases / PrefillCases of attention_kernel_bench.cc; --ours
# replaces it with the cases the kernel bench actually ran.
_GQA = ("gqa32x8_hd128_bf16", "bf16", 32, 8, 128)
_MHA = ("mha32_hd128_bf16", "bf16", 32, 32, 128)
_MQA = ("mqa32_hd64_f16", "f16", 32, 1, 64)
_GQA_F32 = ("gqa32x8_hd128_f32", "f32", 32, 8, 128)


def builtin_cases(quick: bool) -> list[Case]:
    if quick:
        decode = [(_GQA, 8, 1024, 0), (_GQA, 4, 2048, 1024), (_MHA, 4, 1024, 0),
                  (_MQA, 16, 1024, 0), (_GQA_F32, 4, 512, 0)]
        prefill = [(_GQA, 1, 512, 0), (_GQA, 1, 1024, 256), (_MHA, 1, 512, 0),
                   (_MQA, 1, 512, 0), (_GQA_F32, 1, 256, 0)]
    else:
        decode = [(_GQA, 8, 1024, 0), (_GQA, 32, 1024, 0), (_GQA, 8, 4096, 0),
                  (_GQA, 32, 4096, 0), (_GQA, 8, 8192, 0), (_GQA, 32, 8192, 0),
                  (_GQA, 16, 8192, 4096), (_MHA, 8, 4096, 0), (_MQA, 64, 8192, 0),
                  (_GQA_F32, 8, 2048, 0)]
        prefill = [(_GQA, 1, 1024, 0), (_GQA, 1, 2048, 0), (_GQA, 1, 4096, 0),
                   (_GQA, 4, 2048, 0), (_GQA, 1, 4096, 1024), (_MHA, 1, 4096, 0),
                   (_MQA, 1, 4096, 0), (_GQA_F32, 1, 1024, 0)]
    cases = []
    for kind, rows in (("decode", decode), ("prefill", prefill)):
        for (name, dtype, heads, kv_heads, head_dim), batch, tokens, window in rows:
            cases.append(Case(kind, name, dtype, heads, kv_heads, head_dim, batch, tokens, window))
    return cases


def read_ours(path: str) -> tuple[list[Case], dict[Case, float], dict[str, dict]]:
    """Cases, attnserve's ms per case, and its ceiling rows, from attention_kernel_bench --csv."""
    cases: list[Case] = []
    ms: dict[Case, float] = {}
    ceilings: dict[str, dict] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["kind"] == "ceiling":
                ceilings[row["case"]] = {"ms": float(row["ms"]), "work": float(row["work"])}
                continue
            if row["kind"] not in ("decode", "prefill"):
                # Other implementations' rows (flashinfer_decode, flashinfer_prefill): not ours.
                continue
            case = Case(row["kind"], row["case"], row["dtype"], int(row["heads"]),
                        int(row["kv_heads"]), int(row["head_dim"]), int(row["batch"]),
                        int(row["tokens"]), int(row["window"]))
            cases.append(case)
            ms[case] = float(row["ms"])
    return cases, ms, ceilings


def element_size(dtype: str) -> int:
    return 4 if dtype == "f32" else 2


def visible_keys(query: int, window: int) -> int:
    """Keys query `query` sees under a causal mask with an optional sliding window."""
    return min(query + 1, window) if window > 0 else query + 1


def work_of(case: Case) -> float:
    """Decode: KV bytes read; prefill: attention FLOPs. Same counts as attention_kernel_bench."""
    if case.kind == "decode":
        keys = visible_keys(case.tokens - 1, case.window)
        return (float(case.batch) * keys * case.kv_heads * 2 * case.head_dim *
                element_size(case.dtype))
    pairs = sum(visible_keys(t, case.window) for t in range(case.tokens))
    return 4.0 * case.head_dim * case.heads * case.batch * pairs


def ratio(rate: float | None, ceiling: float | None) -> str:
    if not rate or not ceiling:
        return "n/a"
    return f"{100.0 * rate / ceiling:.1f}%"


def label(case: Case) -> str:
    window = f" w{case.window}" if case.window else ""
    return f"{case.kind} {case.name} b{case.batch} t{case.tokens}{window}"


class Bench:
    """Everything that touches torch; constructed only once torch and a device are known good."""

    def __init__(self, torch, quick: bool):
        self.torch = torch
        self.quick = quick
        self.warmup = 2 if quick else 3
        self.samples = 5 if quick else 20
        props = torch.cuda.get_device_properties(0)
        self.props = props
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        self.l2 = l2
        self.flush = torch.empty(max(4 * l2, 64 * MIB), dtype=torch.uint8, device="cuda")
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)
        self.dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
        from torch.nn.attention import SDPBackend  # PyTorch >= 2.3
        self.backends = [("flash", SDPBackend.FLASH_ATTENTION)]
        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            self.backends.append(("cudnn", SDPBackend.CUDNN_ATTENTION))
        self.backends += [("efficient", SDPBackend.EFFICIENT_ATTENTION),
                          ("math", SDPBackend.MATH)]

    def median_ms(self, fn) -> float:
        torch = self.torch
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for i in range(self.samples):
            self.flush.fill_(i & 0xFF)  # untimed: every sample starts with a cold L2
            self.start.record()
            fn()
            self.stop.record()
            self.stop.synchronize()
            times.append(self.start.elapsed_time(self.stop))
        times.sort()
        return times[len(times) // 2]

    # ---- ceilings -------------------------------------------------------------------------------

    def ceilings(self) -> dict[str, tuple[float, float]]:
        """name -> (ms, work): copy and read in bytes, GEMMs in FLOPs."""
        torch = self.torch
        out: dict[str, tuple[float, float]] = {}
        size = 256 * MIB if self.quick else GIB
        src = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        out["copy_d2d"] = (self.median_ms(lambda: dst.copy_(src)), 2.0 * size)
        del dst
        out["read_sweep"] = (self.median_ms(lambda: src.sum()), float(size))
        del src
        n = 4096 if self.quick else 8192
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # plain fp32, like cublasSgemm there
        try:
            for name, dtype in (("gemm_bf16", "bf16"), ("gemm_f16", "f16"), ("sgemm_f32", "f32")):
                a = torch.rand(n, n, dtype=self.dtypes[dtype], device="cuda")
                b = torch.rand(n, n, dtype=self.dtypes[dtype], device="cuda")
                out[name] = (self.median_ms(lambda: torch.matmul(a, b)), 2.0 * n ** 3)
                del a, b
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
        torch.cuda.empty_cache()
        return out

    # ---- attention ------------------------------------------------------------------------------

    def _sdpa(self, q, k, v, causal: bool, mask, gqa: bool):
        F = self.torch.nn.functional
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                                  enable_gqa=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)

    def attention(self, case: Case) -> tuple[float, str]:
        """(median ms, backend description) of one case."""
        torch = self.torch
        from torch.nn.attention import sdpa_kernel
        dtype = self.dtypes[case.dtype]
        gen = torch.Generator(device="cuda").manual_seed(1234)

        def rand(*shape):
            return torch.rand(*shape, dtype=dtype, device="cuda", generator=gen) * 2 - 1

        q_len = 1 if case.kind == "decode" else case.tokens
        q = rand(case.batch, case.heads, q_len, case.head_dim)
        k = rand(case.batch, case.kv_heads, case.tokens, case.head_dim)
        v = rand(case.batch, case.kv_heads, case.tokens, case.head_dim)
        mask = None
        causal = False
        if case.kind == "decode":
            if case.window:  # the new token sees the last `window` keys: a view, no copy
                k = k[:, :, -case.window:, :]
                v = v[:, :, -case.window:, :]
        elif case.window:
            i = torch.arange(case.tokens, device="cuda")
            mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - case.window)
        else:
            causal = True
        gqa = case.kv_heads != case.heads
        note = ""
        try:
            self._sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], False, None, gqa)
        except TypeError:  # PyTorch < 2.5: no enable_gqa
            group = case.heads // case.kv_heads
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
            gqa = False
            note = " expanded"
        errors = []
        for name, backend in self.backends:
            try:
                # A backend that refuses the case warns why, then raises: keep only the error.
                with warnings.catch_warnings(), sdpa_kernel([backend]):
                    warnings.simplefilter("ignore")
                    fn = lambda: self._sdpa(q, k, v, causal, mask, gqa)  # noqa: E731
                    out = fn()
                    if not bool(torch.isfinite(out).all()):
                        raise RuntimeError("non-finite output")
                    return self.median_ms(fn), name + note
            except RuntimeError as e:  # this backend does not take the case
                errors.append(f"{name}: {str(e).splitlines()[0][:120]}")
        raise RuntimeError("no SDPA backend ran: " + "; ".join(errors))


def print_tables(results, ceilings, ours_ms, ours_ceilings) -> None:
    """results: list of (case, ms or None, backend or error)."""
    def rate(name):
        if name not in ceilings:
            return None
        ms, work = ceilings[name]
        return work / (ms * 1e-3)

    copy_rate, read_rate = rate("copy_d2d"), rate("read_sweep")
    gemm_rate = {"bf16": rate("gemm_bf16"), "f16": rate("gemm_f16"), "f32": rate("sgemm_f32")}
    print("\nceilings (same run, torch):")
    for name, (ms, work) in ceilings.items():
        r = work / (ms * 1e-3)
        if name == "copy_d2d":
            print(f"  copy   dst.copy_(src) {int(work / 2) >> 20} MiB   {ms:9.3f} ms "
                  f"{r / 1e12:7.3f} TB/s (bytes read + written)")
        elif name == "read_sweep":
            print(f"  read   torch.sum f32 {int(work) >> 20} MiB    {ms:9.3f} ms "
                  f"{r / 1e12:7.3f} TB/s (bytes read)")
        else:
            n = round((work / 2) ** (1 / 3))
            print(f"  {name:9s} torch.matmul {n}^3  {ms:9.3f} ms {r / 1e12:7.1f} TFLOP/s")

    print("\ndecode (torch): scaled_dot_product_attention, one query per sequence, dense KV")
    print(f"{'case':20s} {'kv':>4s} {'batch':>5s} {'ctx':>6s} {'window':>6s} {'backend':>12s} "
          f"{'ms':>9s} {'KV MiB':>8s} {'TB/s':>8s} {'of read':>8s} {'of copy':>8s}")
    for case, ms, backend in results:
        if case.kind != "decode":
            continue
        if ms is None:
            print(f"{case.name:20s} FAILED: {backend}")
            continue
        work = work_of(case)
        r = work / (ms * 1e-3)
        print(f"{case.name:20s} {case.dtype:>4s} {case.batch:5d} {case.tokens:6d} "
              f"{case.window:6d} {backend:>12s} {ms:9.4f} {work / MIB:8.1f} {r / 1e12:8.3f} "
              f"{ratio(r, read_rate):>8s} {ratio(r, copy_rate):>8s}")

    print("\nprefill (torch): scaled_dot_product_attention, causal (window: boolean band mask)")
    print(f"{'case':20s} {'kv':>4s} {'batch':>5s} {'tokens':>6s} {'window':>6s} {'backend':>12s} "
          f"{'ms':>9s} {'GFLOP':>8s} {'TFLOP/s':>9s} {'of GEMM':>9s}")
    for case, ms, backend in results:
        if case.kind != "prefill":
            continue
        if ms is None:
            print(f"{case.name:20s} FAILED: {backend}")
            continue
        work = work_of(case)
        r = work / (ms * 1e-3)
        print(f"{case.name:20s} {case.dtype:>4s} {case.batch:5d} {case.tokens:6d} "
              f"{case.window:6d} {backend:>12s} {ms:9.4f} {work / 1e9:8.1f} {r / 1e12:9.2f} "
              f"{ratio(r, gemm_rate.get(case.dtype)):>9s}")

    if not ours_ms:
        return
    print("\nattnserve vs PyTorch, same run, same device (speed-up = torch ms / attnserve ms;"
          " > 1: attnserve is faster)")
    print(f"{'what':52s} {'attnserve':>10s} {'torch':>10s} {'speed-up':>9s}")
    for name in ("copy_d2d", "read_sweep", "gemm_bf16", "gemm_f16", "sgemm_f32"):
        if name in ours_ceilings and name in ceilings:
            ours = ours_ceilings[name]["ms"]
            theirs = ceilings[name][0]
            print(f"{'ceiling ' + name + ' (ms; should agree)':52s} {ours:10.4f} {theirs:10.4f} "
                  f"{theirs / ours:9.2f}")
    for case, ms, backend in results:
        if case not in ours_ms:
            continue
        ours = ours_ms[case]
        theirs = "n/a" if ms is None else f"{ms:10.4f}"
        speed = "n/a" if ms is None or ours <= 0 else f"{ms / ours:9.2f}"
        print(f"{label(case) + ' ' + case.dtype + ' (ms)':52s} {ours:10.4f} {theirs:>10s} "
              f"{speed:>9s}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (built-in list)")
    parser.add_argument("--ours", help="attention_kernel_bench --csv output: run its cases and "
                        "compare")
    parser.add_argument("--csv", help="write this run's rows here")
    args = parser.parse_args(argv)

    try:
        import torch
    except ImportError as e:
        print(f"PyTorch not available, PyTorch peer skipped: {e}")
        return 0
    if not torch.cuda.is_available():
        print("no usable CUDA device, PyTorch peer skipped: torch.cuda.is_available() is False "
              f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
        return 0
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    except ImportError as e:
        print(f"PyTorch {torch.__version__} has no torch.nn.attention.sdpa_kernel (needs >= 2.3), "
              f"PyTorch peer skipped: {e}")
        return 0

    ours_ms: dict[Case, float] = {}
    ours_ceilings: dict[str, dict] = {}
    cases = builtin_cases(args.quick)
    if args.ours:
        if os.path.exists(args.ours):
            ours_cases, ours_ms, ours_ceilings = read_ours(args.ours)
            if ours_cases:
                cases = ours_cases
        else:
            print(f"{args.ours}: not found; running the built-in cases without a comparison")

    bench = Bench(torch, args.quick)
    props = bench.props
    print(f"device: {props.name} (sm_{props.major}{props.minor}, {props.multi_processor_count} "
          f"SMs, L2 {bench.l2 / MIB:.0f} MiB, {props.total_memory / GIB:.1f} GiB); torch "
          f"{torch.__version__}, CUDA {torch.version.cuda}, cuDNN "
          f"{torch.backends.cudnn.version()}")
    print(f"timing: median of {bench.samples} samples after {bench.warmup} warm-up calls; "
          f"torch.cuda.Event around each call; L2 flushed ({bench.flush.numel() / MIB:.0f} MiB "
          "fill) before every sample, untimed")

    failures = 0
    try:
        ceilings = bench.ceilings()
    except RuntimeError as e:
        print(f"FAILED ceilings: {e}")
        ceilings = {}
        failures += 1
    results = []
    for case in cases:
        try:
            ms, backend = bench.attention(case)
            results.append((case, ms, backend))
        except RuntimeError as e:  # includes CUDA out of memory
            results.append((case, None, str(e).splitlines()[0][:200]))
            failures += 1
        torch.cuda.empty_cache()
    print_tables(results, ceilings, ours_ms, ours_ceilings)

    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["kind", "case", "dtype", "heads", "kv_heads", "head_dim", "batch",
                        "tokens", "window", "backend", "ms", "work"])
            for name, (ms, work) in ceilings.items():
                w.writerow(["ceiling", name, "", 0, 0, 0, 0, 0, 0, "torch", f"{ms:.6f}",
                            f"{work:.6e}"])
            for case, ms, backend in results:
                if ms is not None:
                    w.writerow([case.kind, case.name, case.dtype, case.heads, case.kv_heads,
                                case.head_dim, case.batch, case.tokens, case.window, backend,
                                f"{ms:.6f}", f"{work_of(case):.6e}"])
    if failures:
        print(f"torch_peer_bench: {failures} measurement(s) failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
