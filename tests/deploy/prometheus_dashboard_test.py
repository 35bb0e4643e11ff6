#!/usr/bin/env python3
"""Every PromQL expression of the shipped Grafana dashboard, evaluated by a real Prometheus that
scraped a real attnserve_server under load (ctest prometheus_dashboard_test, label "deploy").

  1. starts attnserve_server on 127.0.0.1 (free gRPC port via --port_file, --metrics_address on
     a free port) and waits for grpc.health.v1 SERVING with `attnctl health`;
  2. starts Debian's /usr/bin/prometheus on 127.0.0.1 with deploy/prometheus/prometheus.yml,
     rewritten only in its scrape interval (1 s) and target (the test server), and a temporary
     storage directory;
  3. runs a load with the Python client, one thread per exercised variant (mha, mqa, gqa, mla,
     gqa_swa): configure, prefill, unary Decode and DecodeStream steps, session queries, and one
     failing call (an unknown request id, NOT_FOUND) per round, until the checks are done;
  4. after at least MIN_SCRAPES successful scrapes taken during the load, evaluates the variant
     variable's query and every `expr` of every panel of deploy/grafana/attnserve.json through
     /api/v1/query ($variant -> a regex of the exercised variants, $__rate_interval -> 15s) and
     requires each to return data: at least one finite sample, and for expressions grouped by
     variant a finite sample for each exercised variant. A metric renamed in the server without
     the dashboard returns no data and fails here.

All processes listen on 127.0.0.1 only; every wait is bounded; processes and the temporary
directory are removed on any exit.

Usage: prometheus_dashboard_test.py --server BIN --attnctl BIN [--prometheus /usr/bin/prometheus]
"""

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "client" / "python"))
from attnserve_client import AttnServeClient, AttnServeError, LayerSpec, MlaDims  # noqa: E402

D_MODEL = 64
NUM_HEADS = 4
PROMPT_TOKENS = 12
WINDOW = 8  # sliding window of the _swa session (shorter than the sequences it decodes)
STEPS_PER_PREFILL = 24  # decode steps before a request is released and a new one prefilled

# variant label (server/observability/metrics.h VariantLabel) -> layer spec of the load.
VARIANTS = {
    "mha": LayerSpec("mha", d_model=D_MODEL, num_heads=NUM_HEADS, rope="half"),
    "mqa": LayerSpec("mqa", d_model=D_MODEL, num_heads=NUM_HEADS, rope="half"),
    "gqa": LayerSpec("gqa", d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=2, rope="half"),
    "mla": LayerSpec("mla", d_model=D_MODEL, num_heads=NUM_HEADS, rope="interleaved",
                     mla=MlaDims(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                 v_head_dim=16)),
    "gqa_swa": LayerSpec("gqa", d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=2, rope="half",
                         sliding_window=WINDOW),
}

SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = "15s"  # $__rate_interval: >= 4 scrape intervals, as Grafana computes it
MIN_SCRAPES = 4  # scrapes of the loaded server before the first query
STARTUP_TIMEOUT_S = 30
QUERY_DEADLINE_S = 45  # all expressions must have returned data by then (retried until)


