#!/bin/sh
# The image's health check (Dockerfile HEALTHCHECK, deploy/compose.yaml's healthcheck): asks
# grpc.health.v1 on the port the server really bound. The image's ENTRYPOINT gives the server
# --port_file=/tmp/attnserve.port (ATTNSERVE_PORT_FILE overrides the path here), so a --listen
# changed in the command (compose, docker run, Kubernetes args) moves the check with it.
# Exit 0 = SERVING; 1 = not listening yet (no port file) or not SERVING.
# The server must listen on 0.0.0.0, [::] or 127.0.0.1: the check connects to 127.0.0.1.
set -eu
port_file="${ATTNSERVE_PORT_FILE:-/tmp/attnserve.port}"
port="$(cat "${port_file}" 2>/dev/null)" || { echo "no ${port_file}: not listening yet" >&2; exit 1; }
exec attnctl --server="127.0.0.1:${port}" --timeout_s=3 health
