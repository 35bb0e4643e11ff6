#!/usr/bin/env python3
"""Every PromQL expression of the shipped Grafana dashboard, evaluated by a real Prometheus that
scraped two real attnserve_server replicas under load (ctest prometheus_dashboard_test, label
"deploy").

  1. starts two attnserve_server replicas on 127.0.0.1 (free gRPC ports via --port_file,
     --metrics_address on free ports), with KV pools of different sizes, and waits for
     grpc.health.v1 SERVING with `attnctl health`;
  2. starts Debian's /usr/bin/prometheus on 127.0.0.1 with deploy/prometheus/prometheus.yml,
     rewritten only in its scrape interval (1 s) and targets (the two test servers), and a
     temporary storage directory;
  3. holds one session with KV on each replica (a hybrid stack on the first, for the layer-kind
     panel), then runs a load with the Python client, one thread per exercised variant (mha, mqa,
     gqa, mla, gqa_swa; alternately on each replica): configure, prefill, unary Decode and
     DecodeStream steps, session queries, and one failing call (an unknown request id,
     NOT_FOUND) per round, until the checks are done;
  4. after at least MIN_SCRAPES successful scrapes of each replica taken during the load,
     evaluates the instance and variant variables' queries and every `expr` of every panel of
     deploy/grafana/attnserve.json through /api/v1/query ($variant -> a regex of the exercised
     variants, $instance -> a regex of both targets, $__rate_interval -> 15s) and requires each to
     return data: at least one finite sample, and for expressions grouped by variant a finite
     sample for each exercised variant. A metric renamed in the server without the dashboard
     returns no data and fails here. Meanwhile the dashboard's total KV used never exceeds its
     capacity;
  5. stops the load and, once Prometheus sees only the held sessions, requires the dashboard's
     total KV used and capacity (both replicas, All selected) to equal the sums of the replicas'
     own GetServerInfo numbers, and its per-replica pool use to equal each replica's used /
     capacity: a capacity repeated per variant, a max() where a sum() belongs, or an aggregate
     series counted twice fails here.

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

# The two replicas' KV pools: different sizes, so a max() or a single replica's capacity where the
# dashboard needs the sum is caught.
POOL_BYTES = (48 << 20, 80 << 20)
HOLD_TOKENS = (40, 24)  # prompt tokens of the session held on each replica

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


def prometheus_config(metrics_targets) -> str:
    """deploy/prometheus/prometheus.yml with the test's scrape interval and targets."""
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = config["scrape_configs"]
    if len(jobs) != 1 or len(jobs[0]["static_configs"]) != 1:
        raise RuntimeError("deploy/prometheus/prometheus.yml: expected one job with one "
                           "static_configs entry (the rewrite of its target would be ambiguous)")
    config.setdefault("global", {})["scrape_interval"] = f"{SCRAPE_INTERVAL_S}s"
    config["global"]["scrape_timeout"] = f"{SCRAPE_INTERVAL_S}s"
    jobs[0]["scrape_interval"] = f"{SCRAPE_INTERVAL_S}s"
    jobs[0]["static_configs"][0]["targets"] = list(metrics_targets)
    return yaml.safe_dump(config, sort_keys=False)


# ---- Load ---------------------------------------------------------------------------------------

class Load:
    """One thread per variant driving its own session until stop(); errors other than the
    deliberate NOT_FOUND are collected and fail the test."""

    def __init__(self, targets):
        self.targets = targets  # variant i runs on targets[i % len(targets)]
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
            target = self.targets[list(VARIANTS).index(name) % len(self.targets)]
            with AttnServeClient(target, timeout_s=30) as client:
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


def substitute(expr: str, variant_regex: str, instance_regex: str) -> str:
    expr = expr.replace("${variant}", variant_regex).replace("$variant", variant_regex)
    expr = expr.replace("${instance}", instance_regex).replace("$instance", instance_regex)
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


def successful_scrapes(prometheus: str, instances) -> int:
    """The fewest successful scrapes of any of `instances` in the last minute."""
    data = query(prometheus, "count_over_time(up{job=\"attnserve\"}[1m]) "
                             "and (up{job=\"attnserve\"} == 1)")
    counts = {series["metric"].get("instance"): int(float(series["value"][1]))
              for series in data["result"]}
    return min(counts.get(instance, 0) for instance in instances)


def load_dashboard() -> dict:
    return json.loads((ROOT / "deploy" / "grafana" / "attnserve.json").read_text())


def kv_total_expressions(dashboard: dict):
    """The dashboard's total KV used and total capacity expressions (sum() without `by`), and its
    per-replica pool use (used / capacity by instance)."""
    used = capacity = per_replica = None
    for _, _, expr in dashboard_expressions(dashboard):
        if "attnserve_kv_pool_used_bytes" in expr and "attnserve_kv_pool_capacity_bytes" in expr:
            per_replica = per_replica or expr
        elif re.match(r"^\s*sum\s*\(\s*attnserve_kv_pool_used_bytes", expr):
            used = used or expr
        elif re.match(r"^\s*sum\s*\(\s*attnserve_kv_pool_capacity_bytes", expr):
            capacity = capacity or expr
    missing = [what for what, expr in (("sum(attnserve_kv_pool_used_bytes...)", used),
                                       ("sum(attnserve_kv_pool_capacity_bytes...)", capacity),
                                       ("used / capacity by instance", per_replica))
               if expr is None]
    if missing:
        raise RuntimeError(f"the dashboard lacks KV expressions: {missing}")
    return used, capacity, per_replica


