#!/usr/bin/env bash
# The server image, really built and run (ctest image_test, label "image"; docs/deploy.md):
#   1. a Debian 12 base from Debian's own packages: mmdebstrap --variant=minbase bookworm, then
#      podman import (no registry is needed, or reachable in CI);
#   2. podman build of the repository's Dockerfile, CPU only (WITH_CUDA=0), from that base
#      (BASE_IMAGE and RUNTIME_BASE_IMAGE build arguments), chroot isolation;
#   3. podman run of the image on this host's network with a free 127.0.0.1 port; then
#      grpc.health.v1 SERVING (the image's attnctl health), the image's HEALTHCHECK as built
#      (podman healthcheck run: it must find the port the server bound, not the default 50051),
#      the server's default backend (auto, here CPU, logged), `attnctl demo` against it with the
#      image's attnctl and, when
#      given, the host's; /metrics answers; the server runs as the non-root user attnserve (uid
#      10001), not root; SIGTERM (podman stop) drains and exits 0.
# Prints how long each phase took. Needs root (else exits 77, ctest's "skipped"), podman, runc and
# mmdebstrap (Debian packages; deploy/setup.sh installs them) and network access to Debian's
# mirrors (mmdebstrap and the Dockerfile's apt-get).
#
# What makes podman work on a CI-like host (root, cgroups v1/v2 hybrid, no systemd): the runc
# runtime (crun fails there on setrlimit and on hybrid cgroups) and no default ulimits, through a
# containers.conf named by CONTAINERS_CONF; --isolation=chroot for RUN steps; --network=host.
#
# Usage: tests/image/image_test.sh [--context DIR] [--host-attnctl PATH] [--keep]
#                                   [--tag TAG [--build-only | --prebuilt | --remove]]
#   --context DIR       build context (default: the repository; .dockerignore applies)
#   --host-attnctl PATH also run this attnctl's demo against the container
#   --keep              keep the images (default: removed, with the container, at exit)
#   --tag TAG           name the images localhost/attnserve-base:TAG and localhost/attnserve:cpu-TAG
#                       (default: a fresh one per run). With one of:
#     --build-only      build them (always, from a new base) and keep them: ctest's image_build,
#                       the fixture that image_test and compose_test share (one build, not two)
#     --prebuilt        check them as built by --build-only, and keep them
#     --remove          only remove them: ctest's image_remove, the fixture's cleanup
set -euo pipefail

readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
context="${ROOT}"
host_attnctl=""
keep=0
tag=""
mode="all"  # all: build, check, remove; build-only; prebuilt; remove
while [[ $# -gt 0 ]]; do
  case "$1" in
    --context) context="$2"; shift 2 ;;
    --host-attnctl) host_attnctl="$2"; shift 2 ;;
    --keep) keep=1; shift ;;
    --tag) tag="$2"; shift 2 ;;
    --build-only) mode="build-only"; shift ;;
    --prebuilt) mode="prebuilt"; shift ;;
    --remove) mode="remove"; shift ;;
    *) echo "image_test: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ "${mode}" != "all" ]]; then
  [[ -n "${tag}" ]] || { echo "image_test: --${mode} needs --tag" >&2; exit 2; }
  keep=1  # The images outlive this run; --remove removes them explicitly.
fi

fail() { echo "image_test: FAIL: $*" >&2; exit 1; }
if [[ "${EUID}" -ne 0 ]]; then
  echo "image_test: SKIPPED: needs root (mmdebstrap and rootful podman)"
  exit 77  # ctest's SKIP_RETURN_CODE
fi
for tool in podman mmdebstrap runc; do
  command -v "${tool}" >/dev/null || [[ -x "/usr/sbin/${tool}" ]] ||
    fail "${tool} not found (Debian packages podman, runc, mmdebstrap: deploy/setup.sh)"
done

