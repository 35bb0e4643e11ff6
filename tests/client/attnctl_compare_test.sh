#!/usr/bin/env bash
# ctest: `attnctl compare` and `attnctl convert` against the real server binary on 127.0.0.1.
#   - compare --json at small lengths: every variant present; KV bytes per token exactly by formula
#     (2 x kv_heads x head_dim x 4 for f32; MLA (latent + rope) x 4); KV bytes held = batch x whole
#     pages (windowed form: at most its window plus a page, per request); the windowed form equals
#     MHA exactly below its window and not past it; every converted form's error finite and > 0;
#     MQA < GQA-2 < GQA-4 < MHA in KV memory and parameters; latencies positive; --csv has a row per
#     variant and length; --plot writes a PNG.
#   - convert: `attnctl convert` of the seeded MHA layer to GQA-2, loaded by Configure from the
#     file, answers bit for bit what Configure with weights.convert_from {seed} answers; the file
#     configures alone (attnctl --checkpoint, Python configure(checkpoint=...)): the server reads
#     the spec from its __metadata__, same fingerprint; a contradicting spec is refused by name.
#   - errors: convert of an MLA spec or to 3 of 8 heads exits 2 naming the rule; Configure with
#     convert_from for an MLA spec, without MHA weights, or from a checkpoint of the wrong shape is
#     INVALID_ARGUMENT naming weights.convert_from.
#
# Usage: tests/client/attnctl_compare_test.sh BUILD_DIR PYTHON
set -euo pipefail

readonly TEST_NAME=attnctl_compare_test
# shellcheck source=../support/server_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/server_test.sh"
attnctl_test_setup "$@" grpc grpc_tools numpy matplotlib

mkdir -p "${workdir}/checkpoints"
server_start "${SERVER}" "${workdir}" --checkpoint_root="${workdir}/checkpoints" ||
  fail "the server did not start"
ctl() { timeout 240 "${ATTNCTL}" --server="${SERVER_ADDRESS}" "$@"; }

# ---- compare: small lengths, bounded time ----------------------------------------------------
ctl --json compare --lengths=8,16,40 --batch=2 --repeats=2 --decode_steps=2 >"${workdir}/run.json" ||
  fail "compare --json failed"
"${PYTHON}" - "${workdir}/run.json" <<'PY' || fail "compare --json numbers are inconsistent"
import json, math, sys
run = json.load(open(sys.argv[1]))
by = {v["label"]: v for v in run["variants"]}
assert list(by) == ["MHA", "GQA-4", "GQA-2", "MQA", "MLA-256", "SW-10"], list(by)
assert run["batch"] == 2 and run["lengths"] == [8, 16, 40]
f32 = 4
for label, kv_heads in (("MHA", 8), ("GQA-4", 4), ("GQA-2", 2), ("MQA", 1), ("SW-10", 8)):
    v = by[label]
    assert v["kv_bytes_per_token"] == 2 * kv_heads * 64 * f32, (label, v["kv_bytes_per_token"])
    assert v["spec"]["num_kv_heads"] == kv_heads
    # q, k, v, o projections of d_model 512 without biases.
    assert v["parameters"] == 512 * 512 * 2 + 2 * 512 * kv_heads * 64, (label, v["parameters"])
assert by["MLA-256"]["kv_bytes_per_token"] == (256 + 32) * f32
assert by["GQA-2"]["pooled_from_mha"] and not by["MHA"]["pooled_from_mha"]
page_tokens = 16  # the server's default page for mha/gqa/mqa
for label, v in by.items():
    page_bytes = v["page_bytes"]
    for at in v["lengths"]:
        L = at["length"]
        for key in ("prefill_ms", "decode_ms", "prefill_client_ms", "decode_client_ms"):
            assert 0 < at[key]["p50"] <= at[key]["p90"], (label, L, key, at[key])
        if label == "SW-10":
            held = min(L, 10)
            assert at["kv_bytes_formula"] == 2 * held * v["kv_bytes_per_token"]
            # Whole pages, less the ones the window evicted: at most window + a page per request.
            assert at["kv_bytes_formula"] <= at["kv_bytes_server"] <= 2 * (
                math.ceil(10 / page_tokens) + 1) * page_bytes, (L, at)
        elif label.startswith("MLA"):
            assert at["kv_bytes_formula"] == 2 * L * v["kv_bytes_per_token"]
            assert at["kv_bytes_server"] >= at["kv_bytes_formula"]
        else:
            assert at["kv_bytes_formula"] == 2 * L * v["kv_bytes_per_token"]
            assert at["kv_bytes_server"] == 2 * math.ceil(L / page_tokens) * page_bytes, (label, at)