def scalar_of(data) -> float:
    if data["resultType"] == "scalar":
        return float(data["result"][1])
    if len(data["result"]) != 1:
        raise RuntimeError(f"expected one series, got {len(data['result'])}: {data['result']}")
    return float(data["result"][0]["value"][1])


def check_kv_not_over_capacity(prometheus: str, instances) -> str:
    """The dashboard's total used vs total capacity (All variants, both replicas): "" when used <=
    capacity."""
    used_expr, capacity_expr, _ = kv_total_expressions(load_dashboard())
    everything = ("|".join(instances))
    used = scalar_of(query(prometheus, substitute(used_expr, ".*", everything)))
    capacity = scalar_of(query(prometheus, substitute(capacity_expr, ".*", everything)))
    if not used <= capacity:
        return f"the dashboard's KV used {used:.0f} exceeds its capacity {capacity:.0f}"
    if capacity != sum(POOL_BYTES):
        return f"the dashboard's KV capacity {capacity:.0f} is not the pools' sum {sum(POOL_BYTES)}"
    return ""


def check_dashboard(prometheus: str, variants, instances, processes: Processes,
                    load: Load) -> list:
    dashboard = load_dashboard()
    expressions = dashboard_expressions(dashboard)
    if len(expressions) < 10:
        raise RuntimeError(f"the dashboard has only {len(expressions)} expressions")
    variant_regex = "(" + "|".join(sorted(variants)) + ")"
    instance_regex = "(" + "|".join(sorted(instances)) + ")"
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
        # The instance (replica) variable: label_values(attnserve_build_info, instance).
        url = (f"{prometheus}/api/v1/label/instance/values?"
               + urllib.parse.urlencode({"match[]": "attnserve_build_info"}))
        values = set(json.loads(http_get(url))["data"])
        lacking = sorted(set(instances) - values)
        if lacking:
            failures[("variable", "instance")] = (
                "label_values(attnserve_build_info, instance)", f"lacks {lacking}")
        else:
            failures.pop(("variable", "instance"), None)
        over = check_kv_not_over_capacity(prometheus, instances)
        if over:
            return [f"KV used vs capacity during the load: {over}"]
        for key, expr in list(pending.items()):
            concrete = substitute(expr, variant_regex, instance_regex)
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

def start_server(args, workdir: Path, processes: Processes, index: int):
    """Replica `index`: its gRPC target and metrics target (host:port)."""
    grpc_port_file = workdir / f"port{index}"
    metrics_port = free_port()
    processes.start(f"attnserve_server{index}", [
        args.server, "--listen=127.0.0.1:0", f"--port_file={grpc_port_file}", "--backend=cpu",
        f"--metrics_address=127.0.0.1:{metrics_port}", "--threads=1", "--compute_threads=2",
        f"--kv_pool_bytes={POOL_BYTES[index]}", f"--replica_id=replica-{index}"])
    return grpc_port_file, metrics_port


def hold_sessions(targets):
    """One session holding KV on each replica, kept until the end: a hybrid stack (sliding window
    layers and a global one: the layer-kind panel) on the first, a plain mha on the second."""
    held = []
    window = LayerSpec("gqa", d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=2, rope="half",
                       sliding_window=WINDOW)
    glob = LayerSpec("gqa", d_model=D_MODEL, num_heads=NUM_HEADS, num_kv_heads=2, rope="half")
    rng = np.random.default_rng(99)
    for index, target in enumerate(targets):
        client = AttnServeClient(target, timeout_s=30)
        if index == 0:
            session = client.configure(None, stack=[window, window, glob], seed=2, label="held")
        else:
            session = client.configure(VARIANTS["mha"], seed=2, label="held")
        client.forward(session.session_id, {"held": rng.standard_normal(
            (HOLD_TOKENS[index % len(HOLD_TOKENS)], D_MODEL), dtype=np.float32)})
        held.append((client, session.session_id))
    return held


