#!/usr/bin/env python3
"""Static checks of the deployment files (ctest deploy_files_test, label "deploy").

Docker is not run (CI has no Docker engine), so this checks what can be checked without it:
  * deploy/compose.yaml (its ${VAR:-default} settings at their defaults), deploy/compose.gpu.yaml,
    deploy/prometheus/prometheus.yml and every Grafana provisioning YAML parse (PyYAML, tests/deploy/requirements.txt), and deploy/grafana/attnserve.json parses;
  * every file they reference exists in the repository: the build context and Dockerfile, every
    bind-mounted source, the dashboard folder a Grafana provider loads (resolved through the
    grafana service's mounts), Grafana's home dashboard path, the Dockerfile's COPY sources;
  * they agree with each other: the Prometheus target is the attnserve service at the port its
    --metrics_address flag names, the ports the Dockerfile EXPOSEs are those compose publishes,
    the dashboard's datasource uid is the provisioned one, every panel expression filters by
    variant with =~"$variant" (or has no variant label), the Dockerfile builds with
    deploy/setup.sh and the release preset, runs as a non-root user and has a HEALTHCHECK;
  * the CPU default and GPU override: compose.yaml builds WITH_CUDA=0 and passes no --backend
    (the server's auto), compose.gpu.yaml builds WITH_CUDA=1 under another image name and gives
    the container a GPU device; --checkpoint_root is the target of a read-only mount;
  * the health check follows the configured port: the image's HEALTHCHECK and compose's run
    deploy/healthcheck.sh (attnserve-healthcheck), which asks attnctl health on the port read
    from the file the ENTRYPOINT's --port_file names.

Usage: check_deploy_files.py [--root REPO]     (exit status 0 = all checks passed)
"""

import argparse
import json
import posixpath
import re
import sys
from pathlib import Path

import yaml

DASHBOARD_DATASOURCE_TYPE = "prometheus"
# Metrics without a `variant` label (one series per replica); every other expression must filter
# on variant=~"$variant".
METRICS_WITHOUT_VARIANT = ("attnserve_device_memory_bytes", "attnserve_build_info",
                           "attnserve_kv_pool_capacity_bytes")


class Checker:
    def __init__(self, root: Path):
        self.root = root
        self.deploy = root / "deploy"
        self.failures = []
        self.passed = 0

    def check(self, condition: bool, what: str) -> bool:
        if condition:
            self.passed += 1
        else:
            self.failures.append(what)
            print(f"FAIL: {what}")
        return condition

    def load_yaml(self, path: Path):
        if not self.check(path.is_file(), f"{self.rel(path)} exists"):
            return None
        try:
            with path.open() as f:
                data = yaml.safe_load(f)
        except yaml.YAMLError as error:
            self.check(False, f"{self.rel(path)} parses as YAML: {error}")
            return None
        self.check(isinstance(data, dict), f"{self.rel(path)} is a YAML mapping")
        return data if isinstance(data, dict) else None

    def rel(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.root.resolve()))
        except ValueError:
            return str(path)

    def inside_repo(self, path: Path) -> bool:
        try:
            path.resolve().relative_to(self.root.resolve())
            return True
        except ValueError:
            return False


_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\})")


def with_defaults(value):
    """`value` with compose's ${VAR:-default} at its default (${VAR} empty, $$ a $)."""
    if isinstance(value, dict):
        return {key: with_defaults(item) for key, item in value.items()}
    if isinstance(value, list):
        return [with_defaults(item) for item in value]
    if isinstance(value, str):
        return _VARIABLE.sub(lambda m: "$" if m.group(1) else (m.group(3) or ""), value)
    return value


def bind_mounts(checker: Checker, service_name: str, service: dict):
    """(host path, container path) of the service's bind mounts; named volumes are skipped."""
    mounts = []
    for volume in service.get("volumes", []) or []:
        if isinstance(volume, dict):  # long syntax
            if volume.get("type") != "bind":
                continue
            source, target = volume.get("source", ""), volume.get("target", "")
        else:
            parts = str(volume).split(":")
            if len(parts) < 2 or not parts[0].startswith((".", "/")):
                continue  # a named volume
            source, target = parts[0], parts[1]
        host = (checker.deploy / source) if not source.startswith("/") else Path(source)
        mounts.append((host, target))
    return mounts


