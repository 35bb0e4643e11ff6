#!/usr/bin/env bash
# ctest: one layer spec, one meaning. The same settings given as attnctl flags, as a JSON spec file
# (attnctl --spec_file, and the Python client reading the file) and as the Python client's
# LayerSpec configure sessions with equal fingerprints (ConfigureResponse.fingerprint), so a
# request moves between them; what is left out takes the same default everywhere (docs/api.md,
# "Layer spec JSON files"): RoPE "half" with theta 10000, causal, num_kv_heads = num_heads (mha) or
# 1 (mqa), head_dim = d_model / num_heads. A spec that differs in one setting (rope none) differs.
#
# Usage: tests/client/spec_defaults_test.sh BUILD_DIR PYTHON
set -euo pipefail

readonly BUILD="${1:?usage: $0 BUILD_DIR PYTHON}"
readonly PYTHON="${2:?usage: $0 BUILD_DIR PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly SERVER="${BUILD}/server/attnserve_server"
readonly ATTNCTL="${BUILD}/client/attnctl"

readonly TEST_NAME=spec_defaults_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}" "${ATTNCTL}"
require_python_modules "${PYTHON}" grpc grpc_tools numpy

server_start "${SERVER}" "${workdir}" || fail "the server did not start"
ctl() { "${ATTNCTL}" --server="${SERVER_ADDRESS}" "$@"; }

# name|attnctl flags|JSON spec file|Python LayerSpec keyword arguments (a Python dict)
readonly CASES=(
  'mha|--variant=mha --d_model=64 --num_heads=4|{"variant": "mha", "d_model": 64, "num_heads": 4}|dict(variant="mha", d_model=64, num_heads=4)'
  'mqa|--variant=mqa --d_model=64 --num_heads=4 --causal=false|{"variant": "mqa", "d_model": 64, "num_heads": 4, "causal": false}|dict(variant="mqa", d_model=64, num_heads=4, causal=False)'
  'gqa|--variant=gqa --d_model=128 --num_heads=8 --num_kv_heads=2 --rope_theta=500000 --window=16 --qkv_bias --o_bias --rotary_dim=8 --qk_norm=rms --qk_norm_eps=1e-5 --attn_logit_softcapping=30 --attention_sinks --softmax_scale=0.125|{"variant": "gqa", "d_model": 128, "num_heads": 8, "num_kv_heads": 2, "rope_theta": 500000, "sliding_window": 16, "qkv_bias": true, "o_bias": true, "rotary_dim": 8, "qk_norm": "rms", "qk_norm_eps": 1e-5, "attn_logit_softcapping": 30, "attention_sinks": true, "softmax_scale": 0.125}|dict(variant="gqa", d_model=128, num_heads=8, num_kv_heads=2, rope_theta=500000, sliding_window=16, qkv_bias=True, o_bias=True, rotary_dim=8, qk_norm="rms", qk_norm_eps=1e-5, attn_logit_softcapping=30, attention_sinks=True, softmax_scale=0.125)'
  'mla|--variant=mla --d_model=64 --num_heads=4 --kv_lora_rank=32 --qk_nope_head_dim=16 --qk_rope_head_dim=8 --v_head_dim=16|{"variant": "mla", "d_model": 64, "num_heads": 4, "mla": {"kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16}}|dict(variant="mla", d_model=64, num_heads=4, mla=MlaDims(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16))'
  'no_rope|--variant=mha --d_model=64 --num_heads=4 --rope=none|{"variant": "mha", "d_model": 64, "num_heads": 4, "rope": "none"}|dict(variant="mha", d_model=64, num_heads=4, rope="none")'
  # --spec=KEY=VALUE alone (fields with no flag of their own: alibi, alibi_bias_max, rope_scaling).
  'spec_settings|--spec=variant=gqa,d_model=128,num_heads=8,num_kv_heads=2,alibi=mpt,alibi_bias_max=4,qk_norm=rms_across_heads,rope_scaling.type=linear,rope_scaling.factor=2|{"variant": "gqa", "d_model": 128, "num_heads": 8, "num_kv_heads": 2, "alibi": "mpt", "alibi_bias_max": 4, "qk_norm": "rms_across_heads", "rope_scaling": {"type": "linear", "factor": 2}}|dict(variant="gqa", d_model=128, num_heads=8, num_kv_heads=2, alibi="mpt", alibi_bias_max=4.0, qk_norm="rms_across_heads", rope_scaling=RopeScaling(type="linear", factor=2.0))'
  # --spec over the flags.
  'spec_over_flags|--variant=gqa --d_model=128 --num_heads=8 --num_kv_heads=2 --window=16 --spec=sliding_window=32,attention_sinks=true|{"variant": "gqa", "d_model": 128, "num_heads": 8, "num_kv_heads": 2, "sliding_window": 32, "attention_sinks": true}|dict(variant="gqa", d_model=128, num_heads=8, num_kv_heads=2, sliding_window=32, attention_sinks=True)'
)

for entry in "${CASES[@]}"; do
  IFS='|' read -r name flags spec python_spec <<<"${entry}"
  printf '%s\n' "${spec}" >"${workdir}/${name}.json"
  # shellcheck disable=SC2086  # the flags are words
  ctl --json configure ${flags} --seed=3 >"${workdir}/${name}.flags.out" ||
    fail "${name}: attnctl configure ${flags} failed: $(cat "${workdir}/${name}.flags.out")"
  ctl --json configure --spec_file="${workdir}/${name}.json" --seed=3 >"${workdir}/${name}.file.out" ||
    fail "${name}: attnctl configure --spec_file failed: $(cat "${workdir}/${name}.file.out")"
  PYTHONPATH="${ROOT}/client/python" "${PYTHON}" - "${SERVER_ADDRESS}" "${workdir}" "${name}" \
    "${python_spec}" <<'PY' || fail "${name}: the fingerprints differ"
import base64, json, sys
from attnserve_client import AttnServeClient, LayerSpec, MlaDims, RopeScaling
address, work, name, python_spec = sys.argv[1:]
with AttnServeClient(address) as client:
    prints = {}
    for how in ("flags", "file"):
        prints[f"attnctl {how}"] = base64.b64decode(
            json.load(open(f"{work}/{name}.{how}.out"))["fingerprint"])
    prints["Python LayerSpec"] = client.configure(
        LayerSpec(**eval(python_spec)), seed=3).fingerprint
    prints["Python from JSON file"] = client.configure(
        LayerSpec.from_dict(json.load(open(f"{work}/{name}.json"))), seed=3).fingerprint
    prints["Python dict"] = client.configure(json.load(open(f"{work}/{name}.json")),
                                             seed=3).fingerprint
    assert len(set(prints.values())) == 1 and len(prints["attnctl flags"]) == 32, {
        k: v.hex()[:16] for k, v in prints.items()}
    open(f"{work}/{name}.fingerprint", "w").write(prints["attnctl flags"].hex())
print(f"{name}: attnctl flags, JSON file and Python LayerSpec agree")
PY
done
[[ "$(cat "${workdir}/mha.fingerprint")" != "$(cat "${workdir}/no_rope.fingerprint")" ]] ||
  fail "rope none and the default have the same fingerprint"
echo "spec_defaults_test: PASS"
