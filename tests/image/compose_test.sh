#!/usr/bin/env bash
# deploy/compose.yaml, really run (ctest compose_test, label "image"; docs/deploy.md): Debian 12's
# podman-compose brings up its attnserve and prometheus services (Grafana's image cannot be pulled
# where no registry is reachable, and is not needed to show the scrape), then:
#   1. the server's container becomes healthy by compose's healthcheck (attnserve-healthcheck on
#      the port the server bound), and its log says the default --backend=auto chose the CPU;
#   2. through the published gRPC port, `attnctl configure --checkpoint=layer.safetensors` loads a
#      layer from the checkpoints directory compose mounts at --checkpoint_root, and `attnctl demo`
#      serves;
#   3. the published /metrics answers, and Prometheus (its published API) reports a scrape of the
#      attnserve service by name (attnserve:9464) that carries attnserve's own metrics;
#   4. podman-compose down stops the server with SIGTERM, and it exits 0.
# Every step waits for its event (health, a query result), bounded; nothing is ordered by sleeps.
# The containers, volumes and network of the project, and the Prometheus image made here, are
# removed at exit, also on failure.
#
# The server image is the one image_test's --build-only made (ctest image_build: the fixture they
# share, so the Dockerfile is built once). Prometheus is Debian's (the host's /usr/bin/prometheus,
# a static binary of the prometheus package deploy/setup.sh installs) on the same Debian 12 base,
# through compose.yaml's PROMETHEUS_IMAGE, since prom/prometheus cannot be pulled here.
# Needs root (else exits 77, ctest's "skipped"), podman, runc, podman-compose and the dnsname CNI
# plugin (deploy/setup.sh installs them), as image_test's host set-up.
#
# Usage: tests/image/compose_test.sh --tag TAG
#   --tag TAG   the images localhost/attnserve:cpu-TAG and localhost/attnserve-base:TAG
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
tag=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    *) echo "compose_test: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "${tag}" ]] || { echo "compose_test: --tag is required" >&2; exit 2; }

fail() { echo "compose_test: FAIL: $*" >&2; exit 1; }
if [[ "${EUID}" -ne 0 ]]; then
  echo "compose_test: SKIPPED: needs root (rootful podman, as image_test)"
  exit 77
fi
for tool in podman podman-compose runc prometheus; do
  command -v "${tool}" >/dev/null || [[ -x "/usr/sbin/${tool}" ]] ||
    fail "${tool} not found (Debian packages podman, podman-compose, runc, prometheus: deploy/setup.sh)"
done
[[ -x /usr/lib/cni/dnsname ]] ||
  fail "/usr/lib/cni/dnsname not found: without it Prometheus cannot resolve the attnserve service" \
    "(Debian package golang-github-containernetworking-plugin-dnsname: deploy/setup.sh)"

readonly image="localhost/attnserve:cpu-${tag}"
readonly base_image="localhost/attnserve-base:${tag}"
readonly prometheus_image="localhost/attnserve-compose-prometheus:${tag}"
readonly project="attnserve-compose-test-${tag}"
work="$(mktemp -d /var/tmp/attnserve-compose-test.XXXXXX)"
# As image_test: runc, and no default ulimits (CI-like hosts refuse them).
cat >"${work}/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="${work}/containers.conf"

compose() {
  podman-compose -p "${project}" -f "${ROOT}/deploy/compose.yaml" "$@"
}
cleanup() {
  compose down -v -t 5 >"${work}/down.log" 2>&1 || true
  # What down leaves when up failed half-way: anything labelled with this project.
  local ids
  ids="$(podman ps -aq --filter "label=io.podman.compose.project=${project}" 2>/dev/null || true)"
  [[ -z "${ids}" ]] || podman rm -f -t 0 ${ids} >/dev/null 2>&1 || true
  ids="$(podman volume ls -q --filter "label=io.podman.compose.project=${project}" 2>/dev/null || true)"
  [[ -z "${ids}" ]] || podman volume rm -f ${ids} >/dev/null 2>&1 || true
  podman network rm -f "${project}_default" >/dev/null 2>&1 || true
  podman rmi -f "${prometheus_image}" >/dev/null 2>&1 || true
  rm -rf "${work}"
}
trap cleanup EXIT

