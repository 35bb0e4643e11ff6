#!/usr/bin/env bash
# ctest (label server): the clients against a server with TLS, mutual TLS and bearer tokens, on
# 127.0.0.1. Makes a throwaway CA, a server certificate (IP:127.0.0.1, DNS:localhost) and a client
# certificate with the openssl command line, and a tokens file, then checks that:
#   - attnctl with --tls_ca and --token configures, forwards, lists and releases; without the token
#     it fails with UNAUTHENTICATED, and another tenant's token does not see the session;
#   - the environment fallbacks ATTNSERVE_TLS_CA and ATTNSERVE_TOKEN work the same;
#   - attnbench runs with --tls_ca and --token (0 errors);
#   - the Python client (client/python/example.py) runs with --tls_ca and --token, and is refused
#     without the token;
#   - against a mutual-TLS server, attnctl needs --tls_cert/--tls_key;
# and that each server exits 0 on SIGTERM.
#
# Usage: tests/client/security_clients_test.sh BUILD_DIR PYTHON
set -euo pipefail

readonly BUILD="${1:?usage: $0 BUILD_DIR PYTHON}"
readonly PYTHON="${2:?usage: $0 BUILD_DIR PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly SERVER_BIN="${BUILD}/server/attnserve_server"
readonly ATTNCTL="${BUILD}/client/attnctl"
readonly ATTNBENCH="${BUILD}/client/attnbench"

readonly TEST_NAME=security_clients_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER_BIN}" "${ATTNCTL}" "${ATTNBENCH}"
command -v openssl >/dev/null || fail "openssl not found: run deploy/setup.sh"
unset ATTNSERVE_TOKEN ATTNSERVE_TLS_CA ATTNSERVE_TLS_CERT ATTNSERVE_TLS_KEY

# ---- Certificates and tokens ----
(
  cd "${workdir}"
  key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1.key"; }
  key ca
  openssl req -x509 -new -key ca.key -subj /CN=attnserve-test-ca -days 2 -out ca.pem
  sign() {  # NAME EXTENSION
    key "$1"
    openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr"
    printf '%s\n' "$2" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile "$1.ext" -out "$1.pem"
  }
  sign server "subjectAltName=IP:127.0.0.1,DNS:localhost"
  sign client "extendedKeyUsage=clientAuth"
) >"${workdir}/openssl.log" 2>&1 || { cat "${workdir}/openssl.log"; fail "openssl"; }

readonly ALICE="alice-token-5d2c81"
readonly BOB="bob-token-9e0a44"
hash() { printf %s "$1" | openssl dgst -sha256 -r | cut -d' ' -f1; }
{
  echo "# <sha256 of the token> <tenant> [admin]"
  echo "$(hash "${ALICE}") alice"
  echo "$(hash "${BOB}") bob"
} >"${workdir}/tokens"

# ---- TLS + tokens ----
server_start "${SERVER_BIN}" "${workdir}" --threads=2 --tls_cert="${workdir}/server.pem" \
  --tls_key="${workdir}/server.key" --auth_tokens="${workdir}/tokens" ||
  fail "the TLS server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"