def resolve_in_container(mounts, container_path: str):
    """Host paths backing `container_path`: a mount of it, of a parent, or of files under it."""
    container_path = posixpath.normpath(container_path)
    found = []
    for host, target in mounts:
        target = posixpath.normpath(target)
        if container_path == target:
            found.append(host)
        elif container_path.startswith(target + "/"):
            found.append(host / posixpath.relpath(container_path, target))
        elif target.startswith(container_path + "/"):
            found.append(host)
    return found


def check_compose(checker: Checker):
    compose_path = checker.deploy / "compose.yaml"
    compose = checker.load_yaml(compose_path)
    if compose is None:
        return None
    compose = with_defaults(compose)
    services = compose.get("services") or {}
    for name in ("attnserve", "prometheus", "grafana"):
        checker.check(name in services, f"compose.yaml has a service '{name}'")
    declared_volumes = set((compose.get("volumes") or {}).keys())
    for name, service in services.items():
        for volume in service.get("volumes", []) or []:
            if isinstance(volume, str) and not volume.startswith((".", "/")):
                checker.check(volume.split(":")[0] in declared_volumes,
                              f"compose.yaml: named volume '{volume.split(':')[0]}' of {name} is "
                              "declared under top-level volumes")
        for host, target in bind_mounts(checker, name, service):
            checker.check(host.exists() and checker.inside_repo(host),
                          f"compose.yaml: {name} mounts {checker.rel(host)} (at {target}), which "
                          "exists in the repository")
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build.get("context", ".")
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile",
                                                                               "Dockerfile")
            context_path = checker.deploy / context
            checker.check(context_path.is_dir(), f"compose.yaml: {name}'s build context "
                          f"{checker.rel(context_path)} exists")
            checker.check((context_path / dockerfile).is_file(),
                          f"compose.yaml: {name}'s dockerfile {checker.rel(context_path / dockerfile)}"
                          " exists")
    return compose


def published_ports(service: dict):
    ports = set()
    for entry in service.get("ports", []) or []:
        text = str(entry.get("target")) if isinstance(entry, dict) else str(entry)
        ports.add(int(text.split(":")[-1].split("/")[0]))
    return ports


def flag_value(command, flag: str):
    for arg in command or []:
        if str(arg).startswith(flag + "="):
            return str(arg).split("=", 1)[1]
    return None


def check_cpu_default_and_gpu(checker: Checker, compose: dict):
    attnserve = (compose.get("services") or {}).get("attnserve") or {}
    build_args = (attnserve.get("build") or {}).get("args") or {}
    checker.check(str(build_args.get("WITH_CUDA")) == "0",
                  "compose.yaml builds the CPU image by default (build args WITH_CUDA: \"0\")")
    command = attnserve.get("command") or []
    checker.check(flag_value(command, "--backend") is None,
                  "compose.yaml passes no --backend (the server's default, auto, follows the device)")
    root = flag_value(command, "--checkpoint_root")
    ro_targets = [str(v).split(":")[1] for v in attnserve.get("volumes", []) or []
                  if isinstance(v, str) and str(v).endswith(":ro")]
    checker.check(root is not None and root in ro_targets,
                  f"compose.yaml: --checkpoint_root={root} is a read-only mount ({ro_targets})")
    health = ((attnserve.get("healthcheck") or {}).get("test")) or []
    checker.check(list(health) == ["CMD", "attnserve-healthcheck"],
                  f"compose.yaml's healthcheck runs attnserve-healthcheck: {health}")

    gpu = checker.load_yaml(checker.deploy / "compose.gpu.yaml")
    if gpu is None:
        return
    gpu = with_defaults(gpu)
    gpu_services = gpu.get("services") or {}
    checker.check(set(gpu_services) == {"attnserve"},
                  f"compose.gpu.yaml overrides only attnserve: {sorted(gpu_services)}")
    gpu_attnserve = gpu_services.get("attnserve") or {}
    gpu_args = (gpu_attnserve.get("build") or {}).get("args") or {}
    checker.check(str(gpu_args.get("WITH_CUDA")) == "1",
                  "compose.gpu.yaml builds the CUDA image (WITH_CUDA: \"1\")")
    checker.check(gpu_attnserve.get("image") not in (None, attnserve.get("image")),
                  "compose.gpu.yaml names its image apart from the CPU one "
                  f"({gpu_attnserve.get('image')} vs {attnserve.get('image')})")
    checker.check(any("gpu" in str(d) for d in gpu_attnserve.get("devices", []) or []),
                  f"compose.gpu.yaml gives the container a GPU: {gpu_attnserve.get('devices')}")


