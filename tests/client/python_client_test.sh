#!/usr/bin/env bash
# ctest: the Python client example (client/python/example.py) against the real server binary on
# 127.0.0.1. Starts attnserve_server on a free port, runs the example with unary Decode and with
# DecodeStream, checks each run's exit status and the output shapes it prints; then installs the
# package (`pip install --no-build-isolation --no-deps --target`, from a copy of client/python and
# proto/) and, importing only the installed copy (grpcio-tools blocked: nothing is generated at
# import), configures a layer from a checkpoint without a spec (the spec the server resolved comes
# back, and equals the one stated), continues a request prefilled at positions 5000+ with decode,
# DecodeStream and open_decode_stream at explicit positions (as a prefill of the same rows at the
# same positions answers), and reads get_session / info as dataclasses. Finally stops the server
# with SIGTERM and checks that it exits 0.
#
# Usage: tests/client/python_client_test.sh SERVER_BINARY PYTHON
set -euo pipefail

readonly SERVER="${1:?usage: $0 SERVER_BINARY PYTHON}"
readonly PYTHON="${2:?usage: $0 SERVER_BINARY PYTHON}"
readonly ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly EXAMPLE="${ROOT}/client/python/example.py"

readonly TEST_NAME=python_client_test
# shellcheck source=../support/server_test.sh
source "${ROOT}/tests/support/server_test.sh"
require_executables "${SERVER}"
require_python_modules "${PYTHON}" grpc grpc_tools numpy wheel

mkdir -p "${workdir}/checkpoints"
server_start "${SERVER}" "${workdir}" --checkpoint_root="${workdir}/checkpoints" ||
  fail "the server did not start"
readonly ADDRESS="${SERVER_ADDRESS}"

# Generate the client's protobuf modules up front (the package would do it on first import too).
"${PYTHON}" "${ROOT}/client/python/gen_proto.py"

for mode in unary stream; do
  flags=(--server="${ADDRESS}" --timeout_s=60)
  [[ "${mode}" == stream ]] && flags+=(--stream)
  status=0
  "${PYTHON}" "${EXAMPLE}" "${flags[@]}" >"${workdir}/${mode}.out" 2>&1 || status=$?
  cat "${workdir}/${mode}.out"
  [[ "${status}" -eq 0 ]] || fail "example.py (${mode}) exited with status ${status}"
  # The example's prompts are 48 and 17 tokens at d_model 512, then 8 decode steps.
  if [[ "${mode}" == unary ]]; then
    grep -qF "repeat of step 8 under its call_id: same outputs, nothing appended" \
      "${workdir}/${mode}.out" || fail "example.py (unary) did not show the call_id retry"
  fi
  for expected in "forward alice: output shape (48, 512) float32, sequence_length 48" \
                  "forward bob: output shape (17, 512) float32, sequence_length 17" \
                  "decode step 8: alice (1, 512) len=56, bob (1, 512) len=25" \
                  "example: OK"; do
    grep -qF "${expected}" "${workdir}/${mode}.out" || fail "example.py (${mode}) did not print '${expected}'"
  done
done

# ---- The installed package ---------------------------------------------------------------------
mkdir -p "${workdir}/src/client"
cp -r "${ROOT}/proto" "${workdir}/src/"
cp -r "${ROOT}/client/python" "${workdir}/src/client/"
rm -rf "${workdir}/src/client/python/attnserve_client/_generated" "${workdir}/src/client/python/build"
"${PYTHON}" -m pip install --quiet --no-build-isolation --no-deps --no-index \
  --target "${workdir}/site" "${workdir}/src/client/python" >"${workdir}/pip.out" 2>&1 ||
  fail "pip install of client/python failed: $(cat "${workdir}/pip.out")"
for file in py.typed _generated/attnserve/v1/attention_service_pb2.py \
            _generated/attnserve/v1/attention_service_pb2.pyi proto/attnserve/v1/attention_service.proto; do
  [[ -f "${workdir}/site/attnserve_client/${file}" ]] || fail "the installed package lacks ${file}"
done
(cd "${workdir}" && PYTHONPATH="${workdir}/site" "${PYTHON}" - "${ADDRESS}" "${workdir}") \
  <<'PY' || fail "the installed package"
import dataclasses, json, struct, sys
sys.modules["grpc_tools"] = None  # The installed package must not need to generate anything.
import numpy as np
import attnserve_client
from attnserve_client import AttnServeClient, AttnServeError, LayerSpec, RopeScaling
address, work = sys.argv[1:]
assert attnserve_client.__file__.startswith(f"{work}/site/"), attnserve_client.__file__

