#!/usr/bin/env bash
# ctest: attnctl against the real server binary on 127.0.0.1, and deploy/run_demo.sh.
#   - health, info, configure (flags, --spec_file, --stack and --per_layer with forward/decode
#     --layer), list, get, release, demo --json;
#   - forward with a .npy input (float32 and float16) and --output: the output equals, bit for bit,
#     what the Python client gets for the same input on another request of the same session;
#   - decode: unary and --stream on two requests fed the same seeded inputs give the same outputs;
#     --position continues requests prefilled at positions 5000+;
#   - fork (attnctl and the Python client): forks decode exactly as an unforked twin; refusals;
#   - errors: the exit code (1 for an RPC error, 2 for bad flags) and the status code name;
#   - deploy/run_demo.sh runs the demo against its own server and stops it.
#
# Usage: tests/client/attnctl_test.sh BUILD_DIR PYTHON   (BUILD_DIR holds server/attnserve_server
# and client/attnctl)
set -euo pipefail

readonly TEST_NAME=attnctl_test
# shellcheck source=../support/server_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_test.sh"
attnctl_test_setup "$@" grpc grpc_tools numpy

server_start "${SERVER}" "${workdir}" || fail "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"
ctl() { "${ATTNCTL}" --server="${ADDRESS}" "$@"; }
json() { "${PYTHON}" -c "import json, sys; d = json.load(sys.stdin); print($1)"; }

# expect_exit CODE STATUS_NAME_OR_EMPTY -- attnctl args...
expect_exit() {
  local want="$1" name="$2" status=0
  shift 3
  ctl "$@" >"${workdir}/err.out" 2>&1 || status=$?
  [[ "${status}" -eq "${want}" ]] || fail "attnctl $* exited ${status}, expected ${want}: $(cat "${workdir}/err.out")"
  [[ -z "${name}" ]] || grep -q -e "${name}" "${workdir}/err.out" || fail "attnctl $* did not print ${name}: $(cat "${workdir}/err.out")"
}

[[ "$(ctl health)" == SERVING ]] || fail "health is not SERVING"
[[ "$(ctl --json info | json 'd["backend"]')" == cpu ]] || fail "info: backend is not cpu"

cat >"${workdir}/spec.json" <<'SPEC'
{"variant": "gqa", "d_model": 128, "num_heads": 4, "num_kv_heads": 2, "head_dim": 32, "rope": "half"}
SPEC
session="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=5 --label=attnctl_test |
           json 'd["session_id"]')"
[[ "${#session}" -eq 32 ]] || fail "configure: session id '${session}' is not 32 hex digits"

# forward: .npy in and out, compared with the Python client on another request.
"${PYTHON}" - "${workdir}" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(1)
np.save(f"{sys.argv[1]}/x32.npy", rng.standard_normal((9, 128), dtype=np.float32))
np.save(f"{sys.argv[1]}/x16.npy", rng.standard_normal((4, 128)).astype(np.float16))
PY
ctl forward --session="${session}" --request=a --input="${workdir}/x32.npy" --output="${workdir}/a.npy" >/dev/null
ctl forward --session="${session}" --request=h --input="${workdir}/x16.npy" --output="${workdir}/h.npy" >/dev/null
PYTHONPATH="${ROOT}/client/python" "${PYTHON}" - "${ADDRESS}" "${session}" "${workdir}" <<'PY'
import sys, numpy as np
from attnserve_client import AttnServeClient
address, session, work = sys.argv[1:]
with AttnServeClient(address) as client:
    for rid, name in (("p32", "x32"), ("p16", "x16")):
        x = np.load(f"{work}/{name}.npy")
        out = client.forward(session, {rid: x}).outputs[rid]
        ctl = np.load(f"{work}/{'a' if name == 'x32' else 'h'}.npy")
        assert out.dtype == x.dtype == ctl.dtype and out.shape == ctl.shape == x.shape, (out.dtype, ctl.dtype, out.shape, ctl.shape)
        assert np.array_equal(out.view(np.uint8), ctl.view(np.uint8)), f"{name}: attnctl and Python outputs differ"
print("forward: attnctl (.npy) and Python client agree bit for bit")
PY

# decode: unary vs stream, same seeded inputs on two requests with the same prompt.
ctl forward --session="${session}" --request=u --tokens=20 --seed=3 >/dev/null
ctl forward --session="${session}" --request=s --tokens=20 --seed=3 >/dev/null
unary="$(ctl --json decode --session="${session}" --request=u --steps=3 --seed=9 |
         json '[r["rms"] for s in d["steps"] for r in s["results"]]')"
stream="$(ctl --json decode --session="${session}" --request=s --steps=3 --seed=9 --stream |
          json '[r["rms"] for s in d["steps"] for r in s["results"]]')"