def log(message: str) -> None:
    print(f"[prometheus_dashboard_test] {message}", flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


class Processes:
    """Started child processes, each stopped (SIGTERM, then SIGKILL) on close."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.children = []  # (name, Popen, log path)

    def start(self, name: str, argv) -> subprocess.Popen:
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL)
        self.children.append((name, process, log_path))
        log(f"started {name} (pid {process.pid}): {' '.join(map(str, argv))}")
        return process

    def check_alive(self) -> None:
        for name, process, _ in self.children:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited early with status {process.returncode}")

    def close(self, show_logs: bool) -> None:
        for name, process, log_path in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
            if show_logs and log_path.exists():
                lines = log_path.read_text(errors="replace").splitlines()[-25:]
                log(f"{name} exit status {process.returncode}; last lines of its log:")
                for line in lines:
                    print(f"    {line}")


def wait_for(what: str, predicate, timeout_s: float, processes: Processes, interval_s=0.2):
    deadline = time.monotonic() + timeout_s
    while True:
        processes.check_alive()
        try:
            value = predicate()
        except (OSError, urllib.error.URLError, ValueError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def prometheus_config(metrics_target: str) -> str:
    """deploy/prometheus/prometheus.yml with the test's scrape interval and target."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = config["scrape_configs"]
    if len(jobs) != 1 or len(jobs[0]["static_configs"]) != 1:
        raise RuntimeError("deploy/prometheus/prometheus.yml: expected one job with one "
                           "static_configs entry (the rewrite of its target would be ambiguous)")
    config.setdefault("global", {})["scrape_interval"] = f"{SCRAPE_INTERVAL_S}s"
    config["global"]["scrape_timeout"] = f"{SCRAPE_INTERVAL_S}s"
    jobs[0]["scrape_interval"] = f"{SCRAPE_INTERVAL_S}s"
    jobs[0]["static_configs"][0]["targets"] = [metrics_target]
    return yaml.safe_dump(config, sort_keys=False)


# ---- Load ---------------------------------------------------------------------------------------

class Load:
    """One thread per variant driving its own session until stop(); errors other than the
    deliberate NOT_FOUND are collected and fail the test."""

    def __init__(self, target: str):
        self.target = target
        self.stop_event = threading.Event()
        self.errors = []
        self.rounds = {name: 0 for name in VARIANTS}
        self.threads = [threading.Thread(target=self._run, args=(name,), name=f"load-{name}",
                                         daemon=True) for name in VARIANTS]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _run(self, name: str) -> None:
        rng = np.random.default_rng(list(VARIANTS).index(name))
        try:
            with AttnServeClient(self.target, timeout_s=30) as client:
                session = client.configure(VARIANTS[name], seed=1, label=f"deploy test {name}")
                sid = session.session_id
                try:
                    self._drive(client, sid, rng, name)
                finally:
                    client.release(sid)
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            self.errors.append(f"{name}: {type(error).__name__}: {error}")

    def _drive(self, client, sid, rng, name) -> None:
        generation = 0
        while not self.stop_event.is_set():
            requests = [f"r{generation}a", f"r{generation}b"]
            client.forward(sid, {rid: rng.standard_normal((PROMPT_TOKENS + i, D_MODEL),
                                                          dtype=np.float32)
                                 for i, rid in enumerate(requests)})
            step = 0  # decode steps of these requests
            iteration = 0  # loop turns (a stream turn takes 2 steps)
            while step < STEPS_PER_PREFILL and not self.stop_event.is_set():
                iteration += 1
                inputs = {rid: rng.standard_normal(D_MODEL, dtype=np.float32) for rid in requests}
                if iteration % 4 == 0:
                    with client.open_decode_stream(sid) as stream:
                        stream.step(inputs)
                        stream.step({rid: rng.standard_normal(D_MODEL, dtype=np.float32)
                                     for rid in requests})
                    step += 2
                else:
                    client.decode(sid, inputs)
                    step += 1
                if iteration % 3 == 0:
                    client.get_session(sid)
                    client.list_sessions()
                    client.info()
                    try:  # the deliberate error: a request id the session does not have
                        client.decode(sid, {"no-such-request":
                                            rng.standard_normal(D_MODEL, dtype=np.float32)})
                        raise RuntimeError("decode of an unknown request id succeeded")
                    except AttnServeError as error:
                        if error.code != "NOT_FOUND":
                            raise
                self.rounds[name] += 1
            for rid in requests:
                client.release(sid, rid)
            generation += 1


# ---- PromQL -------------------------------------------------------------------------------------

def dashboard_expressions(dashboard: dict):
    """(panel title, refId, expr) of every target of every panel, rows' nested panels included."""
    def walk(panels):
        for panel in panels or []:
            yield panel
            yield from walk(panel.get("panels"))
    return [(panel.get("title", "?"), target.get("refId", "?"), target["expr"])
            for panel in walk(dashboard.get("panels")) for target in panel.get("targets") or []
            if target.get("expr")]


def substitute(expr: str, variant_regex: str) -> str:
    expr = expr.replace("${variant}", variant_regex).replace("$variant", variant_regex)
    expr = expr.replace("${__rate_interval}", RATE_INTERVAL).replace("$__rate_interval",
                                                                     RATE_INTERVAL)
    expr = expr.replace("$__interval", f"{SCRAPE_INTERVAL_S}s")
    leftover = re.findall(r"\$\{?\w+", expr)
    if leftover:
        raise RuntimeError(f"expression has template variables the test does not know: "
                           f"{leftover}: {expr}")
    return expr


def grouped_by_variant(expr: str) -> bool:
    """True when the outermost aggregations keep the variant label (`by (..., variant, ...)`)."""
    groupings = re.findall(r"\bby\s*\(([^)]*)\)", expr)
    return bool(groupings) and all("variant" in [g.strip() for g in grouping.split(",")]
                                   for grouping in groupings)


def query(prometheus: str, expr: str):
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        body = json.loads(http_get(url))
    except urllib.error.HTTPError as error:  # 400: the expression does not parse
        body = json.loads(error.read() or b"{}")
        raise RuntimeError(f"Prometheus rejected the expression: {body.get('error', error)}")
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {body}")
    return body["data"]


def missing_data(data, expr: str, variants):
    """What the result lacks ("" when it has data for every variant that it should)."""
    if data["resultType"] == "scalar":
        value = float(data["result"][1])
        return "" if math.isfinite(value) else "a non-finite scalar"
    finite = [series for series in data["result"] if math.isfinite(float(series["value"][1]))]
    if not finite:
        return f"no finite sample ({len(data['result'])} series)"
    if grouped_by_variant(expr):
        seen = {series["metric"].get("variant") for series in finite}
        lacking = sorted(set(variants) - seen)
        if lacking:
            return f"no finite sample for variant(s) {lacking} (has {sorted(map(str, seen))})"
    return ""


def successful_scrapes(prometheus: str) -> int:
    data = query(prometheus, "sum(count_over_time(up{job=\"attnserve\"}[1m]) "
                             "and on() (up{job=\"attnserve\"} == 1))")
    return int(float(data["result"][0]["value"][1])) if data["result"] else 0


def check_dashboard(prometheus: str, variants, processes: Processes, load: Load) -> list:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "attnserve.json").read_text())
    expressions = dashboard_expressions(dashboard)
    if len(expressions) < 10:
        raise RuntimeError(f"the dashboard has only {len(expressions)} expressions")
    variant_regex = "(" + "|".join(sorted(variants)) + ")"
    pending = {(title, ref): expr for title, ref, expr in expressions}
    failures = {}
    deadline = time.monotonic() + QUERY_DEADLINE_S
    attempt = 0
    while True:
        attempt += 1
        processes.check_alive()
        if load.errors:
            raise RuntimeError(f"the load failed: {load.errors}")
        # The variant variable's query: label_values(attnserve_kv_pool_used_bytes, variant).
        url = (f"{prometheus}/api/v1/label/variant/values?"
               + urllib.parse.urlencode({"match[]": "attnserve_kv_pool_used_bytes"}))
        values = set(json.loads(http_get(url))["data"])
        lacking = sorted(set(variants) - values)
        if lacking:
            failures[("variable", "variant")] = (
                "label_values(attnserve_kv_pool_used_bytes, variant)", f"lacks {lacking}")
        else:
            failures.pop(("variable", "variant"), None)
        for key, expr in list(pending.items()):
            concrete = substitute(expr, variant_regex)
            problem = missing_data(query(prometheus, concrete), expr, variants)
            if problem:
                failures[key] = (concrete, problem)
            else:
                failures.pop(key, None)
                del pending[key]
        if not failures:
            log(f"all {len(expressions)} panel expressions and the variant variable returned "
                f"data for {sorted(variants)} (attempt {attempt})")
            return []
        if time.monotonic() > deadline:
            return [f"panel '{title}' {ref}: {problem}\n        {concrete}"
                    for (title, ref), (concrete, problem) in sorted(failures.items())]
        time.sleep(SCRAPE_INTERVAL_S)