ctl() { timeout 60 "${ATTNCTL}" --server="${ADDRESS}" --timeout_s=30 "$@"; }
json() { "${PYTHON}" -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

session="$(ctl --tls_ca="${workdir}/ca.pem" --token="${ALICE}" --json configure --variant=gqa \
  --d_model=128 --num_heads=4 --num_kv_heads=2 --seed=1 | json 'd["session_id"]')" ||
  fail "attnctl configure with --tls_ca and --token"
[[ -n "${session}" ]] || fail "no session id"
ctl --tls_ca="${workdir}/ca.pem" --token="${ALICE}" forward --session="${session}" --request=a \
  --tokens=8 >/dev/null || fail "attnctl forward"
[[ "$(ctl --tls_ca="${workdir}/ca.pem" --token="${ALICE}" --json list | json 'len(d["sessions"])')" == 1 ]] ||
  fail "alice does not list her session"
[[ "$(ctl --tls_ca="${workdir}/ca.pem" --token="${BOB}" --json list | json 'len(d["sessions"])')" == 0 ]] ||
  fail "bob lists alice's session"
status=0
ctl --tls_ca="${workdir}/ca.pem" --token="${BOB}" get --session="${session}" \
  >/dev/null 2>"${workdir}/bob.err" || status=$?
[[ "${status}" -eq 1 ]] && grep -q NOT_FOUND "${workdir}/bob.err" ||
  fail "bob's get of alice's session: exit ${status}, $(cat "${workdir}/bob.err")"
status=0
ctl --tls_ca="${workdir}/ca.pem" info >/dev/null 2>"${workdir}/notoken.err" || status=$?
[[ "${status}" -eq 1 ]] && grep -q UNAUTHENTICATED "${workdir}/notoken.err" ||
  fail "attnctl without a token: exit ${status}, $(cat "${workdir}/notoken.err")"
status=0
ctl --token="${ALICE}" info >/dev/null 2>"${workdir}/plain.err" || status=$?
[[ "${status}" -eq 1 ]] || fail "attnctl in plaintext to a TLS server: exit ${status}"
# The environment fallbacks.
ATTNSERVE_TLS_CA="${workdir}/ca.pem" ATTNSERVE_TOKEN="${ALICE}" ctl release --session="${session}" \
  >/dev/null || fail "attnctl release with ATTNSERVE_TLS_CA and ATTNSERVE_TOKEN"
echo "attnctl: TLS and tokens OK"

status=0
timeout 240 "${ATTNBENCH}" --server="${ADDRESS}" --tls_ca="${workdir}/ca.pem" --token="${BOB}" \
  --variants=mha --concurrency=2 --steps=5 --context=16 --d_model=128 --num_heads=4 \
  --step_timeout=30s --timeout_s=60 --json >"${workdir}/bench.json" 2>"${workdir}/bench.err" ||
  status=$?
[[ "${status}" -eq 0 ]] || fail "attnbench with --tls_ca and --token exited ${status}: $(cat "${workdir}/bench.err")"
[[ "$(json 'd["errors"]' <"${workdir}/bench.json")" == 0 ]] || fail "attnbench reported errors"
echo "attnbench: TLS and tokens OK"

"${PYTHON}" "${ROOT}/client/python/gen_proto.py"
readonly EXAMPLE="${ROOT}/client/python/example.py"
timeout 120 "${PYTHON}" "${EXAMPLE}" --server="${ADDRESS}" --tls_ca="${workdir}/ca.pem" \
  --token="${ALICE}" >"${workdir}/py.out" 2>&1 || { cat "${workdir}/py.out"; fail "example.py with --tls_ca and --token"; }
grep -qF "example: OK" "${workdir}/py.out" || fail "example.py did not print 'example: OK'"
status=0
ATTNSERVE_TLS_CA="${workdir}/ca.pem" timeout 120 "${PYTHON}" "${EXAMPLE}" --server="${ADDRESS}" \
  >"${workdir}/py_notoken.out" 2>&1 || status=$?
[[ "${status}" -eq 1 ]] && grep -q UNAUTHENTICATED "${workdir}/py_notoken.out" ||
  fail "example.py without a token: exit ${status}, $(cat "${workdir}/py_notoken.out")"
echo "python client: TLS and tokens OK"

status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the TLS server exited with status ${status} after SIGTERM"

# ---- Mutual TLS ----
rm -f "${workdir}/port"  # server_start waits for a fresh port file.
server_start "${SERVER_BIN}" "${workdir}" --threads=2 --tls_cert="${workdir}/server.pem" \
  --tls_key="${workdir}/server.key" --tls_client_ca="${workdir}/ca.pem" ||
  fail "the mutual-TLS server did not start"
mtls() { timeout 60 "${ATTNCTL}" --server="${SERVER_ADDRESS}" --timeout_s=10 "$@"; }
status=0
mtls --tls_ca="${workdir}/ca.pem" info >/dev/null 2>&1 || status=$?
[[ "${status}" -eq 1 ]] || fail "attnctl without a client certificate: exit ${status}"
mtls --tls_ca="${workdir}/ca.pem" --tls_cert="${workdir}/client.pem" \
  --tls_key="${workdir}/client.key" info >/dev/null || fail "attnctl with a client certificate"
echo "attnctl: mutual TLS OK"
status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the mutual-TLS server exited with status ${status} after SIGTERM"
echo "security_clients_test: PASS"
