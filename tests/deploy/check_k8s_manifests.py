#!/usr/bin/env python3
"""Checks deploy/k8s without a cluster (ctest k8s_manifests_test, label "deploy").

  * Schemas: every Kubernetes object of deploy/k8s validates, strictly (unknown fields are
    errors), against the OpenAPI schemas of Kubernetes KUBERNETES_VERSION that the PyPI package
    kubernetes-validate carries inside it (tests/deploy/requirements.txt; no network, no cluster).
    The ServiceMonitor is a CRD the package has no schema for; its fields are checked below.
  * Kustomize: each overlay (gpu, cpu) and base list only files that exist, every YAML file is
    listed by some kustomization, the configMapGenerator's haproxy.cfg is byte for byte
    deploy/haproxy/haproxy.cfg (the file tests/scale runs).
  * Agreement: every flag in the replicas' args is a flag of the real attnserve_server
    (--helpfull of the built binary); the GPU variant asks for nvidia.com/gpu and sizes its pool
    with --kv_pool_fraction, the CPU variant does neither (the server refuses the fraction on the
    CPU backend); the probes are gRPC probes on the --listen port; Services, probes, scrape
    annotations and the ServiceMonitor name ports the containers have; selectors match the pod
    labels; the balancer's ATTNSERVE_REPLICA_N name the StatefulSet's pods through its headless
    Service, as many as the StatefulSet's replicas and haproxy.cfg's servers.

Usage: check_k8s_manifests.py --root REPO --server PATH/attnserve_server
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml

# gRPC probes are GA since 1.27; PodDisruptionBudget policy/v1 since 1.21.
KUBERNETES_VERSION = "1.29.0"
OVERLAYS = ("gpu", "cpu")


class Checker:
    def __init__(self):
        self.failures = []
        self.passed = 0

    def check(self, condition, what):
        if condition:
            self.passed += 1
        else:
            self.failures.append(what)
            print(f"FAIL: {what}")
        return condition


def load_documents(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def kustomization(directory):
    return load_documents(directory / "kustomization.yaml")[0]


def objects_of(directory, seen=None):
    """The objects a kustomization directory contributes: (file, object) pairs, recursively."""
    seen = seen if seen is not None else set()
    result = []
    for entry in kustomization(directory).get("resources", []):
        path = (directory / entry).resolve()
        if path in seen:
            continue
        seen.add(path)
        if path.is_dir():
            result += objects_of(path, seen)
        elif path.is_file():
            result += [(path, obj) for obj in load_documents(path)]
    return result


def server_flags(server):
    text = subprocess.run([server, "--helpfull"], capture_output=True, text=True).stdout
    return set(re.findall(r"^\s+--([a-z_0-9]+) ", text, re.MULTILINE))


def find(objects, kind, name=None):
    return [obj for _, obj in objects
            if obj.get("kind") == kind and (name is None or obj["metadata"]["name"] == name)]


def container_ports(pod_spec):
    return {p["name"]: p["containerPort"]
            for c in pod_spec["containers"] for p in c.get("ports", [])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--server", required=True)
    args = parser.parse_args()
    args.root = args.root.resolve()
    k8s = args.root / "deploy" / "k8s"
    c = Checker()

    # -- Kustomize structure --
    listed = set()
    for directory in [k8s / "base"] + [k8s / o for o in OVERLAYS]:
        spec = kustomization(directory)
        c.check(spec.get("kind") == "Kustomization",
                f"{directory}/kustomization.yaml: a Kustomization")
        for entry in spec.get("resources", []):
            path = (directory / entry).resolve()
            c.check(path.exists(), f"{directory.name}: resource {entry} exists")
            if path.is_file():
                listed.add(path)
        for generator in spec.get("configMapGenerator", []):
            for entry in generator.get("files", []):
                path = directory / entry.split("=")[-1]
                c.check(path.is_file(), f"{directory.name}: configMapGenerator file {entry} exists")
                listed.add(path.resolve())
    for path in k8s.rglob("*"):
        if path.is_file() and path.name != "kustomization.yaml":
            c.check(path.resolve() in listed,
                    f"{path.relative_to(args.root)} is used by a kustomization")
    c.check((k8s / "base" / "haproxy.cfg").read_bytes() ==
            (args.root / "deploy" / "haproxy" / "haproxy.cfg").read_bytes(),
            "deploy/k8s/base/haproxy.cfg is a copy of deploy/haproxy/haproxy.cfg")
    haproxy_servers = re.findall(r'^\s*server\s+(\S+)\s+"\$\{ATTNSERVE_REPLICA_(\d+)\}"',
                                 (args.root / "deploy" / "haproxy" / "haproxy.cfg").read_text(),
                                 re.MULTILINE)

    flags = server_flags(args.server)
    c.check("listen" in flags and "kv_pool_fraction" in flags,
            f"attnserve_server --helpfull lists its flags ({len(flags)} found)")

    for overlay in OVERLAYS:
        objects = objects_of(k8s / overlay)
        where = f"deploy/k8s/{overlay}"

        # -- Schemas --
        for path, obj in objects:
            name = (f"{path.relative_to(args.root)}: {obj.get('kind')} "
                    f"{obj.get('metadata', {}).get('name')}")
            if obj.get("apiVersion", "").startswith("monitoring.coreos.com/"):
                continue  # A CRD: checked by hand below.
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
                c.check(True, name)
            except kubernetes_validate.ValidationError as error:
                c.check(False, f"{name}: {error.message} at {'/'.join(map(str, error.path))}")
            except Exception as error:  # SchemaNotFoundError, InvalidSchemaError, ...
                c.check(False, f"{name}: {type(error).__name__}: {error}")

        # -- The replicas --
        sets = find(objects, "StatefulSet", "attnserve")
        if not c.check(len(sets) == 1, f"{where}: one StatefulSet attnserve"):
            continue
        replicas = sets[0]
        pod = replicas["spec"]["template"]["spec"]
        pod_labels = replicas["spec"]["template"]["metadata"]["labels"]
        container = pod["containers"][0]
        container_args = container.get("args", [])
        for arg in container_args:
            flag = arg[2:].split("=")[0]
            c.check(arg.startswith("--") and flag in flags,
                    f"{where}: {arg} is a flag of attnserve_server")
        values = dict(a[2:].split("=", 1) for a in container_args if "=" in a)
        resources = container.get("resources", {})
        gpus = resources.get("limits", {}).get("nvidia.com/gpu")
        if overlay == "gpu":
            c.check(gpus == 1 and resources.get("requests", {}).get("nvidia.com/gpu") == 1,
                    f"{where}: one nvidia.com/gpu requested and limited")
            c.check(values.get("backend") == "cuda" and "kv_pool_fraction" in values,
                    f"{where}: --backend=cuda with --kv_pool_fraction")
        else:
            c.check(gpus is None, f"{where}: no GPU")
            c.check(values.get("backend") == "cpu" and "kv_pool_fraction" not in values,
                    f"{where}: --backend=cpu without --kv_pool_fraction (refused on the CPU)")
        ports = container_ports(pod)
        listen_port = int(values.get("listen", ":0").rsplit(":", 1)[1])
        metrics_port = int(values.get("metrics_address", ":0").rsplit(":", 1)[1])
        c.check(ports.get("grpc") == listen_port, f"{where}: container port grpc is --listen's")
        c.check(ports.get("metrics") == metrics_port,
                f"{where}: container port metrics is --metrics_address's")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            c.check(container.get(probe, {}).get("grpc", {}).get("port") == listen_port,
                    f"{where}: {probe} is a gRPC probe on port {listen_port}")
        annotations = replicas["spec"]["template"]["metadata"].get("annotations", {})
        c.check(annotations.get("prometheus.io/port") == str(metrics_port),
                f"{where}: prometheus.io/port names the metrics port")
        c.check(any(a == "--replica_id=$(POD_NAME)" for a in container_args) and
                any(e.get("name") == "POD_NAME" for e in container.get("env", [])),
                f"{where}: --replica_id is the pod's name")
        shutdown_s = int(values.get("shutdown_grace", "10s").rstrip("s"))
        # A rolling restart loses nothing: SIGTERM first hands every request to the balancer's
        # pick (--drain_to, docs/deploy.md "Drain"), then drains calls; Kubernetes must wait for
        # both before its SIGKILL.
        drain_s = int(values.get("drain_timeout", "60s").rstrip("s")) if "drain_to" in values else 0
        c.check(pod.get("terminationGracePeriodSeconds", 30) > drain_s + shutdown_s,
                f"{where}: terminationGracePeriodSeconds exceeds --drain_timeout + --shutdown_grace")
        if c.check("drain_to" in values, f"{where}: --drain_to is set (rolling restarts move requests)"):
            host, _, port = values["drain_to"].rpartition(":")
            balancer = find(objects, "Service", host)
            c.check(len(balancer) == 1 and
                    any(p["port"] == int(port) for p in balancer[0]["spec"]["ports"]),
                    f"{where}: --drain_to={values['drain_to']} is the balancer Service's gRPC port")
            c.check("rebalance_period" in values,
                    f"{where}: --rebalance_period set (drained sessions go home when a pod returns)")

        headless = find(objects, "Service", replicas["spec"]["serviceName"])
        if c.check(len(headless) == 1, f"{where}: the StatefulSet's serviceName exists"):
            service = headless[0]["spec"]
            c.check(service.get("clusterIP") == "None",
                    f"{where}: the replicas' Service is headless")
            c.check(service["selector"].items() <= pod_labels.items(),
                    f"{where}: the replicas' Service selects the replicas")
            for port in service["ports"]:
                c.check(port["targetPort"] in ports, f"{where}: Service port {port['name']} exists")

        for budget in find(objects, "PodDisruptionBudget"):
            selector = budget["spec"]["selector"]["matchLabels"]
            selected = [o for _, o in objects if o.get("kind") in ("StatefulSet", "Deployment") and
                        selector.items() <= o["spec"]["template"]["metadata"]["labels"].items()]
            c.check(len(selected) == 1,
                    f"{where}: PDB {budget['metadata']['name']} selects a workload")

        for monitor in find(objects, "ServiceMonitor"):
            c.check(monitor["apiVersion"] == "monitoring.coreos.com/v1",
                    f"{where}: ServiceMonitor apiVersion monitoring.coreos.com/v1")
            selector = monitor["spec"]["selector"]["matchLabels"]
            services = [s for s in find(objects, "Service")
                        if selector.items() <= s["metadata"].get("labels", {}).items()]
            c.check(len(services) == 1 and services[0]["metadata"]["name"] ==
                    replicas["spec"]["serviceName"],
                    f"{where}: the ServiceMonitor selects the replicas' Service")
            for endpoint in monitor["spec"]["endpoints"]:
                c.check(any(p["name"] == endpoint["port"]
                            for s in services for p in s["spec"]["ports"]),
                        f"{where}: ServiceMonitor endpoint port {endpoint['port']} "
                        "is a Service port")

        # -- The balancer --
        balancers = find(objects, "Deployment", "attnserve-balancer")
        if not c.check(len(balancers) == 1, f"{where}: one Deployment attnserve-balancer"):
            continue
        balancer_pod = balancers[0]["spec"]["template"]["spec"]
        balancer = balancer_pod["containers"][0]
        env = {e["name"]: e.get("value", "") for e in balancer.get("env", [])}
        replica_env = sorted((k, v) for k, v in env.items() if k.startswith("ATTNSERVE_REPLICA_"))
        pod_dns = f"{replicas['metadata']['name']}-{{}}.{replicas['spec']['serviceName']}"
        expected = [(f"ATTNSERVE_REPLICA_{i}", f"{pod_dns.format(i)}:{listen_port}")
                    for i in range(replicas["spec"]["replicas"])]
        c.check(replica_env == expected,
                f"{where}: the balancer's ATTNSERVE_REPLICA_N name the StatefulSet's pods: "
                f"{replica_env} vs {expected}")
        c.check(len(haproxy_servers) == replicas["spec"]["replicas"] and
                sorted(int(i) for _, i in haproxy_servers) == list(range(len(haproxy_servers))),
                f"{where}: haproxy.cfg has a server per replica ({len(haproxy_servers)} servers)")
        balancer_ports = container_ports(balancer_pod)
        c.check(env.get("ATTNSERVE_BALANCER_LISTEN", "").endswith(f":{balancer_ports.get('grpc')}"),
                f"{where}: the balancer listens on its grpc container port")
        c.check(env.get("ATTNSERVE_BALANCER_METRICS", "").endswith(
                    f":{balancer_ports.get('metrics')}"),
                f"{where}: the balancer's metrics on its metrics container port")
        volumes = {v["name"]: v for v in balancer_pod.get("volumes", [])}
        mounts = balancer.get("volumeMounts", [])
        generated = [g["name"] for g in kustomization(k8s / "base").get("configMapGenerator", [])]
        c.check(any(volumes.get(m["name"], {}).get("configMap", {}).get("name") in generated and
                    f"{m['mountPath']}/haproxy.cfg" in balancer.get("command", [])
                    for m in mounts),
                f"{where}: the balancer runs the generated ConfigMap's haproxy.cfg")
        front = find(objects, "Service", "attnserve")
        if c.check(len(front) == 1, f"{where}: Service attnserve (the clients' entry)"):
            c.check(front[0]["spec"]["selector"].items() <=
                    balancers[0]["spec"]["template"]["metadata"]["labels"].items(),
                    f"{where}: Service attnserve selects the balancer")
            for port in front[0]["spec"]["ports"]:
                c.check(port["targetPort"] in balancer_ports,
                        f"{where}: Service attnserve port {port['name']} exists on the balancer")

    print(f"{c.passed} checks passed, {len(c.failures)} failed (schemas: kubernetes-validate, "
          f"Kubernetes {KUBERNETES_VERSION})")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