phase_start=${SECONDS}
total_start=${SECONDS}
phase() {
  echo "compose_test: $1 ($((SECONDS - phase_start)) s)"
  phase_start=${SECONDS}
}
# wait_for SECONDS WHAT COMMAND...: runs COMMAND until it succeeds, at most SECONDS.
wait_for() {
  local limit="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

podman image exists "${image}" || fail "${image} does not exist (made by ctest image_build)"
podman image exists "${base_image}" || fail "${base_image} does not exist (made by ctest image_build)"

# Prometheus: Debian's binary on the Debian 12 base, run as compose runs prom/prometheus (the
# entrypoint takes compose's flags).
mkdir "${work}/prometheus"
cp /usr/bin/prometheus "${work}/prometheus/prometheus"
cat >"${work}/prometheus/Containerfile" <<EOF
FROM ${base_image}
COPY prometheus /bin/prometheus
ENTRYPOINT ["/bin/prometheus"]
EOF
podman build --quiet --isolation=chroot -t "${prometheus_image}" "${work}/prometheus" \
  >"${work}/prometheus-build.log" 2>&1 ||
  { cat "${work}/prometheus-build.log" >&2; fail "podman build of the Prometheus image"; }
phase "Prometheus image ${prometheus_image} ($(prometheus --version 2>&1 | head -n 1))"

# The checkpoints compose mounts: one layer, its spec in the safetensors metadata, readable by the
# server's non-root user.
mkdir "${work}/checkpoints"
python3 - "${work}/checkpoints/layer.safetensors" <<'PY'
import array, json, random, struct, sys
spec = {"variant": "gqa", "d_model": 64, "num_heads": 4, "num_kv_heads": 2}
rng = random.Random(7)
shapes = {"q_proj.weight": (64, 64), "k_proj.weight": (32, 64), "v_proj.weight": (32, 64),
          "o_proj.weight": (64, 64)}
header, data = {"__metadata__": {"attnserve_spec": json.dumps(spec)}}, b""
for name, (rows, cols) in shapes.items():
    values = array.array("f", (rng.gauss(0, 0.1) for _ in range(rows * cols))).tobytes()
    header[f"model.layers.3.self_attn.{name}"] = {
        "dtype": "F32", "shape": [rows, cols], "data_offsets": [len(data), len(data) + len(values)]}
    data += values
text = json.dumps(header).encode()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PY
chmod 0755 "${work}" "${work}/checkpoints"
chmod 0644 "${work}/checkpoints/layer.safetensors"

grpc_port="$(free_port)"
metrics_port="$(free_port)"
prometheus_port="$(free_port)"
export ATTNSERVE_IMAGE="${image}" PROMETHEUS_IMAGE="${prometheus_image}"
export ATTNSERVE_CHECKPOINTS="${work}/checkpoints"
export ATTNSERVE_GRPC_PORT="${grpc_port}" ATTNSERVE_METRICS_PORT="${metrics_port}"
export PROMETHEUS_PORT="${prometheus_port}"
# The image exists, so up builds nothing (podman-compose builds only a missing image).
compose up -d attnserve prometheus >"${work}/up.log" 2>&1 ||
  { cat "${work}/up.log" >&2; fail "podman-compose up"; }
server="${project}_attnserve_1"
prometheus="${project}_prometheus_1"
for container in "${server}" "${prometheus}"; do
  podman container exists "${container}" || { cat "${work}/up.log" >&2; fail "no container ${container}"; }
done
phase "podman-compose up: ${server}, ${prometheus}"

# 1. Healthy, by compose's own healthcheck (run on demand: no systemd timers here).
server_running() {
  [[ "$(podman inspect --format '{{.State.Running}}' "${server}")" == "true" ]] ||
    { podman logs "${server}" >&2; fail "the server's container exited"; }
}
healthy() {
  server_running
  podman healthcheck run "${server}" >/dev/null 2>&1
}
health_test="$(podman inspect --format '{{json .Config.Healthcheck.Test}}' "${server}")"
[[ "${health_test}" == *attnserve-healthcheck* ]] ||
  fail "the server's container has no attnserve-healthcheck healthcheck: ${health_test}"
wait_for 60 "healthy" healthy || { podman logs "${server}" >&2; fail "not healthy within 60 s"; }
# grep without -q reads to the end: under pipefail, -q exiting at the first match can fail the
# pipeline with SIGPIPE while `podman logs` is still writing.
podman logs "${server}" 2>&1 | grep "backend auto: CPU, because the CUDA backend is unavailable" >/dev/null ||
  { podman logs "${server}" >&2; fail "the log does not say the default backend, auto, chose the CPU"; }
phase "server healthy (compose healthcheck ${health_test}); backend auto chose the CPU"

# 2. The published gRPC port, with the image's attnctl on the host's network.
attnctl() {
  podman run --rm --network=host --entrypoint attnctl "${image}" \
    --server="127.0.0.1:${grpc_port}" --timeout_s=30 "$@"
}
attnctl configure --checkpoint=layer.safetensors --layer=3 >"${work}/configure.txt" 2>&1 ||
  { cat "${work}/configure.txt" >&2; fail "configure from /checkpoints/layer.safetensors"; }
grep -Eqi "^spec +gqa d_model=64 heads=4 kv_heads=2" "${work}/configure.txt" ||
  { cat "${work}/configure.txt" >&2; fail "configure did not report the checkpoint's gqa layer"; }
attnctl demo --batch=2 --tokens=16 >"${work}/demo.txt" 2>&1 ||
  { cat "${work}/demo.txt" >&2; fail "attnctl demo"; }
phase "published gRPC port ${grpc_port}: configure from the mounted checkpoint, demo"

# 3. /metrics on the published port, then Prometheus: a scrape of attnserve:9464 (compose's
# service name) with attnserve's metrics in it, as the session configured above.
exec 3<>"/dev/tcp/127.0.0.1/${metrics_port}"
printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
metrics="$(timeout 10 cat <&3 || true)"
exec 3<&-
[[ "${metrics}" == *"200 OK"* && "${metrics}" == *attnserve_build_info* ]] ||
  fail "the published /metrics (127.0.0.1:${metrics_port}) did not answer with attnserve's metrics"
# Prints the query's result vector (JSON) from the published Prometheus API; fails until it has
# a sample.
query() {
  python3 - "${prometheus_port}" "$1" <<'PY'
import json, sys, urllib.parse, urllib.request
url = "http://127.0.0.1:%s/api/v1/query?query=%s" % (sys.argv[1], urllib.parse.quote(sys.argv[2]))
try:
    with urllib.request.urlopen(url, timeout=5) as response:
        result = json.load(response)["data"]["result"]
except OSError:
    sys.exit(1)
print(json.dumps(result))
sys.exit(0 if result else 1)
PY
}
scraped() {
  server_running
  query 'attnserve_build_info{job="attnserve",instance="attnserve:9464",backend="cpu"} == 1' \
    >"${work}/build_info.json" &&
    query 'up{job="attnserve",instance="attnserve:9464"} == 1' >/dev/null
}
wait_for 60 "scraped" scraped ||
  { query 'up' >&2 || true; podman logs "${prometheus}" 2>&1 | tail -n 20 >&2
    fail "Prometheus did not scrape attnserve:9464 within 60 s"; }
# The session configured in step 2, as Prometheus saw it (a later scrape than the first).
wait_for 30 "sessions" query 'sum(attnserve_sessions_active{job="attnserve"}) >= 1' \
  >"${work}/sessions.json" ||
  fail "Prometheus has no live session: $(query 'attnserve_sessions_active' || true)"
phase "/metrics published on ${metrics_port}; Prometheus (${prometheus_port}) scraped attnserve:9464: $(cat "${work}/build_info.json")"

# 4. Down: SIGTERM drains and the server exits 0.
compose stop -t 30 attnserve >"${work}/stop.log" 2>&1 || { cat "${work}/stop.log" >&2; fail "podman-compose stop"; }
code="$(podman inspect --format '{{.State.ExitCode}}' "${server}")"
[[ "${code}" == "0" ]] || { podman logs "${server}" 2>&1 | tail -n 20 >&2; fail "exit code ${code} after SIGTERM"; }
phase "podman-compose stop: the server exited 0"

echo "compose_test: PASS in $((SECONDS - total_start)) s"