def check_prometheus(checker: Checker, compose: dict):
    services = compose.get("services") or {}
    prometheus = services.get("prometheus") or {}
    mounts = bind_mounts(checker, "prometheus", prometheus)
    config_in_container = flag_value(prometheus.get("command"), "--config.file") or \
        "/etc/prometheus/prometheus.yml"
    hosts = resolve_in_container(mounts, config_in_container)
    if not checker.check(len(hosts) == 1, f"compose.yaml: prometheus's {config_in_container} is "
                         "mounted from one file of the repository"):
        return
    config = checker.load_yaml(hosts[0])
    if config is None:
        return
    checker.check(hosts[0] == checker.deploy / "prometheus" / "prometheus.yml",
                  "the Prometheus config mounted is deploy/prometheus/prometheus.yml")
    metrics_address = flag_value((services.get("attnserve") or {}).get("command"),
                                 "--metrics_address")
    if not checker.check(metrics_address is not None,
                         "compose.yaml: attnserve's command sets --metrics_address"):
        return
    metrics_port = metrics_address.rsplit(":", 1)[1]
    targets = [target for job in config.get("scrape_configs") or []
               for static in job.get("static_configs") or [] for target in static.get("targets", [])]
    checker.check(f"attnserve:{metrics_port}" in targets,
                  f"prometheus.yml scrapes attnserve:{metrics_port} (targets: {targets})")
    checker.check(int(metrics_port) in published_ports(services.get("attnserve") or {}),
                  f"compose.yaml publishes attnserve's metrics port {metrics_port}")