# ---- main ---------------------------------------------------------------------------------------

def run(args, workdir: Path, processes: Processes) -> int:
    grpc_port_file = workdir / "port"
    metrics_port = free_port()
    processes.start("attnserve_server", [
        args.server, "--listen=127.0.0.1:0", f"--port_file={grpc_port_file}",
        f"--metrics_address=127.0.0.1:{metrics_port}", "--threads=1", "--compute_threads=2"])
    port = wait_for("the server's port file", lambda: grpc_port_file.read_text().strip(),
                    STARTUP_TIMEOUT_S, processes)
    target = f"127.0.0.1:{port}"
    subprocess.run([args.attnctl, f"--server={target}", "health", f"--wait_s={STARTUP_TIMEOUT_S}"],
                   check=True, stdout=subprocess.DEVNULL, timeout=STARTUP_TIMEOUT_S + 10)
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    wait_for(f"{metrics_url}", lambda: b"attnserve_build_info" in http_get(metrics_url),
             STARTUP_TIMEOUT_S, processes)
    log(f"server SERVING on {target}, metrics at {metrics_url}")

    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(f"127.0.0.1:{metrics_port}"))
    web_port = free_port()
    prometheus = f"http://127.0.0.1:{web_port}"
    processes.start("prometheus", [
        args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web_port}", "--storage.tsdb.retention.time=1h",
        "--log.level=warn"])
    wait_for("Prometheus /-/ready", lambda: http_get(f"{prometheus}/-/ready"), STARTUP_TIMEOUT_S,
             processes)
    log(f"Prometheus ready at {prometheus}")

    load = Load(target)
    load.start()
    try:
        started = time.monotonic()
        before = successful_scrapes(prometheus)
        wait_for(f"{MIN_SCRAPES} scrapes during the load",
                 lambda: successful_scrapes(prometheus) >= before + MIN_SCRAPES
                 and all(load.rounds.values()),
                 STARTUP_TIMEOUT_S, processes)
        if load.errors:
            raise RuntimeError(f"the load failed: {load.errors}")
        log(f"{successful_scrapes(prometheus)} scrapes, load rounds {load.rounds} after "
            f"{time.monotonic() - started:.1f} s; evaluating the dashboard")
        failures = check_dashboard(prometheus, VARIANTS.keys(), processes, load)
    finally:
        load.stop()
    if load.errors:
        raise RuntimeError(f"the load failed: {load.errors}")
    if failures:
        log(f"{len(failures)} dashboard expression(s) returned no data (the server's metric "
            "names or labels and deploy/grafana/attnserve.json disagree):")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    log(f"OK: load rounds {load.rounds}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True, help="attnserve_server binary")
    parser.add_argument("--attnctl", required=True, help="attnctl binary")
    parser.add_argument("--prometheus", default="/usr/bin/prometheus",
                        help="Prometheus server binary (Debian's prometheus package)")
    args = parser.parse_args()
    for path in (args.server, args.attnctl, args.prometheus):
        if not os.access(path, os.X_OK):
            log(f"{path} is not an executable (Prometheus: deploy/setup.sh installs Debian's "
                "prometheus package)")
            return 1
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attnserve-deploy-") as tmp:
        processes = Processes(Path(tmp))
        status = 1
        try:
            status = run(args, Path(tmp), processes)
        except (RuntimeError, subprocess.SubprocessError, OSError) as error:
            log(f"FAILED: {error}")
        finally:
            processes.close(show_logs=status != 0)
    log(f"{'passed' if status == 0 else 'failed'} in {time.monotonic() - started:.1f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