work="$(mktemp -d /var/tmp/attnserve-image-test.XXXXXX)"
[[ -n "${tag}" ]] || tag="$(basename "${work}" | tr '[:upper:]' '[:lower:]' | tr -c 'a-z0-9\n' '-')"
readonly base_image="localhost/attnserve-base:${tag}"
readonly image="localhost/attnserve:cpu-${tag}"
readonly container="attnserve-image-test-${tag}"
cat >"${work}/containers.conf" <<'EOF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="${work}/containers.conf"

remove_images() {
  # This build's images: the image, its untagged build stage (made after the base), the base.
  local stages
  stages="$(podman images -q --filter dangling=true --filter since="${base_image}" 2>/dev/null || true)"
  podman rmi -f "${image}" ${stages} >/dev/null 2>&1 || true
  podman rmi -f "${base_image}" >/dev/null 2>&1 || true
}
cleanup() {
  podman rm -f -t 0 "${container}" >/dev/null 2>&1 || true
  [[ "${keep}" -eq 1 ]] || remove_images
  rm -rf "${work}"
}
trap cleanup EXIT
if [[ "${mode}" == "remove" ]]; then
  remove_images
  echo "image_test: removed ${image} and ${base_image}"
  exit 0
fi

phase_start=${SECONDS}
phase() {
  echo "image_test: $1 ($((SECONDS - phase_start)) s)"
  phase_start=${SECONDS}
}
total_start=${SECONDS}

build_images() {
  # 1. The base: Debian 12 from Debian's mirror, as the host's apt sees it (with its updates and
  #    security suites, as mmdebstrap writes them for bookworm).
  mmdebstrap --quiet --variant=minbase bookworm "${work}/base.tar" >"${work}/mmdebstrap.log" 2>&1 ||
    { tail -n 20 "${work}/mmdebstrap.log" >&2; fail "mmdebstrap"; }
  podman import --quiet "${work}/base.tar" "${base_image}" >/dev/null
  rm -f "${work}/base.tar"
  phase "base image ${base_image} made by mmdebstrap and imported"

  # 2. The Dockerfile, CPU only. Docker format keeps its HEALTHCHECK (OCI has no such field).
  nice -n 10 podman build --isolation=chroot --format docker --network=host \
    --build-arg WITH_CUDA=0 --build-arg BASE_IMAGE="${base_image}" \
    --build-arg RUNTIME_BASE_IMAGE="${base_image}" \
    -f "${ROOT}/Dockerfile" -t "${image}" "${context}" >"${work}/build.log" 2>&1 ||
    { tail -n 40 "${work}/build.log" >&2; fail "podman build"; }
  phase "image ${image} built ($(podman image inspect --format '{{.Size}}' "${image}") bytes)"
}
if [[ "${mode}" == "prebuilt" ]]; then
  podman image exists "${image}" || fail "${image} does not exist (made by --build-only: ctest image_build)"
else
  build_images
fi
if [[ "${mode}" == "build-only" ]]; then
  echo "image_test: built ${image} (base ${base_image}) in $((SECONDS - total_start)) s"
  exit 0
fi

# 3. Run it on free loopback ports.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port="$(free_port)"
metrics_port="$(free_port)"
# The image's HEALTHCHECK, unchanged: it must follow --listen to this port (the image's default,
# 50051, may be taken on the host network). Run on demand below (no timer: CI has no systemd).
healthcheck="$(podman image inspect --format '{{json .Config.Healthcheck.Test}}' "${image}")"
[[ "${healthcheck}" == *'"attnserve-healthcheck"'* ]] ||
  fail "the image's HEALTHCHECK is not attnserve-healthcheck: ${healthcheck}"
podman run -d --name "${container}" --network=host --health-interval=disable "${image}" \
  --listen="127.0.0.1:${port}" --metrics_address="127.0.0.1:${metrics_port}" \
  --replica_id=image-test >/dev/null
serving=""
for _ in $(seq 1 150); do
  serving="$(podman exec "${container}" attnctl --server="127.0.0.1:${port}" --timeout_s=2 health \
    2>/dev/null || true)"
  [[ "${serving}" == *SERVING* && "${serving}" != *NOT_SERVING* ]] && break
  [[ "$(podman inspect --format '{{.State.Running}}' "${container}")" == "true" ]] ||
    { podman logs "${container}" >&2; fail "the container exited"; }
  sleep 0.2