[[ "${unary}" == "${stream}" ]] || fail "decode: unary ${unary} != stream ${stream}"
[[ "$(ctl --json get --session="${session}" | json 'len(d["session"]["requests"])')" == 6 ]] ||
  fail "get: expected 6 requests"
[[ "$(ctl --json list | json 'len(d["sessions"])')" -ge 1 ]] || fail "list: no sessions"

# decode --position: requests prefilled at positions 5000+ continue there. Without it the step
# takes the request's length (3) as its position, before the prefill's: INVALID_ARGUMENT. The same
# seeded step at 5003 and at 5030 differs: the position reaches the server.
for far in far1 far2; do
  ctl forward --session="${session}" --request="${far}" --tokens=3 --seed=4 \
    --positions=5000,5001,5002 >/dev/null
done
expect_exit 1 INVALID_ARGUMENT -- decode --session="${session}" --request=far1
at5003="$(ctl --json decode --session="${session}" --request=far1 --steps=2 --seed=9 --position=5003 |
          json '[(r["sequence_length"], r["rms"]) for s in d["steps"] for r in s["results"]]')"
at5030="$(ctl --json decode --session="${session}" --request=far2 --steps=2 --seed=9 --position=5030 --stream |
          json '[(r["sequence_length"], r["rms"]) for s in d["steps"] for r in s["results"]]')"
[[ "${at5003}" == "[(4, "*"), (5, "* ]] || fail "decode --position: ${at5003}"
[[ "${at5003}" != "${at5030}" ]] || fail "decode --position=5003 and 5030 answered the same"
expect_exit 2 "position" -- decode --session="${session}" --request=far1 --position=-2
ctl release --session="${session}" --request=far1 >/dev/null
ctl release --session="${session}" --request=far2 >/dev/null

# fork: u and s hold the same 23 tokens (same prompt, same decode inputs). Forks of u (attnctl and
# the Python client) continue exactly as s does: the same seeded step gives the same output.
ctl fork --session="${session}" --request=u --forks=f1,f2 | grep "forked f2 from u: 23 tokens" >/dev/null ||
  fail "fork: attnctl did not report f2 with 23 tokens"
PYTHONPATH="${ROOT}/client/python" "${PYTHON}" - "${ADDRESS}" "${session}" <<'PY' || fail "fork: the Python client"
import sys
from attnserve_client import AttnServeClient
address, session = sys.argv[1:]
with AttnServeClient(address) as client:
    assert client.fork(session, "u", ["f3"]) == {"f3": 23}
PY
twin="$(ctl --json decode --session="${session}" --request=s --steps=2 --seed=11 |
        json '[r["rms"] for s in d["steps"] for r in s["results"]]')"
for fork in f1 f2 f3; do
  got="$(ctl --json decode --session="${session}" --request="${fork}" --steps=2 --seed=11 |
         json '[r["rms"] for s in d["steps"] for r in s["results"]]')"
  [[ "${got}" == "${twin}" ]] || fail "fork: ${fork} decodes ${got}, its twin s ${twin}"
done
# A taken id: ALREADY_EXISTS naming it, as ImportRequest answers (was INVALID_ARGUMENT).
expect_exit 1 "ALREADY_EXISTS: new_request_ids\[0\]: request 'f1' already exists" -- \
  fork --session="${session}" --request=u --forks=f1
expect_exit 1 NOT_FOUND -- fork --session="${session}" --request=nope --forks=g1
expect_exit 2 "" -- fork --session="${session}" --request=u

# errors
expect_exit 1 NOT_FOUND -- forward --session=0123 --request=a
expect_exit 1 NOT_FOUND -- decode --session="${session}" --request=nope
# An unknown session is said not to exist (was "GetSession failed", a call the user never made).
expect_exit 1 "decode failed: NOT_FOUND: session '0123' does not exist on ${ADDRESS}" -- \
  decode --session=0123 --request=a
expect_exit 1 "forward failed: NOT_FOUND: session '0123' does not exist" -- \
  forward --session=0123 --request=a
grep -q "GetSession" "${workdir}/err.out" && fail "an unknown session is reported as GetSession failing"
# A negative --tokens is refused by name (it used to send the default 16 rows).
expect_exit 2 "--tokens = -5: must be >= 1" -- forward --session="${session}" --request=neg --tokens=-5
expect_exit 2 "--tokens = -1" -- demo --tokens=-1
[[ "$(ctl --json get --session="${session}" | json '[r["request_id"] for r in d["session"]["requests"]].count("neg")')" == 0 ]] ||
  fail "forward --tokens=-5 sent a request"