# A checkpoint whose safetensors __metadata__ holds its spec (as attnctl convert writes it).
spec = LayerSpec("gqa", d_model=64, num_heads=4, num_kv_heads=2, rope_theta=500000.0,
                 rope_scaling=RopeScaling("llama3", factor=8.0,
                                          original_max_position_embeddings=256))
rng = np.random.default_rng(5)
shapes = {"q_proj.weight": (64, 64), "k_proj.weight": (32, 64), "v_proj.weight": (32, 64),
          "o_proj.weight": (64, 64)}
weights = {name: (rng.standard_normal(shape) * 0.1).astype(np.float32)
           for name, shape in shapes.items()}
header, data = {"__metadata__": {"attnserve_spec": json.dumps(spec.to_dict())}}, b""
for name, array in weights.items():
    header[f"model.layers.0.self_attn.{name}"] = {
        "dtype": "F32", "shape": list(array.shape), "data_offsets": [len(data), len(data) + array.nbytes]}
    data += array.tobytes()
text = json.dumps(header).encode()
with open(f"{work}/checkpoints/layer.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)

with AttnServeClient(address) as client:
    loaded = client.configure(checkpoint="layer.safetensors", layer=0)
    assert loaded.spec == LayerSpec.from_proto(spec.to_proto()), loaded.spec
    assert loaded.spec.rope == "half" and loaded.spec.rope_scaling.type == "llama3", loaded.spec
    stated = client.configure(spec, weights=weights)
    assert stated.fingerprint == loaded.fingerprint, "checkpoint and inline weights differ"
    sid = loaded.session_id

    # Prefill at positions 5000+, then decode at explicit positions; a second request prefilled
    # with every row at the same positions is the reference.
    T = 6
    x = rng.standard_normal((T + 4, 64), dtype=np.float32)
    at = [5000 + i for i in range(T)] + [5006, 5009, 5010, 5020]
    client.forward(sid, {"p": x[:T]}, positions={"p": at[:T]})
    try:
        client.decode(sid, {"p": x[T]})
        raise SystemExit("a decode step at the default position (6) after position 5005 was taken")
    except AttnServeError as error:
        assert error.code == "INVALID_ARGUMENT" and "position" in error.message, error
    got = [client.decode(sid, {"p": x[T]}, positions={"p": at[T]}).outputs["p"][0]]
    got += [r.outputs["p"][0] for r in client.decode_stream(
        sid, [({"p": x[T + 1]}, {"p": at[T + 1]})])]
    with client.open_decode_stream(sid) as stream:
        got.append(stream.step({"p": x[T + 2]}, positions={"p": at[T + 2]}).outputs["p"][0])
        last = stream.step({"p": x[T + 3]}, positions={"p": at[T + 3]})
        got.append(last.outputs["p"][0])
    assert last.sequence_lengths["p"] == T + 4, last.sequence_lengths
    reference = client.forward(sid, {"r": x}, positions={"r": at}).outputs["r"][T:]
    np.testing.assert_allclose(np.stack(got), reference, rtol=1e-4, atol=1e-5)
    # Without the positions the steps land elsewhere: the comparison above is not vacuous.
    client.forward(sid, {"q": x[:T]}, positions={"q": at[:T]})
    moved = client.decode(sid, {"q": x[T]}, positions={"q": 5100}).outputs["q"][0]
    assert not np.allclose(moved, reference[0], rtol=1e-4, atol=1e-5)

    session = client.get_session(sid)
    assert dataclasses.is_dataclass(session) and session.spec == loaded.spec, session
    assert {r.request_id: r.sequence_length for r in session.requests} == {
        "p": T + 4, "r": T + 4, "q": T + 1}, session.requests
    assert session.kv_cache_dtype == "f32" and session.fingerprint == loaded.fingerprint
    info = client.info()
    assert dataclasses.is_dataclass(info) and info.backend == "cpu" and info.sessions == 2, info
    assert info.limits.max_sessions > 0, info.limits
    caps = info.capabilities
    assert dataclasses.is_dataclass(caps) and caps.variants == ["mha", "mqa", "gqa", "mla"], caps
    assert caps.kv_formats == ["f32", "bf16", "fp8_e4m3", "int8"] and caps.fork, caps
    assert "qk_norm=rms_across_heads" in caps.variations and caps.qk_norm and caps.alibi, caps
    assert [s.session_id for s in client.list_sessions()].count(sid) == 1
    for result in (loaded, stated):
        client.release(result.session_id)
print("installed package: configure from a checkpoint without a spec, decode at explicit "
      "positions after a prefill at 5000+, dataclass results")
PY

status=0
server_stop || status=$?
[[ "${status}" -eq 0 ]] || fail "the server exited with status ${status} after SIGTERM"
echo "python_client_test: PASS"
