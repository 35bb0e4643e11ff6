#!/usr/bin/env bash
# ctest (label server): attnbench against the real server binary on 127.0.0.1.
#   - 4 concurrent DecodeStream streams x 20 steps x 2 variants (mha, mla) finish, report no
#     errors, exit 0, and the --json output parses with every stream's steps counted;
#   - the context is held steady: a 2 s cell of 4 streams at --context=64 reports the contexts its
#     steps ran at, mean within 25% of 64 and max <= 64 + --steps_per_request, with re-prefills;
#   - --spec_file (a JSON layer spec) and --checkpoint/--layer (a safetensors file under the server's
#     --checkpoint_root, its spec in the metadata) run that layer: the row's spec is the file's;
#   - --mode=open_loop: 20 Poisson arrivals at 50/s, each a 32-token prefill and 8 decode steps,
#     all complete; TTFT, ITL and E2E percentiles are ordered and the throughput is reported;
#   - --sweep over concurrency (closed loop) and rate (open loop) with --out_dir writes sweep.csv
#     (one line per swept value) and sweep.json, and with --plot sweep.png (PYTHON with matplotlib);
#   - the server's batch sizes are read (its /metrics attnserve_batch_size histogram, or its
#     GetSession counters): a mean between 1 and 4 per variant;
#   - against an address where nothing listens it fails (exit 1) within its bounded deadlines.
#
# Usage: tests/client/attnbench_test.sh BUILD_DIR [PYTHON]   (BUILD_DIR holds
# server/attnserve_server and client/attnbench; PYTHON defaults to python3, only the standard
# library is used)
set -euo pipefail

readonly BUILD="${1:?usage: $0 BUILD_DIR [PYTHON]}"
PYTHON="${2:-python3}"
[[ -x "${PYTHON}" ]] || PYTHON=python3
readonly SERVER="${BUILD}/server/attnserve_server"
readonly ATTNBENCH="${BUILD}/client/attnbench"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

readonly TEST_NAME=attnbench_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}" "${ATTNBENCH}"
show_failure_context() {
  [[ -s "${workdir}/bench.err" ]] || return 0
  echo "--- bench.err ---" >&2
  tail -n 40 "${workdir}/bench.err" >&2
}

mkdir -p "${workdir}/checkpoints"
server_start "${SERVER}" "${workdir}" --with_metrics --checkpoint_root="${workdir}/checkpoints" ||
  fail "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"
readonly METRICS="${SERVER_METRICS}"

status=0
timeout 240 "${ATTNBENCH}" --server="${ADDRESS}" --variants=mha,mla --concurrency=4 --steps=20 \
  --context=64 --step_timeout=30s --timeout_s=60 --metrics="${METRICS}" --json >"${workdir}/bench.json" \
  2>"${workdir}/bench.err" || status=$?
[[ "${status}" -eq 0 ]] || fail "attnbench exited ${status}"

"${PYTHON}" - "${workdir}/bench.json" <<'PY' || fail "the JSON output does not hold what it should"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["errors"] == 0, d["errors"]
rows = d["results"]
assert [r["variant"] for r in rows] == ["mha", "mla"], [r["variant"] for r in rows]
for r in rows:
    assert r["concurrency"] == 4 and r["context"] == 64, r
    assert r["errors"] == 0 and not r["error_messages"], r
    assert r["steps"] == 80, r["steps"]              # 4 streams x 20 steps, all answered
    assert r["tokens_per_s"] > 0 and r["seconds"] > 0, r
    lat = r["step_latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"], lat
    assert r["server_ms_per_step"]["compute"] > 0, r["server_ms_per_step"]
    b = r["batch_size"]
    assert b["available"] and b["mean"] is not None, b
    assert 1 <= b["mean"] <= 4 + 1e-9, b             # never more than the 4 streams
print("attnbench_test: %s" % ", ".join(
    "%s %.0f tok/s p50 %.3f ms batch %s" % (r["label"], r["tokens_per_s"], r["step_latency_ms"]["p50"],
                                          r["batch_size"]["mean"]) for r in rows))
PY

# A cell holds its context: requests are replaced every --steps_per_request steps, so however long
# the cell runs the steps stay near --context (before, a 2 s cell grew 4 streams to ~1000 tokens).
status=0
timeout 120 "${ATTNBENCH}" --server="${ADDRESS}" --variants=gqa --concurrency=4 --duration=2s \
  --context=64 --steps_per_request=16 --d_model=128 --num_heads=4 --step_timeout=30s \
  --timeout_s=60 --json >"${workdir}/steady.json" 2>"${workdir}/bench.err" || status=$?