# --help offers the KV dtypes the CPU backend serves (f16 only on CUDA), and says which is which.
kv_help="$("${ATTNCTL}" --help 2>&1 | grep -A3 -e "--kv_dtype" | tr -s ' \n' ' ')" || true
[[ "${kv_help}" == *"f32 or bf16 (the CPU backend)"* ]] || fail "--help for --kv_dtype: ${kv_help}"
expect_exit 1 INVALID_ARGUMENT -- forward --session="${session}" --request=a --tokens=2 --positions=1,0
expect_exit 2 "" -- forward --session="${session}" --request=a --input="${workdir}/missing.npy"
expect_exit 2 "num_kv_heads" -- configure --variant=gqa --d_model=128 --num_heads=4
expect_exit 2 "" -- no_such_command

# --kv_quant: 8-bit KV pages (docs/kv_quantization.md); page bytes count the codes and the four
# float32 scales (K and V of 2 KV heads): 2 * 2 * 32 * 16 + 16 = 2064, 129 bytes per token.
quant="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=5 --kv_quant=int8)"
[[ "$(json 'd["cost"]["page_bytes"]' <<<"${quant}")" == 2064 ]] || fail "--kv_quant=int8: ${quant}"
[[ "$(json 'd["cost"]["kv_bytes_per_token"]' <<<"${quant}")" == 129 ]] || fail "--kv_quant: ${quant}"
quant_session="$(json 'd["session_id"]' <<<"${quant}")"
[[ "$(ctl --json get --session="${quant_session}" | json 'd["session"]["kv_cache_quantization"]')" \
   == KV_CACHE_QUANTIZATION_INT8 ]] || fail "get: kv_cache_quantization is not INT8"
ctl release --session="${quant_session}" >/dev/null
expect_exit 2 "kv_quant" -- configure --spec_file="${workdir}/spec.json" --kv_quant=int4

# --stack: a hybrid stack (docs/hybrid_stacks.md). 40 tokens in pages of 16 (2 KV heads x 32, f32:
# 8192-byte pages): the global layer holds 3 pages, each window-16 layer the 2 its next token sees.
stack="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=5 --stack=sw:16x2,global)"
[[ "$(json 'len(d["stack"])' <<<"${stack}")" == 3 ]] || fail "--stack: ${stack}"
stack_session="$(json 'd["session_id"]' <<<"${stack}")"
ctl forward --session="${stack_session}" --request=s --tokens=40 >/dev/null
kinds="$(ctl --json get --session="${stack_session}" |
         json '" ".join("%s=%s:%s" % (k["kind"], k["layers"], k["kv_bytes"]) for k in d["session"]["kv_by_layer_kind"])')"
[[ "${kinds}" == "sliding_window:16=2:32768 global=1:24576" ]] || fail "get: KV by kind '${kinds}'"
ctl get --session="${stack_session}" | grep "stack of 3 layers" >/dev/null || fail "get: no stack line"
ctl release --session="${stack_session}" >/dev/null
# The Python client's stack= builds the same stack (layer i from seed + i): the same output.
PYTHONPATH="${ROOT}/client/python" "${PYTHON}" - "${ADDRESS}" "${workdir}" <<'PY' || fail "Python stack="
import json, sys
from attnserve_client import AttnServeClient
spec = json.load(open(f"{sys.argv[2]}/spec.json"))
with AttnServeClient(sys.argv[1]) as client:
    windowed = dict(spec, sliding_window=16)
    result = client.configure(None, seed=5, stack=[windowed, windowed, spec])
    info = client.get_session(result.session_id)
    assert info.num_layers == 3, info
    assert [(k.kind, k.layers) for k in info.kv_by_layer_kind] == [("sliding_window:16", 2),
                                                                  ("global", 1)], info
    try:
        client.configure(spec, seed=5, stack=[spec])
        raise SystemExit("spec and stack together were accepted")
    except ValueError:
        pass
    client.release(result.session_id)
PY
expect_exit 2 "is not a layer kind" -- configure --spec_file="${workdir}/spec.json" --stack=sw:0

# --per_layer: the same stack as a model session; forward and decode run the layer --layer names.
model="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=5 --stack=sw:16x2,global \
         --per_layer)"
model_session="$(json 'd["session_id"]' <<<"${model}")"
[[ "$(ctl --json get --session="${model_session}" | json 'd["session"]["per_layer"]')" == True ]] ||
  fail "--per_layer: not a model session"
for k in 0 1 2; do
  ctl forward --session="${model_session}" --request=m --tokens=40 --seed=3 --layer="${k}" \
      --output="${workdir}/model_layer${k}.npy" >/dev/null || fail "forward --layer=${k}"
done
# Layer 2 (global, weights from seed 5 + 2) computes what one layer of that seed computes.
single="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=7 | json 'd["session_id"]')"
ctl forward --session="${single}" --request=m --tokens=40 --seed=3 \
    --output="${workdir}/single_layer.npy" >/dev/null