def check_grafana(checker: Checker, compose: dict, dashboard: dict):
    grafana = (compose.get("services") or {}).get("grafana") or {}
    mounts = bind_mounts(checker, "grafana", grafana)
    provisioning = checker.deploy / "grafana" / "provisioning"
    checker.check(any(target == "/etc/grafana/provisioning" and host.resolve() == provisioning.resolve()
                      for host, target in mounts),
                  "compose.yaml mounts deploy/grafana/provisioning at /etc/grafana/provisioning")
    files = sorted(provisioning.rglob("*.yaml")) + sorted(provisioning.rglob("*.yml"))
    checker.check(len(files) >= 2, "deploy/grafana/provisioning has datasource and dashboard YAML")
    datasource_uids = set()
    for path in files:
        data = checker.load_yaml(path)
        if data is None:
            continue
        checker.check(data.get("apiVersion") == 1, f"{checker.rel(path)}: apiVersion 1")
        for source in data.get("datasources") or []:
            checker.check(source.get("type") == DASHBOARD_DATASOURCE_TYPE and source.get("uid"),
                          f"{checker.rel(path)}: datasource '{source.get('name')}' is a prometheus "
                          "datasource with a uid")
            datasource_uids.add(source.get("uid"))
        for provider in data.get("providers") or []:
            path_in_container = (provider.get("options") or {}).get("path", "")
            hosts = resolve_in_container(mounts, path_in_container)
            checker.check(bool(hosts) and all(h.exists() for h in hosts),
                          f"{checker.rel(path)}: provider '{provider.get('name')}' loads "
                          f"{path_in_container}, which is mounted from files that exist: "
                          f"{[checker.rel(h) for h in hosts]}")
            dashboards = [h for h in hosts if h.suffix == ".json"] + \
                [p for h in hosts if h.is_dir() for p in h.glob("*.json")]
            checker.check(any(h.resolve() == (checker.deploy / "grafana" / "attnserve.json").resolve()
                              for h in dashboards),
                          f"{checker.rel(path)}: provider '{provider.get('name')}' loads "
                          "deploy/grafana/attnserve.json")
    home = (grafana.get("environment") or {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        hosts = resolve_in_container(mounts, home)
        checker.check(len(hosts) == 1 and hosts[0].is_file(),
                      f"compose.yaml: Grafana's home dashboard {home} is a mounted file")
    used_uids = {ds.get("uid") for ds in iter_datasources(dashboard)}
    checker.check(used_uids and used_uids <= datasource_uids,
                  f"the dashboard's datasource uids {sorted(map(str, used_uids))} are provisioned "
                  f"({sorted(map(str, datasource_uids))})")


def iter_panels(panels):
    for panel in panels or []:
        yield panel
        yield from iter_panels(panel.get("panels"))


def iter_datasources(dashboard: dict):
    for panel in iter_panels(dashboard.get("panels")):
        for holder in [panel] + list(panel.get("targets") or []):
            if isinstance(holder.get("datasource"), dict):
                yield holder["datasource"]
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if isinstance(variable.get("datasource"), dict):
            yield variable["datasource"]


def check_dashboard(checker: Checker):
    path = checker.deploy / "grafana" / "attnserve.json"
    if not checker.check(path.is_file(), "deploy/grafana/attnserve.json exists"):
        return None
    try:
        dashboard = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        checker.check(False, f"deploy/grafana/attnserve.json parses as JSON: {error}")
        return None
    variables = {v.get("name"): v for v in (dashboard.get("templating") or {}).get("list") or []}
    variant = variables.get("variant") or {}
    query = variant.get("query")
    query = query.get("query") if isinstance(query, dict) else query
    checker.check(query == "label_values(attnserve_kv_pool_used_bytes, variant)",
                  f"the dashboard has a 'variant' variable over "
                  f"label_values(attnserve_kv_pool_used_bytes, variant) (got {query!r})")
    exprs = [target.get("expr", "") for panel in iter_panels(dashboard.get("panels"))
             for target in panel.get("targets") or []]
    checker.check(len(exprs) >= 10 and all(exprs), f"the dashboard has panel expressions "
                  f"({len(exprs)}), none empty")
    instance = variables.get("instance") or {}
    query = instance.get("query")
    query = query.get("query") if isinstance(query, dict) else query
    checker.check(query == "label_values(attnserve_build_info, instance)" and instance.get("multi")
                  and instance.get("includeAll") and instance.get("allValue") == ".*",
                  f"the dashboard has a multi-value 'instance' (replica) variable over "
                  f"label_values(attnserve_build_info, instance) with All = .* (got {query!r})")
    for expr in exprs:
        # Every replica's series is selected by the instance variable, so sums are over the
        # replicas chosen; there is no aggregate series (variant="all") to double-count.
        selectors = re.findall(r"\b((?:attnserve|process)_[a-z_]+)(\{[^}]*\})?", expr)
        for name, labels in selectors:
            if name == "attnserve_build_info" and "and on (instance, job)" in expr:
                continue  # only restricts process_* to attnserve's targets
            checker.check('instance=~"$instance"' in labels,
                          f'{name} is selected with instance=~"$instance": {expr}')
        checker.check('"all"' not in expr, f'expression names no variant "all": {expr}')
        metrics = set(re.findall(r"\battnserve_[a-z_]+", expr))
        if metrics and not metrics <= set(METRICS_WITHOUT_VARIANT):
            checker.check('variant=~"$variant"' in expr,
                          f'expression filters on variant=~"$variant": {expr}')
        checker.check('variant="$variant"' not in expr,
                      f"expression matches $variant with =~, not = (multi-value): {expr}")
    return dashboard


def check_dockerfile(checker: Checker, compose: dict):
    path = checker.root / "Dockerfile"
    if not checker.check(path.is_file(), "Dockerfile exists at the repository root"):
        return
    text = path.read_text()
    logical = re.sub(r"\\\n", " ", text)  # join continued lines
    instructions = [line.strip() for line in logical.splitlines()
                    if line.strip() and not line.strip().startswith("#")]
    froms = [line for line in instructions if line.upper().startswith("FROM ")]
    checker.check(len(froms) >= 2, f"Dockerfile is multi-stage ({len(froms)} FROM)")
    for line in instructions:
        if line.upper().startswith(("COPY ", "ADD ")) and "--from=" not in line:
            args = [a for a in line.split()[1:] if not a.startswith("--")]
            for source in args[:-1]:
                if source == ".":
                    continue
                checker.check((checker.root / source).exists(),
                              f"Dockerfile: COPY source {source} exists")
    runs = " ".join(line for line in instructions if line.upper().startswith("RUN "))
    checker.check("deploy/setup.sh --no-python" in runs,
                  "Dockerfile's build stage runs deploy/setup.sh --no-python (the README's set-up)")
    checker.check("cmake --preset release" in runs and "cmake --build --preset release" in runs,
                  "Dockerfile builds with the README's release preset")
    checker.check("setup.sh --runtime-only" in runs,
                  "Dockerfile's runtime stage installs setup.sh --runtime-only")
    users = [line.split()[1] for line in instructions if line.upper().startswith("USER ")]
    checker.check(bool(users) and users[-1].split(":")[0] not in ("root", "0"),
                  f"Dockerfile runs as a non-root user (USER {users[-1] if users else None})")
    health = [line for line in instructions if line.upper().startswith("HEALTHCHECK ")]
    checker.check(bool(health) and '"attnserve-healthcheck"' in health[-1],
                  "Dockerfile has a HEALTHCHECK through attnserve-healthcheck")
    checker.check(any(line.split()[1:] == ["deploy/healthcheck.sh",
                                            "/usr/local/bin/attnserve-healthcheck"]
                      for line in instructions if line.upper().startswith("COPY ")),
                  "Dockerfile copies deploy/healthcheck.sh to /usr/local/bin/attnserve-healthcheck")
    entrypoints = [line for line in instructions if line.upper().startswith("ENTRYPOINT ")]
    entrypoint = json.loads(entrypoints[-1].split(None, 1)[1]) if entrypoints else []
    port_files = [a.split("=", 1)[1] for a in entrypoint if a.startswith("--port_file=")]
    script = (checker.root / "deploy" / "healthcheck.sh").read_text()
    checker.check(len(port_files) == 1 and f'ATTNSERVE_PORT_FILE:-{port_files[0]}}}' in script,
                  f"the ENTRYPOINT's --port_file {port_files} is the file deploy/healthcheck.sh reads")
    checker.check("attnctl" in script and " health" in script and "${port}" in script,
                  "deploy/healthcheck.sh asks attnctl health on the port read from that file")
    exposed = {int(p.split("/")[0]) for line in instructions if line.upper().startswith("EXPOSE ")
               for p in line.split()[1:]}
    attnserve = (compose.get("services") or {}).get("attnserve") or {}
    checker.check(published_ports(attnserve) <= exposed,
                  f"the ports compose publishes for attnserve {sorted(published_ports(attnserve))} "
                  f"are EXPOSEd by the Dockerfile {sorted(exposed)}")
    setup = (checker.root / "deploy" / "setup.sh").read_text()
    checker.check("--runtime-only)" in setup and "RUNTIME_PACKAGES=(" in setup,
                  "deploy/setup.sh has --runtime-only and its RUNTIME_PACKAGES")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="repository root")
    args = parser.parse_args()
    checker = Checker(args.root.resolve())
    compose = check_compose(checker)
    dashboard = check_dashboard(checker)
    if compose is not None:
        check_prometheus(checker, compose)
        check_cpu_default_and_gpu(checker, compose)
        check_dockerfile(checker, compose)
        if dashboard is not None:
            check_grafana(checker, compose, dashboard)
    if checker.failures:
        print(f"check_deploy_files: {len(checker.failures)} of "
              f"{len(checker.failures) + checker.passed} checks failed")
        return 1
    print(f"check_deploy_files: all {checker.passed} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
