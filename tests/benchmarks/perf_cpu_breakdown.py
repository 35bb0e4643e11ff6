#!/usr/bin/env python3
"""Sorts a system-wide perf profile of a closed-loop attnbench cell into the shares issue 23's
bound needs: the server's engine (OpenBLAS, the attention kernels), its gRPC/protobuf libraries,
kernel time on its threads, libc copies and malloc, the input/output checks, its own scheduler and
session code; attnbench; idle; other processes (docs/benchmarks.md, "Issue 23, fourth round").

  # the server and attnbench started as usual, the cell running past its first prefills:
  perf record -a -g -F 2000 -o perf.data -- sleep 3
  ls /proc/SERVER_PID/task > server_tids; ls /proc/ATTNBENCH_PID/task > client_tids
  perf report -i perf.data --no-children --sort pid,dso,sym --stdio -g none > report.txt
  perf_cpu_breakdown.py report.txt server_tids client_tids
"""
import collections
import re
import sys

GRPC_LIBS = ("libgrpc", "libgpr", "libprotobuf", "libupb", "libssl", "libcrypto", "libz",
             "libcares", "libre2", "libaddress_sorting")


def category(tid, comm, dso, sym, server_tids, client_tids):
    if comm == "swapper":
        return "idle"
    if tid in client_tids:
        return "client (attnbench, its gRPC threads included)"
    if tid not in server_tids:
        return "other processes"
    if "openblas" in dso:
        return "server: engine, OpenBLAS sgemm"
    if dso.startswith(GRPC_LIBS):
        return "server: gRPC/protobuf libraries"
    if "absl" in dso:
        return "server: absl (mutexes)"
    if not dso.startswith(("[", "lib", "ld-linux")):  # The server's binary.
        if "MaxAbsValue" in sym or "FirstNonFinite" in sym:
            return "server: input/output finiteness checks"
        if "attnserve::server::" in sym or "grpc" in sym or "v1::" in sym or "protobuf" in sym:
            return "server: rpc, scheduler, session code"
        return "server: engine, attention kernels and the rest"
    if dso.startswith("[kernel"):
        return "server: kernel (syscalls, page faults, wake-ups)"
    if dso.startswith(("libc", "libstdc", "libm", "ld-linux")):
        kind = "memcpy/memset" if sym.startswith("__mem") else "malloc and other"
        return "server: libc " + kind
    return "server: other (" + dso + ")"


def main():
    server_tids = set(open(sys.argv[2]).read().split())
    client_tids = set(open(sys.argv[3]).read().split())
    shares = collections.Counter()
    # perf's pid column: "TID:COMM", one row per thread.
    line_re = re.compile(r"\s*([\d.]+)%\s+(\d+):(\S+)\s+(\S+)\s+\[.\]\s+(.*)")
    for line in open(sys.argv[1]):
        m = line_re.match(line)
        if m:
            shares[category(m.group(2), m.group(3), m.group(4), m.group(5).strip(),
                            server_tids, client_tids)] += float(m.group(1))
    server = sum(p for c, p in shares.items() if c.startswith("server:"))
    for c, p in shares.most_common():
        of_server = ""
        if c.startswith("server:"):
            of_server = " (%4.1f%% of the server's)" % (100 * p / server)
        print("%6.2f%%  %s%s" % (p, c, of_server))
    print("%6.2f%%  server in all" % server)


if __name__ == "__main__":
    main()