for label in ("GQA-4", "GQA-2", "MQA"):
    for at in by[label]["lengths"]:
        assert math.isfinite(at["relative_l2"]) and math.isfinite(at["cosine"]), (label, at)
        assert 0 < at["relative_l2"] < 2 and -1 <= at["cosine"] < 1, (label, at)
# The window changes nothing until the prompt passes it: below 10 tokens the windowed session (its
# own session, same weights and inputs) answers MHA's outputs exactly; past it, not.
sw = {at["length"]: at for at in by["SW-10"]["lengths"]}
assert sw[8]["relative_l2"] == 0 and sw[8]["cosine"] == 1, sw[8]
assert sw[40]["relative_l2"] > 0
assert all(at["relative_l2"] is None for at in by["MLA-256"]["lengths"])
for i in range(2):
    mem = [by[k]["lengths"][i]["kv_bytes_server"] for k in ("MQA", "GQA-2", "GQA-4", "MHA")]
    assert mem[0] < mem[1] < mem[2] < mem[3], mem
params = [by[k]["parameters"] for k in ("MQA", "GQA-2", "GQA-4", "MHA")]
assert params[0] < params[1] < params[2] < params[3], params
print("compare json ok:", {k: by[k]["lengths"][-1]["relative_l2"] for k in by})
PY

ctl --csv compare --lengths=8 --batch=1 --repeats=1 --decode_steps=1 >"${workdir}/run.csv" ||
  fail "compare --csv failed"
[[ "$(head -1 "${workdir}/run.csv")" == variant,length,* ]] || fail "compare --csv: no header"
[[ "$(wc -l <"${workdir}/run.csv")" -eq 7 ]] || fail "compare --csv: expected 6 rows: $(cat "${workdir}/run.csv")"

ctl compare --lengths=8,16 --batch=1 --repeats=1 --decode_steps=1 --plot="${workdir}/run.png" \
  --plot_python="${PYTHON}" --plot_script="${ROOT}/client/python/plot_compare.py" \
  >"${workdir}/run.txt" || fail "compare --plot failed"
grep -q '| MQA | MHA seed 1, K/V heads mean-pooled |' "${workdir}/run.txt" ||
  fail "compare table lacks the MQA row: $(cat "${workdir}/run.txt")"
[[ "$(head -c 8 "${workdir}/run.png" | od -An -tx1 | tr -d ' \n')" == 89504e470d0a1a0a ]] ||
  fail "compare --plot did not write a PNG"

# ---- convert: the file loads and equals the server's own conversion, bit for bit ---------------
cat >"${workdir}/mha.json" <<'SPEC'
{"variant": "mha", "d_model": 64, "num_heads": 8, "num_kv_heads": 8, "head_dim": 16, "rope": "half", "qkv_bias": true}
SPEC
ctl convert --from="${workdir}/mha.json" --seed=9 --kv_heads=2 --layer=3 \
  --out="${workdir}/checkpoints/gqa2.safetensors" >/dev/null || fail "convert failed"
# What convert wrote configures alone: the server reads the spec from the file's __metadata__.
ctl --json configure --checkpoint=gqa2.safetensors --layer=3 >"${workdir}/alone.json" ||
  fail "convert: attnctl configure --checkpoint alone: $(cat "${workdir}/alone.json")"
PYTHONPATH="${ROOT}/client/python" "${PYTHON}" - "${SERVER_ADDRESS}" "${workdir}/alone.json" <<'PY' || fail "convert: outputs differ"
import base64, json, sys, numpy as np
import grpc
from attnserve_client import AttnServeClient, AttnServeError, LayerSpec, pb
spec = {"variant": "gqa", "d_model": 64, "num_heads": 8, "num_kv_heads": 2, "head_dim": 16,
        "rope": "half", "qkv_bias": True}