cmp -s "${workdir}/model_layer2.npy" "${workdir}/single_layer.npy" ||
  fail "forward --layer=2 differs from one layer of seed 7"
expect_exit 1 "not a model session" -- forward --session="${single}" --request=m2 --layer=1
ctl release --session="${single}" >/dev/null
# A step runs layers 0, 1, 2 in order: layer 2 first is refused, and get names the next layer.
expect_exit 1 "FAILED_PRECONDITION.*out of order" -- decode --session="${model_session}" --request=m --layer=2
ctl decode --session="${model_session}" --request=m --layer=0 >/dev/null || fail "decode --layer=0"
ctl get --session="${model_session}" | grep -q "next layer 1" || fail "get: no next layer"
for k in 1 2; do
  ctl decode --session="${model_session}" --request=m --layer="${k}" >/dev/null ||
    fail "decode --layer=${k}"
done
[[ "$(ctl --json get --session="${model_session}" | json 'd["session"]["requests"][0]["sequence_length"]')" == 41 ]] ||
  fail "model session: length after one decode step is not 41"
expect_exit 1 INVALID_ARGUMENT -- forward --session="${model_session}" --request=m3 --layer=3
# move: into a second model session of the same stack and seed (same fingerprint), every layer at
# once; refused mid-step, naming the layer next.
model2="$(ctl --json configure --spec_file="${workdir}/spec.json" --seed=5 --stack=sw:16x2,global \
          --per_layer | json 'd["session_id"]')"
ctl decode --session="${model_session}" --request=m --layer=0 >/dev/null || fail "decode --layer=0"
expect_exit 1 "FAILED_PRECONDITION.*mid-step.*runs layer 1 next" -- \
  move --session="${model_session}" --request=m --to="${ADDRESS}" --to_session="${model2}"
for k in 1 2; do
  ctl decode --session="${model_session}" --request=m --layer="${k}" >/dev/null ||
    fail "decode --layer=${k}"
done
ctl move --session="${model_session}" --request=m --to="${ADDRESS}" --to_session="${model2}" \
    >/dev/null || fail "move of a model session's request"
[[ "$(ctl --json get --session="${model2}" | json 'd["session"]["requests"][0]["sequence_length"]')" == 42 ]] ||
  fail "move: the moved request's length is not 42"
for k in 0 1 2; do
  ctl decode --session="${model2}" --request=m --layer="${k}" >/dev/null ||
    fail "decode --layer=${k} after the move"
done
ctl release --session="${model2}" >/dev/null
ctl release --session="${model_session}" >/dev/null
expect_exit 2 "--per_layer needs a stack" -- configure --spec_file="${workdir}/spec.json" --per_layer

ctl release --session="${session}" --request=a >/dev/null
ctl release --session="${session}" >/dev/null
expect_exit 1 NOT_FOUND -- get --session="${session}"
[[ "$(ctl --json info | json 'd["kv_pool_used_bytes"]')" == 0 ]] || fail "KV pool not empty after release"

variants="$(ctl --json demo --tokens=16 --steps=2 --batch=2 | json '" ".join(v["variant"] for v in d["variants"])')"
[[ "${variants}" == "MHA GQA-4 MQA MLA-256" ]] || fail "demo: variants '${variants}'"
# A variant the server refuses is reported and the demo goes on with the next (here every one is
# refused: the CPU backend keeps no f16 KV cache); the exit status is 1, and the server is intact.
if demo_out="$(ctl --json demo --tokens=8 --steps=1 --batch=1 --kv_dtype=f16 2>/dev/null)"; then
  fail "demo with an f16 KV cache on the CPU backend exited 0"
fi
failed="$(printf '%s' "${demo_out}" | json '" ".join(v["variant"] for v in d["failed"])')"
[[ "${failed}" == "MHA GQA-4 MQA MLA-256" ]] || fail "demo f16: failed variants '${failed}'"
[[ "$(ctl --json info | json 'd["sessions"]')" == 0 ]] || fail "demo f16 left sessions behind"

status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the server exited with status ${status} after SIGTERM"

# Without the SmolLM2 chat (tests/model's run_demo_chat_test runs it).
ATTNSERVE_DEMO_CHAT=0 ATTNSERVE_BUILD_DIR="${BUILD}" \
  "${ROOT}/deploy/run_demo.sh" --tokens=16 --steps=2 >"${workdir}/demo.out" 2>&1 ||
  { cat "${workdir}/demo.out"; fail "deploy/run_demo.sh failed"; }
grep -q "^MLA-256 " "${workdir}/demo.out" || { cat "${workdir}/demo.out"; fail "run_demo.sh printed no MLA row"; }
grep -q "server stopped (exit status 0)" "${workdir}/demo.out" || fail "run_demo.sh did not stop its server cleanly"
echo "attnctl_test: PASS"