[[ "${status}" -eq 0 ]] || fail "attnbench (steady context) exited ${status}"
"${PYTHON}" - "${workdir}/steady.json" <<'PY' || fail "the context was not held steady"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["errors"] == 0, d
(r,) = d["results"]
assert r["context"] == 64 and r["steps_per_request"] == 16 and r["prefill_tokens"] == 56, r
assert abs(r["mean_context"] - 64) <= 0.25 * 64, r["mean_context"]
assert 57 <= r["max_context"] <= 64 + 16, r["max_context"]
assert r["steps"] > 4 * 16, r["steps"]            # long enough that every stream re-prefilled
assert r["reprefill"]["count"] >= 4 and r["reprefill"]["forward_ms"]["p50"] > 0, r["reprefill"]
assert r["tokens_per_s"] >= r["wall_tokens_per_s"] > 0, r
print("attnbench_test: steady context: mean %.1f max %d over %d steps, %d re-prefills"
      % (r["mean_context"], r["max_context"], r["steps"], r["reprefill"]["count"]))
PY

# A layer from a spec file, and from a checkpoint (spec read by the server, or stated as well).
"${PYTHON}" - "${workdir}" <<'PY' || fail "could not write the spec file and checkpoint"
import array, json, random, struct, sys
work = sys.argv[1]
spec = {"variant": "gqa", "d_model": 64, "num_heads": 4, "num_kv_heads": 2, "rope_theta": 500000.0}
open(f"{work}/gqa64.json", "w").write(json.dumps(spec))
rng = random.Random(5)
shapes = {"q_proj.weight": (64, 64), "k_proj.weight": (32, 64), "v_proj.weight": (32, 64),
          "o_proj.weight": (64, 64)}
header, data = {"__metadata__": {"attnserve_spec": json.dumps(spec)}}, b""
for name, (rows, cols) in shapes.items():
    values = array.array("f", (rng.gauss(0, 0.1) for _ in range(rows * cols))).tobytes()
    header[f"model.layers.3.self_attn.{name}"] = {
        "dtype": "F32", "shape": [rows, cols], "data_offsets": [len(data), len(data) + len(values)]}
    data += values
text = json.dumps(header).encode()
with open(f"{work}/checkpoints/layer.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PY
for source in spec ckpt both; do
  case "${source}" in
    spec) flags=(--spec_file="${workdir}/gqa64.json") ;;
    ckpt) flags=(--checkpoint=layer.safetensors --layer=3) ;;
    both) flags=(--spec_file="${workdir}/gqa64.json" --checkpoint=layer.safetensors --layer=3) ;;
  esac
  status=0
  timeout 120 "${ATTNBENCH}" --server="${ADDRESS}" "${flags[@]}" --concurrency=2 --steps=10 \
    --context=32 --timeout_s=60 --json >"${workdir}/${source}.json" 2>"${workdir}/bench.err" ||
    status=$?
  [[ "${status}" -eq 0 ]] || fail "attnbench with ${flags[*]} exited ${status}"
  "${PYTHON}" - "${workdir}/${source}.json" "${source}" <<'PY' || fail "attnbench ${source}: wrong layer"
import json, sys
d, source = json.load(open(sys.argv[1])), sys.argv[2]
assert d["errors"] == 0, d
(r,) = d["results"]
assert r["variant"] == "gqa" and r["steps"] == 20, r
assert "d_model=64" in r["spec"] and "kv_heads=2" in r["spec"], r["spec"]
assert r["label"] == {"spec": "gqa64", "ckpt": "layer/L3", "both": "gqa64"}[source], r["label"]
assert d["workload"]["checkpoint"] == ("" if source == "spec" else "layer.safetensors"), d["workload"]
print("attnbench_test: %s: %s %s" % (source, r["label"], r["spec"]))
PY
done

# Open loop: requests arrive at a rate, each prefilled then decoded over its own stream.
status=0
timeout 120 "${ATTNBENCH}" --server="${ADDRESS}" --mode=open_loop --rate=50 --num_requests=20 \
  --prompt_tokens=32 --steps_per_request=8 --variants=mqa --d_model=128 --num_heads=4 \
  --timeout_s=60 --json >"${workdir}/open.json" 2>"${workdir}/bench.err" || status=$?