with AttnServeClient(sys.argv[1]) as client:
    stated = client.configure(spec, checkpoint="gqa2.safetensors", layer=3)
    from_file = stated.session_id
    # Without a spec (Python and attnctl): the same layer, the same fingerprint.
    alone = client.configure(checkpoint="gqa2.safetensors", layer=3)
    attnctl_alone = json.load(open(sys.argv[2]))
    assert alone.fingerprint == stated.fingerprint == base64.b64decode(
        attnctl_alone["fingerprint"]), (alone, stated, attnctl_alone)
    assert attnctl_alone["spec"]["num_kv_heads"] == 2 and attnctl_alone["spec"]["qkv_bias"], attnctl_alone
    client.release(alone.session_id)
    # A spec that contradicts the file's is refused naming the field.
    try:
        client.configure(dict(spec, head_dim=8), checkpoint="gqa2.safetensors", layer=3)
        raise SystemExit("a spec contradicting the file's __metadata__ was accepted")
    except AttnServeError as error:
        assert error.code == "INVALID_ARGUMENT" and "__metadata__" in error.message and \
            "head_dim" in error.message, error
    request = pb.ConfigureRequest(spec=LayerSpec.from_dict(spec).to_proto(),
                                  weights=pb.WeightSource(convert_from=pb.ConvertFrom(seed=9)))
    by_server = client.stub.Configure(request).session_id
    x = np.random.default_rng(4).standard_normal((11, 64), dtype=np.float32)
    a = client.forward(from_file, {"r": x}).outputs["r"]
    b = client.forward(by_server, {"r": x}).outputs["r"]
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), np.abs(a - b).max()
    # MLA has no K/V heads to pool: refused by name.
    mla = pb.ConfigureRequest(spec=pb.LayerSpec(
        variant=pb.VARIANT_MLA, d_model=64, num_heads=4, causal=True,
        mla=pb.MlaDims(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)),
        weights=pb.WeightSource(convert_from=pb.ConvertFrom(seed=1)))
    try:
        client.stub.Configure(mla)
        raise SystemExit("convert_from of an MLA spec was accepted")
    except grpc.RpcError as error:
        assert error.code().name == "INVALID_ARGUMENT", error
        assert "weights.convert_from" in error.details() and "is mla" in error.details(), error.details()
    # A ConvertFrom without MHA weights, and MHA weights of the wrong shape (the GQA-2 file read
    # as the MHA layer), are INVALID_ARGUMENT naming the field.
    def refused(weights, *needles):
        try:
            client.stub.Configure(pb.ConfigureRequest(spec=LayerSpec.from_dict(spec).to_proto(),
                                                      weights=weights))
        except grpc.RpcError as error:
            assert error.code().name == "INVALID_ARGUMENT", (error.code(), error.details())
            for needle in needles:
                assert needle in error.details(), (needle, error.details())
            return
        raise SystemExit(f"accepted: {weights}")
    refused(pb.WeightSource(convert_from=pb.ConvertFrom()), "weights.convert_from",
            "one of seed, checkpoint or inline_weights")
    refused(pb.WeightSource(convert_from=pb.ConvertFrom(checkpoint=pb.CheckpointWeights(
        path="gqa2.safetensors", layer_index=3))), "weights.convert_from (MHA)", "k_proj.weight")
print("convert ok")
PY

# expect_usage attnctl-args...: exits 2 (bad flags or input); its stderr is left in err.out.
expect_usage() {
  local status=0
  ctl "$@" >"${workdir}/err.out" 2>&1 || status=$?
  [[ "${status}" -eq 2 ]] || fail "attnctl $* exited ${status}, expected 2: $(cat "${workdir}/err.out")"
}
expect_usage convert --from="${workdir}/mha.json" --kv_heads=3 --out="${workdir}/x.safetensors"
grep -q "num_kv_heads = 3" "${workdir}/err.out" || fail "convert to 3 heads: $(cat "${workdir}/err.out")"
cat >"${workdir}/mla.json" <<'SPEC'
{"variant": "mla", "d_model": 64, "num_heads": 4, "rope": "interleaved", "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}}
SPEC
expect_usage convert --from="${workdir}/mla.json" --kv_heads=1 --out="${workdir}/x.safetensors"
grep -q "is mla" "${workdir}/err.out" || fail "convert of MLA: $(cat "${workdir}/err.out")"
[[ ! -e "${workdir}/x.safetensors" ]] || fail "a refused convert wrote a file"
echo "attnctl_compare_test: OK"
