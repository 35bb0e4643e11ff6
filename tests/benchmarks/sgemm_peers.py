#!/usr/bin/env python3
"""The sgemm rates the prefill could reach with another GEMM, on this machine: PyTorch's (MKL)
and the system OpenBLAS's own threads on one sgemm (ctypes on libopenblas.so.0, the library the
engine links), at the prefill's shapes, on 1 thread and on every CPU; fastest of --passes.
cpu_attention_benchmark's BM_SgemmCeiling is the engine's own use (OpenBLAS single-threaded in
each pool thread); docs/benchmarks.md, "The sgemm ceiling with OpenBLAS single-threaded".

Usage: .venv/bin/python tests/benchmarks/sgemm_peers.py [--passes 20]
(OPENBLAS_CORETYPE=SkylakeX where OpenBLAS does not know the CPU, as the server picks it.)
"""
import argparse
import ctypes
import os
import time

import numpy as np
import torch

SHAPES = [(2048, 512, 512), (2048, 512, 1536), (2048, 2048, 2048)]
ROW_MAJOR, NO_TRANS = 101, 111


def fastest(run, passes):
    for _ in range(3):
        run()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    blas = ctypes.CDLL("libopenblas.so.0")
    blas.openblas_get_corename.restype = ctypes.c_char_p
    f = ctypes.c_float
    p = ctypes.c_void_p
    blas.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [f, p, ctypes.c_int, p, ctypes.c_int, f, p,
                                                      ctypes.c_int]
    print(f"system OpenBLAS core {blas.openblas_get_corename().decode()}; PyTorch {torch.__version__}")
    print("| m x k x n | threads | OpenBLAS GFLOP/s | PyTorch (MKL) GFLOP/s |")
    print("| --- | ---: | ---: | ---: |")
    for threads in sorted({1, os.cpu_count()}):
        blas.openblas_set_num_threads(threads)
        torch.set_num_threads(threads)
        for m, k, n in SHAPES:
            a = np.random.rand(m, k).astype(np.float32)
            b = np.random.rand(k, n).astype(np.float32)
            c = np.empty((m, n), dtype=np.float32)

            def openblas():
                blas.cblas_sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.ctypes.data, k,
                                 b.ctypes.data, n, 0.0, c.ctypes.data, n)

            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            flops = 2.0 * m * k * n
            ob = flops / fastest(openblas, args.passes) / 1e9
            mkl = flops / fastest(lambda: ta @ tb, args.passes) / 1e9
            print(f"| {m} x {k} x {n} | {threads} | {ob:.1f} | {mkl:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