def check_totals_at_rest(prometheus: str, targets, instances, processes: Processes) -> list:
    """With only the held sessions left: the dashboard's totals against GetServerInfo."""
    wait_for("Prometheus to see only the held sessions",
             lambda: scalar_of(query(prometheus, "sum(attnserve_sessions_active)")) == len(targets),
             STARTUP_TIMEOUT_S, processes)
    infos = []
    for target in targets:
        with AttnServeClient(target, timeout_s=30) as client:
            infos.append(client.info())
    used_expr, capacity_expr, per_replica_expr = kv_total_expressions(load_dashboard())
    everything = "|".join(instances)
    used = scalar_of(query(prometheus, substitute(used_expr, ".*", everything)))
    capacity = scalar_of(query(prometheus, substitute(capacity_expr, ".*", everything)))
    info_used = sum(info.kv_pool_used_bytes for info in infos)
    info_capacity = sum(info.kv_pool_capacity_bytes for info in infos)
    failures = []
    if any(info.kv_pool_used_bytes <= 0 for info in infos):
        failures.append(f"a held session holds no KV: {[i.kv_pool_used_bytes for i in infos]}")
    if used != info_used:
        failures.append(f"dashboard KV used {used:.0f} != the replicas' GetServerInfo sum "
                        f"{info_used} ({[i.kv_pool_used_bytes for i in infos]})\n        {used_expr}")
    if capacity != info_capacity:
        failures.append(f"dashboard KV capacity {capacity:.0f} != the replicas' GetServerInfo sum "
                        f"{info_capacity}\n        {capacity_expr}")
    if not used <= capacity:
        failures.append(f"dashboard KV used {used:.0f} > capacity {capacity:.0f}")
    fractions = {series["metric"].get("instance"): float(series["value"][1]) for series in
                 query(prometheus, substitute(per_replica_expr, ".*", everything))["result"]}
    for instance, info in zip(instances, infos):
        expected = info.kv_pool_used_bytes / info.kv_pool_capacity_bytes
        got = fractions.get(instance)
        if got is None or abs(got - expected) > 1e-9:
            failures.append(f"pool use of {instance}: dashboard {got}, GetServerInfo {expected}"
                            f"\n        {per_replica_expr}")
    # attnserve_build_info names each instance's replica as GetServerInfo does.
    replicas = {series["metric"].get("instance"): series["metric"].get("replica") for series in
                query(prometheus, "attnserve_build_info")["result"]}
    for instance, info in zip(instances, infos):
        if replicas.get(instance) != info.replica:
            failures.append(f"attnserve_build_info of {instance} names replica "
                            f"{replicas.get(instance)!r}, GetServerInfo {info.replica!r}")
    if not failures:
        log(f"at rest: dashboard KV used {used:.0f} = GetServerInfo "
            f"{[i.kv_pool_used_bytes for i in infos]} summed, capacity {capacity:.0f} = "
            f"{[i.kv_pool_capacity_bytes for i in infos]} summed; per replica {fractions}")
    return failures


def run(args, workdir: Path, processes: Processes) -> int:
    started_servers = [start_server(args, workdir, processes, i) for i in range(len(POOL_BYTES))]
    targets, instances = [], []
    for port_file, metrics_port in started_servers:
        port = wait_for("the server's port file", lambda: port_file.read_text().strip(),
                        STARTUP_TIMEOUT_S, processes)
        target = f"127.0.0.1:{port}"
        subprocess.run([args.attnctl, f"--server={target}", "health",
                        f"--wait_s={STARTUP_TIMEOUT_S}"],
                       check=True, stdout=subprocess.DEVNULL, timeout=STARTUP_TIMEOUT_S + 10)
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        wait_for(f"{metrics_url}", lambda: b"attnserve_build_info" in http_get(metrics_url),
                 STARTUP_TIMEOUT_S, processes)
        log(f"server SERVING on {target}, metrics at {metrics_url}")
        targets.append(target)
        instances.append(f"127.0.0.1:{metrics_port}")

    config = workdir / "prometheus.yml"
    config.write_text(prometheus_config(instances))
    web_port = free_port()
    prometheus = f"http://127.0.0.1:{web_port}"
    processes.start("prometheus", [
        args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{web_port}", "--storage.tsdb.retention.time=1h",
        "--log.level=warn"])
    wait_for("Prometheus /-/ready", lambda: http_get(f"{prometheus}/-/ready"), STARTUP_TIMEOUT_S,
             processes)
    log(f"Prometheus ready at {prometheus}")

    held = hold_sessions(targets)
    load = Load(targets)
    load.start()
    try:
        started = time.monotonic()
        before = successful_scrapes(prometheus, instances)
        wait_for(f"{MIN_SCRAPES} scrapes of each replica during the load",
                 lambda: successful_scrapes(prometheus, instances) >= before + MIN_SCRAPES
                 and all(load.rounds.values()),
                 STARTUP_TIMEOUT_S, processes)
        if load.errors:
            raise RuntimeError(f"the load failed: {load.errors}")
        log(f"{successful_scrapes(prometheus, instances)} scrapes of each replica, load rounds "
            f"{load.rounds} after {time.monotonic() - started:.1f} s; evaluating the dashboard")
        failures = check_dashboard(prometheus, VARIANTS.keys(), instances, processes, load)
    finally:
        load.stop()
    if load.errors:
        raise RuntimeError(f"the load failed: {load.errors}")
    if not failures:
        failures = check_totals_at_rest(prometheus, targets, instances, processes)
    for client, session_id in held:
        client.release(session_id)
        client.close()
    if failures:
        log(f"{len(failures)} dashboard check(s) failed (the server's metric names, labels or "
            "shape and deploy/grafana/attnserve.json disagree):")
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