[[ "${status}" -eq 0 ]] || fail "attnbench --mode=open_loop exited ${status}"
"${PYTHON}" - "${workdir}/open.json" <<'PY' || fail "the open-loop output does not hold what it should"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["errors"] == 0 and d["workload"]["mode"] == "open_loop", d
(r,) = d["results"]
assert r["mode"] == "open_loop" and r["rate"] == 50 and r["variant"] == "mqa", r
assert r["requests_sent"] == 20 and r["requests_completed"] == 20, r
assert r["tokens"] == 20 * 8 and r["decode_steps"] == 8 and r["prompt_tokens"] == 32, r
assert abs(r["mean_context"] - (32 + 4.5)) < 1e-9, r["mean_context"]
assert 20 <= r["achieved_rate"] <= 125, r["achieved_rate"]  # 19 Poisson gaps at 50/s
assert r["request_throughput"] > 0 and r["tokens_per_s"] > 0 and r["seconds"] > 0, r
for key in ("ttft_ms", "itl_ms", "e2e_ms"):
    l = r[key]
    assert 0 < l["p50"] <= l["p90"] <= l["p99"] <= l["max"], (key, l)
assert r["e2e_ms"]["p50"] >= r["ttft_ms"]["p50"], r
print("attnbench_test: open loop: %.1f req/s, TTFT p50 %.2f ms, ITL p50/p99 %.3f/%.3f ms"
      % (r["request_throughput"], r["ttft_ms"]["p50"], r["itl_ms"]["p50"], r["itl_ms"]["p99"]))
PY

# Sweeps: CSV and JSON in --out_dir, a PNG with --plot.
for mode in closed_loop open_loop; do
  case "${mode}" in
    closed_loop) flags=(--sweep=1,3 --steps=12 --context=32 --steps_per_request=8) ;;
    open_loop) flags=(--mode=open_loop --sweep=20,40 --num_requests=8 --prompt_tokens=32
                      --steps_per_request=4) ;;
  esac
  status=0
  timeout 120 "${ATTNBENCH}" --server="${ADDRESS}" "${flags[@]}" --variants=gqa --d_model=128 \
    --num_heads=4 --timeout_s=60 --out_dir="${workdir}/sweep-${mode}" --plot \
    --plot_python="${PYTHON}" --plot_script="${ROOT}/client/attnbench/plot_sweep.py" \
    >"${workdir}/sweep.out" 2>"${workdir}/bench.err" || status=$?
  [[ "${status}" -eq 0 ]] || fail "attnbench ${flags[*]} --out_dir --plot exited ${status}"
  "${PYTHON}" - "${workdir}/sweep-${mode}" "${mode}" <<'PY' || fail "the ${mode} sweep's files are wrong"
import csv, json, sys
out, mode = sys.argv[1:]
d = json.load(open(f"{out}/sweep.json"))
rows = list(csv.DictReader(open(f"{out}/sweep.csv")))
assert d["errors"] == 0 and d["workload"]["mode"] == mode, d["workload"]
axis = "concurrency" if mode == "closed_loop" else "rate"
assert [float(r[axis]) for r in rows] == ([1, 3] if mode == "closed_loop" else [20, 40]), rows
assert [float(r[axis]) for r in d["results"]] == [float(r[axis]) for r in rows]
for r in rows:
    assert r["mode"] == mode and r["variant"] == "gqa" and r["errors"] == "0", r
    assert float(r["tokens_per_s"]) > 0 and 0 < float(r["itl_p50_ms"]) <= float(r["itl_p99_ms"]), r
    if mode == "open_loop":
        assert float(r["ttft_p50_ms"]) > 0 and float(r["request_throughput"]) > 0, r
    else:
        assert abs(float(r["mean_context"]) - 32) <= 8 and int(r["max_context"]) <= 40, r
with open(f"{out}/sweep.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", "sweep.png is not a PNG"
print("attnbench_test: %s sweep: %d rows, CSV, JSON and PNG" % (mode, len(rows)))
PY
done

# Nothing listens on the server's port once it is gone: attnbench fails, bounded, with exit 1.
server_kill
status=0
timeout 60 "${ATTNBENCH}" --server="${ADDRESS}" --variants=mha --concurrency=2 --steps=5 \
  --timeout_s=3 >"${workdir}/dead.out" 2>&1 || status=$?
[[ "${status}" -eq 1 ]] || fail "attnbench against a dead server exited ${status}, expected 1: $(cat "${workdir}/dead.out")"
grep -q UNAVAILABLE "${workdir}/dead.out" || fail "no UNAVAILABLE in: $(cat "${workdir}/dead.out")"
echo "attnbench_test: OK"
