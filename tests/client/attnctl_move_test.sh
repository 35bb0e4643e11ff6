#!/usr/bin/env bash
# ctest: `attnctl move` between two real server processes on 127.0.0.1. Configures the same spec and
# seed on both (equal fingerprints), prefills a request on A, moves it to B with --release_source,
# and checks that B holds it at its length and decodes it, that A no longer has it, and that a move
# into a session of another seed fails with FAILED_PRECONDITION (exit 1), and that a move without
# --to_session to a replica lacking the session names the target in its NOT_FOUND. Both servers
# must exit 0 after SIGTERM.
#
# Usage: tests/client/attnctl_move_test.sh SERVER_BINARY ATTNCTL_BINARY
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER_BINARY ATTNCTL_BINARY}"
readonly ATTNCTL="${2:?usage: $0 SERVER_BINARY ATTNCTL_BINARY}"
workdir="$(mktemp -d)"
pids=()

cleanup() {
  local status=$?
  for pid in "${pids[@]}"; do kill -KILL "${pid}" 2>/dev/null || true; done
  if [[ "${status}" -ne 0 ]]; then tail -n 20 "${workdir}"/*.log >&2 || true; fi
  rm -rf "${workdir}"
  exit "${status}"
}
trap cleanup EXIT

fail() {
  echo "attnctl_move_test: FAIL: $*" >&2
  exit 1
}

# Starts a server writing its port to $workdir/$1.port; waits (bounded: 30 s) for the port.
start_server() {
  "${SERVER}" --listen=127.0.0.1:0 --port_file="${workdir}/$1.port" --backend=cpu --threads=2 \
    --shutdown_grace=5s >"${workdir}/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do
    [[ -s "${workdir}/$1.port" ]] && return 0
    sleep 0.1
  done
  fail "server $1 did not start"
}

start_server a
start_server b
readonly A="127.0.0.1:$(cat "${workdir}/a.port")"
readonly B="127.0.0.1:$(cat "${workdir}/b.port")"
spec=(--variant=gqa --d_model=64 --num_heads=8 --num_kv_heads=2)

session_of() {  # configure output line "session <id> ..."
  "${ATTNCTL}" --server="$1" configure "${spec[@]}" --seed="$2" | awk '$1 == "session" {print $2; exit}'
}
SA="$(session_of "${A}" 3)"
SB="$(session_of "${B}" 3)"
SC="$(session_of "${B}" 4)"
[[ -n "${SA}" && -n "${SB}" && -n "${SC}" ]] || fail "configure printed no session id"

"${ATTNCTL}" --server="${A}" forward --session="${SA}" --request=r --tokens=40 >/dev/null
out="$("${ATTNCTL}" --server="${A}" --json move --to="${B}" --session="${SA}" --request=r \
  --to_session="${SB}" --release_source)"
echo "${out}"
grep -q '"sequence_length":40' <<<"${out}" || fail "move did not report 40 tokens"
grep -q '"source_released":true' <<<"${out}" || fail "move did not release the source"

"${ATTNCTL}" --server="${B}" get --session="${SB}" | grep -Eq "request r +length 40" ||
  fail "B does not hold request r at length 40"
"${ATTNCTL}" --server="${B}" decode --session="${SB}" --request=r --steps=2 >/dev/null ||
  fail "the moved request does not decode on B"
if "${ATTNCTL}" --server="${A}" get --session="${SA}" | grep "request r " >/dev/null; then
  fail "A still holds request r after --release_source"
fi

# Another seed: another fingerprint.
"${ATTNCTL}" --server="${B}" forward --session="${SB}" --request=s --tokens=5 >/dev/null
status=0
"${ATTNCTL}" --server="${B}" move --to="${B}" --session="${SB}" --request=s --to_session="${SC}" \
  2>"${workdir}/refused.err" || status=$?
cat "${workdir}/refused.err"
[[ "${status}" -eq 1 ]] || fail "a move across fingerprints exited ${status}, expected 1"
grep -q "FAILED_PRECONDITION.*fingerprint" "${workdir}/refused.err" ||
  fail "a move across fingerprints did not name the fingerprint"

# No --to_session: the source's id is tried on B, which has no such session. The NOT_FOUND must
# name the target (B, the session tried there, the flag), not read as if the source were missing.
"${ATTNCTL}" --server="${A}" forward --session="${SA}" --request=t --tokens=3 >/dev/null
status=0
"${ATTNCTL}" --server="${A}" move --to="${B}" --session="${SA}" --request=t \
  2>"${workdir}/no_target.err" || status=$?
cat "${workdir}/no_target.err"
[[ "${status}" -eq 1 ]] || fail "a move to a missing target session exited ${status}, expected 1"
grep -q "NOT_FOUND: the target session '${SA}' does not exist on the target ${B} (no --to_session" \
  "${workdir}/no_target.err" || fail "a move to a missing target session did not name the target"

for pid in "${pids[@]}"; do
  kill -TERM "${pid}"
  status=0
  wait "${pid}" || status=$?
  [[ "${status}" -eq 0 ]] || fail "a server exited with status ${status} after SIGTERM"
done
pids=()
echo "attnctl_move_test: PASS"