done
[[ "${serving}" == *SERVING* && "${serving}" != *NOT_SERVING* ]] ||
  { podman logs "${container}" >&2; fail "no grpc.health.v1 SERVING within 30 s: ${serving}"; }
phase "container up, grpc.health.v1 SERVING on 127.0.0.1:${port}"

# The server answers health a moment before it writes its --port_file (server.cc), so the check
# may fail at first, as within the HEALTHCHECK's start period: wait for it, bounded.
healthy=0
for _ in $(seq 1 50); do
  podman healthcheck run "${container}" >/dev/null 2>&1 && { healthy=1; break; }
  sleep 0.2
done
[[ "${healthy}" -eq 1 ]] ||
  fail "podman healthcheck run (the image's HEALTHCHECK, ${healthcheck}) not healthy on port ${port} within 10 s"
# The default backend, auto, chose the CPU (no GPU here, and a CPU-only image) and said why.
# grep without -q reads to the end: under pipefail, -q exiting at the first match can fail the
# pipeline with SIGPIPE while `podman logs` is still writing.
podman logs "${container}" 2>&1 | grep "backend auto: CPU, because the CUDA backend is unavailable" >/dev/null ||
  { podman logs "${container}" >&2; fail "the server's log does not say backend auto chose the CPU"; }

# The user: the image's configured user, and the server process itself.
user="$(podman image inspect --format '{{.Config.User}}' "${image}")"
[[ "${user}" == "attnserve:attnserve" ]] || fail "image user '${user}', expected attnserve:attnserve"
uid="$(podman exec "${container}" id -u)"
[[ "${uid}" == "10001" ]] || fail "exec runs as uid ${uid}, expected 10001"
server_pid="$(podman inspect --format '{{.State.Pid}}' "${container}")"
server_uid="$(awk '/^Uid:/ { print $2 }' "/proc/${server_pid}/status")"
[[ "${server_uid}" == "10001" ]] || fail "attnserve_server runs as uid ${server_uid}, expected 10001"
phase "HEALTHCHECK healthy on the bound port; backend auto (CPU); non-root: image user ${user}, server uid ${server_uid}"

podman exec "${container}" attnctl --server="127.0.0.1:${port}" demo --batch=2 --tokens=32 \
  >"${work}/demo.txt" 2>&1 || { cat "${work}/demo.txt" >&2; fail "attnctl demo (the image's)"; }
for variant in MHA GQA MQA MLA; do
  grep -q "^${variant}.* ${variant,,} d_model=" "${work}/demo.txt" ||
    { cat "${work}/demo.txt" >&2; fail "no ${variant} row in the demo's table"; }
done
if [[ -n "${host_attnctl}" ]]; then
  "${host_attnctl}" --server="127.0.0.1:${port}" demo --batch=2 --tokens=32 >"${work}/demo_host.txt" 2>&1 ||
    { cat "${work}/demo_host.txt" >&2; fail "attnctl demo (the host's, ${host_attnctl})"; }
fi
sed 's/^/  /' "${work}/demo.txt"
phase "attnctl demo against the container (the image's attnctl${host_attnctl:+, and ${host_attnctl}})"

exec 3<>"/dev/tcp/127.0.0.1/${metrics_port}"
printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
metrics="$(timeout 10 cat <&3 || true)"
exec 3<&-
[[ "${metrics}" == *"200 OK"* && "${metrics}" == *attnserve_* ]] || fail "/metrics did not answer"

# SIGTERM drains and exits 0 (the image's STOPSIGNAL; podman stop waits 15 s before SIGKILL).
podman stop -t 15 "${container}" >/dev/null
code="$(podman inspect --format '{{.State.ExitCode}}' "${container}")"
[[ "${code}" == "0" ]] || { podman logs "${container}" | tail -n 20 >&2; fail "exit code ${code} after SIGTERM"; }
phase "/metrics answered; SIGTERM: exit 0"

echo "image_test: PASS in $((SECONDS - total_start)) s"
